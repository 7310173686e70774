//! The test registry (`testenv/registry/`): what a real OCI client pulling plugins gets from it
//! (oci-client, the crate the host pulls with), and what the registry's own request log records.
//! Needs the plugins built (`scripts/build-plugins`) for `pod_counter.wasm`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::Value;
use sha2::{Digest, Sha256};
use testenv::registry::{
    Broken, CNCF_CONFIG_MEDIA_TYPE, CNCF_LAYER_MEDIA_TYPE, Layout, OCI_MANIFEST_MEDIA_TYPE,
    WASM_TO_OCI_CONFIG_MEDIA_TYPE, WASM_TO_OCI_LAYER_MEDIA_TYPE,
};
use testenv::{Registry, RegistryOptions};

/// `pod_counter.wasm` as `scripts/build-plugins` leaves it.
fn pod_counter_wasm() -> Result<PathBuf> {
    let dir = match std::env::var_os("WCM_PLUGIN_ARTIFACTS") {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| testenv::repo_root().join("target"))
            .join("wasm32-wasip2/plugin"),
    };
    let path = dir.join("pod_counter.wasm");
    anyhow::ensure!(
        path.is_file(),
        "{} is missing: run scripts/build-plugins first",
        path.display()
    );
    Ok(path)
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// An oci-client that trusts only the registry's CA (when it has TLS).
fn client(registry: &Registry) -> Client {
    // oci-client is built without a crypto provider, as the host builds it: use ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = ClientConfig::default();
    match registry.ca_pem() {
        Some(pem) => {
            config.protocol = ClientProtocol::Https;
            config.tls_certs_only = vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.as_bytes().to_vec(),
            }];
        }
        None => config.protocol = ClientProtocol::Http,
    }
    Client::new(config)
}

