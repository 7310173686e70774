//! `wasm-controller-manager push FILE REGISTRY/REPOSITORY:TAG`: a built plugin into an OCI registry
//! in the CNCF wasm artifact layout (config `application/vnd.wasm.config.v0+json` with
//! `architecture`, `os`, `layerDigests` and the component's top-level imports and exports; one
//! `application/wasm` layer; an OCI image manifest), printing the reference pinned by digest that a
//! Plugin object names. The registry client is the host's own (`registry.rs`).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::fetch::{CONFIG_TYPES, Credentials, LAYER_TYPES};
use super::registry::RegistryClient;
use super::spec::{OciRef, check_authority, normal_authority};

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// Where to push, and as whom.
pub struct PushRequest<'a> {
    pub file: &'a Path,
    /// `REGISTRY/REPOSITORY:TAG`.
    pub target: &'a str,
    pub credentials: Option<Credentials>,
    pub ca_pem: Option<Vec<u8>>,
    pub plain_http: bool,
    pub max_bytes: usize,
}

/// What was pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// `REGISTRY/REPOSITORY:TAG@sha256:MANIFEST`.
    pub reference: String,
    pub manifest_digest: String,
    pub layer_digest: String,
}

/// `REGISTRY/REPOSITORY:TAG` → its parts, checked as a Plugin's source is.
fn parse_target(target: &str) -> Result<(String, String, String)> {
    let (name, tag) = target.rsplit_once(':').filter(|(n, t)| n.contains('/') && !t.contains('/')).context(
        "the target is not REGISTRY/REPOSITORY:TAG (a tag is needed; the digest is printed after the push)",
    )?;
    let (registry, repository) = name.split_once('/').context("no registry in the target")?;
    check_authority(registry).map_err(|e| anyhow::anyhow!("{e}"))?;
    // The same checks as a Plugin's source, with a placeholder digest.
    let r = OciRef::parse(&format!("{name}:{tag}@sha256:{}", "0".repeat(64)))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((
        normal_authority(registry),
        repository.to_string(),
        r.tag.unwrap_or_default(),
    ))
}

/// The top-level import and export names of a component (not of the modules and components
/// nested in it); an error for anything that is not a component.
pub fn component_names(bytes: &[u8]) -> Result<(Vec<String>, Vec<String>)> {
    use wasmparser::{Encoding, Parser, Payload};
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut depth = 0usize;
    if !bytes.starts_with(b"\0asm") {
        bail!("not a WebAssembly binary (no \\0asm header)");
    }
    for payload in Parser::new(0).parse_all(bytes) {
        // One line: some of wasmparser's messages span several.
        let payload = payload.map_err(|e| {
            anyhow::anyhow!(
                "not a valid WebAssembly binary: {} (at byte {})",
                e.message().split_whitespace().collect::<Vec<_>>().join(" "),
                e.offset()
            )
        })?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    bail!(
                        "a core WebAssembly module, not a component: build it for wasm32-wasip2 (cargo build --target wasm32-wasip2)"
                    );
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(s) if depth == 1 => {
                for i in s {
                    imports.push(i.context("the import section")?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(s) if depth == 1 => {
                for e in s {
                    exports.push(e.context("the export section")?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok((imports, exports))
}

/// Reads, checks and pushes the component; nothing reaches the registry unless the file is a
/// component within the size cap.
pub async fn push(req: PushRequest<'_>) -> Result<Pushed> {
    let (registry, repository, tag) = parse_target(req.target)?;
    let meta = std::fs::metadata(req.file).with_context(|| format!("{}", req.file.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", req.file.display());
    }
    if meta.len() > req.max_bytes as u64 {
        bail!(
            "{} is {} bytes, more than --max-plugin-bytes ({})",
            req.file.display(),
            meta.len(),
            req.max_bytes
        );
    }
    // Read through the cap, so a file that grows meanwhile is not held past it.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    {
        use std::io::Read as _;
        std::fs::File::open(req.file)
            .and_then(|f| f.take(req.max_bytes as u64 + 1).read_to_end(&mut bytes))
            .with_context(|| format!("{}", req.file.display()))?;
    }
    if bytes.len() > req.max_bytes {
        bail!(
            "{} grew past --max-plugin-bytes while read",
            req.file.display()
        );
    }
    let (imports, exports) =
        component_names(&bytes).with_context(|| format!("{}", req.file.display()))?;
    let layer_digest = crate::sandbox::sha256_hex(&bytes);
    let layer_size = bytes.len();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [format!("sha256:{layer_digest}")],
        "component": {"imports": imports, "exports": exports, "target": null},
    }))?;
    let plain: BTreeSet<String> = if req.plain_http {
        [registry.clone()].into()
    } else {
        BTreeSet::new()
    };
    let client = RegistryClient::new([registry.clone()].into(), plain, req.ca_pem.as_deref())?;
    let mut session = client.session(&registry, &repository, req.credentials, true);
    let what = |e: super::fetch::FetchError| anyhow::anyhow!("{} ({})", e.message, e.reason);
    let config_digest = session
        .push_blob(bytes::Bytes::from(config.clone()))
        .await
        .map_err(what)?;
    let pushed_layer = session
        .push_blob(bytes::Bytes::from(bytes)) // moved, not copied: held once
        .await
        .map_err(what)?;
    anyhow::ensure!(pushed_layer == layer_digest, "the layer's digest changed");
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPES[0], "digest": format!("sha256:{config_digest}"), "size": config.len()},
        "layers": [{"mediaType": LAYER_TYPES[0], "digest": format!("sha256:{layer_digest}"), "size": layer_size}],
    }))?;
    let manifest_digest = session
        .push_manifest(&tag, MANIFEST_TYPE, bytes::Bytes::from(manifest))
        .await
        .map_err(what)?;
    Ok(Pushed {
        reference: format!("{registry}/{repository}:{tag}@sha256:{manifest_digest}"),
        manifest_digest,
        layer_digest,
    })
}