fn basic(registry: &Registry) -> Result<RegistryAuth> {
    let c = registry.credentials().context("the registry has auth")?;
    Ok(RegistryAuth::Basic(c.username, c.password))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_component_is_pulled_back_by_digest_over_tls_and_an_anonymous_pull_is_refused()
-> Result<()> {
    let wasm_path = pod_counter_wasm()?;
    let wasm = std::fs::read(&wasm_path)?;
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    assert!(registry.url().starts_with("https://127.0.0.1:"));
    let auth = basic(&registry)?;
    let user = registry.credentials().context("credentials")?.username;

    let layouts = [
        (
            Layout::Cncf,
            "plugins/pod-counter",
            CNCF_CONFIG_MEDIA_TYPE,
            CNCF_LAYER_MEDIA_TYPE,
        ),
        (
            Layout::WasmToOci,
            "plugins/pod-counter-old",
            WASM_TO_OCI_CONFIG_MEDIA_TYPE,
            WASM_TO_OCI_LAYER_MEDIA_TYPE,
        ),
    ];
    let mut references = Vec::new();
    for (layout, repo, config_type, layer_type) in layouts {
        let digest = registry.push(&wasm_path, repo, "v1", layout).await?;
        let reference: Reference = registry.reference(repo, &digest).parse()?;
        let oci = client(&registry);
        let (raw, pulled) = oci
            .pull_manifest_raw(&reference, &auth, &[OCI_MANIFEST_MEDIA_TYPE])
            .await
            .with_context(|| format!("pull {reference}"))?;
        assert_eq!(pulled, digest, "{layout:?}: the digest the registry names");
        assert_eq!(
            sha256(&raw),
            digest,
            "{layout:?}: the manifest's own digest"
        );
        let json: Value = serde_json::from_slice(&raw)?;
        assert_eq!(json["mediaType"], OCI_MANIFEST_MEDIA_TYPE, "{json}");
        assert_eq!(json["config"]["mediaType"], config_type, "{json}");
        let manifest: OciImageManifest = serde_json::from_slice(&raw)?;
        assert_eq!(manifest.layers.len(), 1, "{json}");
        assert_eq!(manifest.layers[0].media_type, layer_type, "{json}");

        let mut layer = Vec::new();
        oci.pull_blob(&reference, &manifest.layers[0], &mut layer)
            .await?;
        assert!(layer == wasm, "{layout:?}: the layer is the component");
        let mut config = Vec::new();
        oci.pull_blob(&reference, &manifest.config, &mut config)
            .await?;
        let config: Value = serde_json::from_slice(&config)?;
        if layout == Layout::Cncf {
            assert_eq!(config["architecture"], "wasm", "{config}");
            assert_eq!(config["os"], "wasip2", "{config}");
            assert_eq!(
                config["layerDigests"],
                serde_json::json!([manifest.layers[0].digest]),
                "{config}"
            );
            let exports = config["component"]["exports"].to_string();
            assert!(exports.contains("wcm:reconciler/reconciler@"), "{config}");
        }
        references.push(reference);
    }

    // Without credentials: refused, and the registry saw no credentials.
    let mark = registry.request_mark()?;
    let anonymous = client(&registry)
        .pull_manifest_raw(
            &references[0],
            &RegistryAuth::Anonymous,
            &[OCI_MANIFEST_MEDIA_TYPE],
        )
        .await;
    assert!(anonymous.is_err(), "an anonymous pull got {anonymous:?}");
    let requests = registry.requests()?;
    let manifest_path = format!(
        "/v2/plugins/pod-counter/manifests/{}",
        references[0].digest().context("by digest")?
    );
    let refused: Vec<_> = registry
        .requests_since(mark)?
        .into_iter()
        .filter(|r| r.path == manifest_path)
        .collect();
    assert!(
        !refused.is_empty() && refused.iter().all(|r| r.status == 401 && !r.auth),
        "the anonymous manifest requests: {refused:#?}"
    );
    let served_anonymously: Vec<_> = requests
        .iter()
        .filter(|r| !r.auth && (200..300).contains(&r.status))
        .collect();
    assert!(
        served_anonymously.is_empty(),
        "served without credentials: {served_anonymously:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.path == manifest_path && r.status == 200 && r.user == user),
        "the authenticated pull is in the log: {requests:#?}"
    );

    // Down: connections are refused and nothing reaches the log; back: same port, same content.
    registry.stop()?;
    let mark = registry.request_mark()?;
    let down = client(&registry)
        .pull_manifest_raw(&references[1], &auth, &[OCI_MANIFEST_MEDIA_TYPE])
        .await;
    assert!(down.is_err(), "a pull from a stopped registry got {down:?}");
    assert_eq!(
        registry.requests_since(mark)?,
        vec![],
        "a stopped registry saw requests"
    );
    registry.resume()?;
    let (_, digest) = client(&registry)
        .pull_manifest_raw(&references[1], &auth, &[OCI_MANIFEST_MEDIA_TYPE])
        .await
        .context("pull after resume")?;
    assert_eq!(Some(digest.as_str()), references[1].digest());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_artifacts_are_broken_as_asked() -> Result<()> {
    let wasm_path = pod_counter_wasm()?;
    let wasm = std::fs::read(&wasm_path)?;
    let registry = Registry::start(RegistryOptions::default()).await?;
    assert!(registry.url().starts_with("http://127.0.0.1:"));
    assert_eq!(
        registry.dockerconfigjson(),
        format!(r#"{{"auths":{{"{}":{{}}}}}}"#, registry.host())
    );
    let oci = client(&registry);
    let auth = RegistryAuth::Anonymous;
    let manifest = |pushed: &testenv::registry::Pushed| -> Result<Reference> {
        Ok(registry.reference("broken", &pushed.digest).parse()?)
    };
    let pull = |reference: Reference| {
        let oci = &oci;
        let auth = &auth;
        async move {
            let (raw, _) = oci
                .pull_manifest_raw(&reference, auth, &[OCI_MANIFEST_MEDIA_TYPE])
                .await?;
            Ok::<_, anyhow::Error>((reference, serde_json::from_slice::<OciImageManifest>(&raw)?))
        }
    };

    let two = registry
        .push_with(
            &wasm_path,
            "broken",
            "two",
            Layout::Cncf,
            &Broken {
                two_wasm_layers: true,
                ..Broken::default()
            },
        )
        .await?;
    let (_, m) = pull(manifest(&two)?).await?;
    assert_eq!(m.layers.len(), 2);
    assert!(
        m.layers
            .iter()
            .all(|l| l.media_type == CNCF_LAYER_MEDIA_TYPE)
    );
    assert_ne!(m.layers[0].digest, m.layers[1].digest);

    let tar = "application/vnd.oci.image.layer.v1.tar";
    let other = registry
        .push_with(
            &wasm_path,
            "broken",
            "tar",
            Layout::Cncf,
            &Broken {
                layer_media_type: Some(tar.into()),
                ..Broken::default()
            },
        )
        .await?;
    let (_, m) = pull(manifest(&other)?).await?;
    assert_eq!(m.layers[0].media_type, tar);

    let claimed = registry
        .push_with(
            &wasm_path,
            "broken",
            "claim",
            Layout::Cncf,
            &Broken {
                claim_layer_size: Some(1 << 40),
                ..Broken::default()
            },
        )
        .await?;
    let (_, m) = pull(manifest(&claimed)?).await?;
    assert_eq!(m.layers[0].size, 1 << 40);

    let huge_size = 48 << 20;
    let huge = registry
        .push_with(
            &wasm_path,
            "broken",
            "huge",
            Layout::Cncf,
            &Broken {
                huge_layer: Some(huge_size),
                ..Broken::default()
            },
        )
        .await?;
    let (reference, m) = pull(manifest(&huge)?).await?;
    assert_eq!(m.layers[0].size, huge_size as i64);
    let mut layer = Vec::new();
    oci.pull_blob(&reference, &m.layers[0], &mut layer).await?;
    assert_eq!(layer.len() as u64, huge_size);
    assert!(layer.starts_with(&wasm));
    let served = registry.requests()?;
    assert!(
        served.iter().any(|r| r.method == "GET"
            && r.path.ends_with(&m.layers[0].digest)
            && r.bytes == huge_size),
        "the registry served the huge layer in full"
    );

    for (tag, broken) in [
        (
            "deleted",
            Broken {
                delete_layer: true,
                ..Broken::default()
            },
        ),
        (
            "corrupt",
            Broken {
                corrupt_layer: true,
                ..Broken::default()
            },
        ),
    ] {
        let pushed = registry
            .push_with(&wasm_path, "broken", tag, Layout::Cncf, &broken)
            .await?;
        let (reference, m) = pull(manifest(&pushed)?).await?;
        assert_ne!(
            m.layers[0].digest,
            sha256(&wasm),
            "{tag}: the broken layer is a copy nothing else shares"
        );
        let mut layer = Vec::new();
        match oci.pull_blob(&reference, &m.layers[0], &mut layer).await {
            Ok(()) => bail!("{tag}: the layer was pulled ({} bytes)", layer.len()),
            Err(e) => eprintln!("{tag}: {e}"),
        }
        let blob = format!("/v2/broken/blobs/{}", m.layers[0].digest);
        let statuses: Vec<u16> = registry
            .requests()?
            .iter()
            .filter(|r| r.path == blob && r.method == "GET")
            .map(|r| r.status)
            .collect();
        let expected = if tag == "deleted" { 404 } else { 200 };
        assert_eq!(statuses, vec![expected], "{tag}: GET {blob}");
    }

    // The untouched component is still whole.
    let digest = registry
        .push(&wasm_path, "broken", "whole", Layout::Cncf)
        .await?;
    let (reference, m) = pull(registry.reference("broken", &digest).parse()?).await?;
    let mut layer = Vec::new();
    oci.pull_blob(&reference, &m.layers[0], &mut layer).await?;
    assert!(layer == wasm);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_registry_removes_its_storage_when_its_stdin_closes_or_on_sigterm() -> Result<()> {
    let wasm_path = pod_counter_wasm()?;
    // Dropping the handle closes the registry's stdin.
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    registry
        .push(&wasm_path, "plugins/pod-counter", "v1", Layout::Cncf)
        .await?;
    let dir = PathBuf::from(&registry.info().dir);
    assert!(
        dir.join("storage/docker/registry/v2/repositories/plugins")
            .is_dir()
    );
    drop(registry);
    assert!(!dir.exists(), "{} is left after EOF", dir.display());

    let registry = Registry::start(RegistryOptions::default()).await?;
    let dir = PathBuf::from(&registry.info().dir);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &registry.info().pid.to_string()])
        .status()?;
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dir.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!dir.exists(), "{} is left after SIGTERM", dir.display());
    Ok(())
}

/// What `cosign sign --key KEY --tlog-upload=false` (the real cosign v2, `testenv/cosign/`) leaves
/// in the registry: a manifest tagged `sha256-HEX.sig` next to the signed artifact whose layer is
/// a simple-signing payload naming the artifact's digest, its signature in an annotation. The
/// registry's log shows the tag was written by the test user and that cosign asked for nothing
/// outside the artifact's repository. With `WCM_COSIGN_FIXTURE_DIR` set, the public key, the
/// signature manifest, the payload and the signed digest are written there (the host's
/// verification tests use such files, `host/tests/fixtures/cosign/`).
#[tokio::test(flavor = "multi_thread")]
async fn cosign_sign_writes_the_signature_tag_with_a_simple_signing_payload_to_the_registry()
-> Result<()> {
    let wasm_path = pod_counter_wasm()?;
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    let user = registry.credentials().context("credentials")?.username;
    let repo = "plugins/pod-counter";
    let digest = registry.push(&wasm_path, repo, "v1", Layout::Cncf).await?;
    let hex = digest.strip_prefix("sha256:").context("sha256 digest")?;
    let keys = tempfile_dir("cosign-keys")?;
    let (key, public_pem) = testenv::registry::cosign_key_pair(&keys)?;
    assert!(
        public_pem.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{public_pem}"
    );
    assert!(key.is_file());

    let mark = registry.request_mark()?;
    registry.cosign_sign(&registry.reference(repo, &digest), &key)?;
    let requests = registry.requests_since(mark)?;
    let tag = format!("sha256-{hex}.sig");
    let sig_path = format!("/v2/{repo}/manifests/{tag}");
    assert!(
        requests
            .iter()
            .any(|r| r.method == "PUT" && r.path == sig_path && r.status == 201 && r.user == user),
        "no PUT of {sig_path} by {user}: {requests:#?}"
    );
    let elsewhere: Vec<_> = requests
        .iter()
        .filter(|r| r.path != "/v2/" && !r.path.starts_with(&format!("/v2/{repo}/")))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "cosign asked outside {repo}: {elsewhere:#?}"
    );

    // The signature manifest, as any client reads it back.
    let auth = basic(&registry)?;
    let sig_ref: Reference = format!("{}/{repo}:{tag}", registry.host()).parse()?;
    let oci = client(&registry);
    let (manifest, manifest_digest) = oci
        .pull_manifest_raw(&sig_ref, &auth, &[OCI_MANIFEST_MEDIA_TYPE])
        .await
        .context("pull the signature manifest")?;
    assert_eq!(sha256(&manifest), manifest_digest);
    let m: Value = serde_json::from_slice(&manifest)?;
    let layers = m["layers"].as_array().context("layers")?;
    assert_eq!(layers.len(), 1, "{m:#}");
    let layer = &layers[0];
    assert_eq!(
        layer["mediaType"], "application/vnd.dev.cosign.simplesigning.v1+json",
        "{m:#}"
    );
    let signature = layer["annotations"]["dev.cosignproject.cosign/signature"]
        .as_str()
        .context("the signature annotation")?;
    assert!(!signature.is_empty());
    let payload_digest = layer["digest"].as_str().context("payload digest")?;
    let descriptor: oci_client::manifest::OciDescriptor = serde_json::from_value(layer.clone())?;
    let mut payload = Vec::new();
    oci.pull_blob(&sig_ref, &descriptor, &mut payload)
        .await
        .context("pull the payload")?;
    assert_eq!(sha256(&payload), payload_digest);
    let p: Value = serde_json::from_slice(&payload)?;
    assert_eq!(
        p["critical"]["image"]["docker-manifest-digest"],
        digest.as_str()
    );
    assert_eq!(p["critical"]["type"], "cosign container image signature");

    if let Some(dir) = std::env::var_os("WCM_COSIGN_FIXTURE_DIR") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("cosign.pub"), &public_pem)?;
        std::fs::write(dir.join("signature-manifest.json"), &manifest)?;
        std::fs::write(dir.join("payload.json"), &payload)?;
        std::fs::write(dir.join("signed-digest"), format!("{digest}\n"))?;
    }
    let _ = std::fs::remove_dir_all(&keys);
    Ok(())
}

/// A fresh directory under the system temp dir.
fn tempfile_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("wcm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