/// A Plugin object naming `reference`, ready for `kubectl apply -f -`.
pub fn plugin_yaml(name: &str, reference: &str, pull_secret: Option<&str>) -> String {
    let mut out = format!(
        "apiVersion: {}/{}\nkind: {}\nmetadata:\n  name: {name}\nspec:\n  source:\n    oci: {reference}\n",
        super::spec::GROUP,
        super::spec::VERSION,
        super::spec::KIND
    );
    if let Some(s) = pull_secret {
        out.push_str(&format!("  pullSecret: {s}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_as_sources_are() {
        assert_eq!(
            parse_target("reg.example:5000/team/pc:1.0").unwrap(),
            ("reg.example:5000".into(), "team/pc".into(), "1.0".into())
        );
        assert_eq!(
            parse_target("reg.example:443/a:b").unwrap().0,
            "reg.example"
        );
        for bad in [
            "reg.example/team/pc",
            "reg.example:5000/team/pc",
            "pc:1.0",
            "reg.example/Team:1",
            "reg.example/a:-x",
            "user@reg.example/a:1",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_components_are_pushed() {
        let e = component_names(b"\0asm\x01\0\0\0").unwrap_err();
        assert!(e.to_string().contains("core WebAssembly module"), "{e}");
        assert!(component_names(b"junk").is_err());
        // Errors are one line, whatever wasmparser says.
        for bad in [
            &b"\0asm\x0d\0\x01\0\xff\xff"[..],
            b"\0asm\x02\0\0\0",
            b"\0asm",
        ] {
            let e = component_names(bad).unwrap_err().to_string();
            assert!(!e.contains('\n'), "{e}");
        }
        // The smallest component: no imports, no exports.
        let (i, e) = component_names(b"\0asm\x0d\0\x01\0").unwrap();
        assert!(i.is_empty() && e.is_empty());
    }

    #[test]
    fn the_plugin_yaml_names_the_pinned_reference() {
        let y = plugin_yaml("pc", "reg.example/pc:1@sha256:abc", Some("regcred"));
        assert!(y.contains("kind: Plugin\n"));
        assert!(y.contains("    oci: reg.example/pc:1@sha256:abc\n"));
        assert!(y.contains("  pullSecret: regcred\n"));
    }
}
