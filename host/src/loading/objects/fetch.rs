//! Fetching a Plugin's component: from an OCI registry by manifest digest (the CNCF wasm artifact
//! layout, `application/wasm`, and the older wasm-to-oci media types), or from an https URL with
//! its SHA-256. The registry is hostile until proven otherwise: the manifest must hash to the pinned
//! digest, hold exactly one wasm layer of an accepted media type whose declared size is within
//! `--max-plugin-bytes` before anything is downloaded, and the layer's bytes must hash to its
//! digest while they are read, counted against the same cap.
//!
//! Fetched components are kept on disk by digest (`DIR/oci/MANIFEST.json` + `DIR/blobs/LAYER.wasm`,
//! `DIR/https/SHA.wasm`), each checked again against its digest when read back, so a restart while
//! the registry is down runs what the cache holds and a tampered cache file is never loaded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::BTreeSet;

use super::registry::{MAX_MANIFEST, RegistryClient};
use super::spec::{OciRef, Origin};
use super::verify::{self, TrustedKeys};

/// Config media types of a wasm artifact: the CNCF layout, then wasm-to-oci's.
pub const CONFIG_TYPES: [&str; 2] = [
    "application/vnd.wasm.config.v0+json",
    "application/vnd.wasm.config.v1+json",
];
/// Layer media types of the component.
pub const LAYER_TYPES: [&str; 2] = [
    "application/wasm",
    "application/vnd.wasm.content.layer.v1+wasm",
];
/// Manifest media types accepted (an image index is refused: a plugin has one platform).
const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Why a fetch failed, as a condition reason and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    /// `Unreachable`, `Unauthorized`, `NotFound`, `DigestMismatch`, `TooLarge`, `NotAWasmArtifact`,
    /// `CacheUnusable`.
    pub reason: &'static str,
    pub message: String,
}

impl FetchError {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> FetchError {
        let message: String = message.into();
        FetchError {
            reason,
            // Registry texts: one line, bounded.
            message: crate::contract::validate::log_text(&message, 512),
        }
    }

    /// Whether trying again later may succeed (a registry down, credentials not there yet); the
    /// others are facts of the artifact that a retry does not change.
    pub fn retryable(&self) -> bool {
        matches!(
            self.reason,
            "Unreachable" | "Unauthorized" | "NotFound" | "SignatureMissing"
        )
    }
}

/// A fetched component.
#[derive(Clone)]
pub struct Fetched {
    pub bytes: Arc<[u8]>,
    /// SHA-256 of the component's bytes, hex.
    pub sha256: String,
    /// The manifest, for an OCI source (kept in the cache beside the layer).
    pub manifest: Option<Vec<u8>>,
    /// Who pulled it (see `Fetcher::fetch`).
    pub access: String,
    /// The verified cosign signatures, one (payload, signature, index of the key) per set of
    /// keys asked for (the operator's, the Plugin's).
    pub signatures: Vec<(Vec<u8>, String, usize)>,
    /// Served from the disk cache, without the network.
    pub cached: bool,
}

/// Registry credentials for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <redacted>)", self.username)
    }
}

/// The credentials a `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson` holds for
/// `registry` (keys `registry`, `https://registry`, `https://registry/v2/`...).
pub fn credentials_for(dockerconfig: &[u8], registry: &str) -> Result<Option<Credentials>, String> {
    use base64::Engine as _;
    let v: serde_json::Value = serde_json::from_slice(dockerconfig)
        .map_err(|_| "the pull Secret's .dockerconfigjson is not JSON".to_string())?;
    let auths = v["auths"]
        .as_object()
        .ok_or("the pull Secret's .dockerconfigjson has no auths")?;
    for (key, entry) in auths {
        let host = key
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        if host != registry {
            continue;
        }
        if let (Some(u), Some(p)) = (entry["username"].as_str(), entry["password"].as_str()) {
            return Ok(Some(Credentials {
                username: u.to_string(),
                password: p.to_string(),
            }));
        }
        if let Some(auth) = entry["auth"].as_str() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .map_err(|_| "the pull Secret's auth is not base64".to_string())?;
            let text = String::from_utf8(decoded)
                .map_err(|_| "the pull Secret's auth is not text".to_string())?;
            let (u, p) = text
                .split_once(':')
                .ok_or("the pull Secret's auth is not user:password")?;
            return Ok(Some(Credentials {
                username: u.to_string(),
                password: p.to_string(),
            }));
        }
        return Err(format!(
            "the pull Secret's entry for {registry} has neither username/password nor auth"
        ));
    }
    Ok(None)
}

/// How components are fetched.
pub struct Fetcher {
    /// One HTTP client for every registry and host; credentials and tokens live in a session of
    /// one fetch, so none a Plugin's pull Secret gave is ever used for another's, and a rotated
    /// Secret is used at once.
    registry: RegistryClient,
    cache: Option<PathBuf>,
    max_bytes: usize,
}

impl Fetcher {
    /// `allowed`: the registries and hosts of `--plugin-registry`. `extra_ca_pem`: CA
    /// certificates (PEM) trusted besides the system's, for registries with a private CA.
    /// `plain_http`: registries reached over plain HTTP (tests and local mirrors only).
    pub fn new(
        cache: Option<PathBuf>,
        max_bytes: usize,
        extra_ca_pem: Option<&[u8]>,
        allowed: &BTreeSet<String>,
        plain_http: &[String],
    ) -> anyhow::Result<Fetcher> {
        if let Some(dir) = &cache {
            for sub in ["oci", "blobs", "https"] {
                super::store::private_dir(&dir.join(sub))?;
            }
        }
        Ok(Fetcher {
            registry: RegistryClient::new(
                allowed.clone(),
                plain_http.iter().cloned().collect(),
                extra_ca_pem,
            )?,
            cache,
            max_bytes,
        })
    }

    /// The component `origin` names, from the disk cache when this object may have it without
    /// asking the registry, else fetched. Nothing is written here: the caller keeps what it
    /// accepts (`keep`), so a fetch refused for want of room leaves no file behind.
    ///
    /// A cached component carries a record of who pulled it: hashes of the registry, the
    /// repository and the credentials used (the URL, for https). The cache serves it without the
    /// network only to a combination in that record (a restart while the registry is down); any
    /// other Plugin naming the same digest downloads it from its own source, which must let it
    /// in and serve the bytes, as Kubernetes' "ensure secret pulled images" does for node images.
    pub async fn fetch(
        &self,
        origin: &Origin,
        credentials: Option<&Credentials>,
        keys: &[&TrustedKeys],
    ) -> Result<Fetched, FetchError> {
        let access = access_key(origin, credentials);
        if self.pulled_with(origin, &access)
            && let Some(mut hit) = self.cached(origin)
            && let Some(signature) = self.cached_signature(origin, keys)
        {
            hit.access = access;
            hit.signatures = signature;
            return Ok(hit);
        }
        let mut fetched = match origin {
            Origin::Oci(r) => self.fetch_oci(r, credentials, keys).await?,
            Origin::Https { url, sha256, .. } => self.fetch_https(url, sha256).await?,
        };
        fetched.access = access;
        Ok(fetched)
    }

    /// The record of who pulled `origin`'s content.
    fn access_file(&self, origin: &Origin) -> Option<PathBuf> {
        let dir = self.cache.as_ref()?;
        Some(match origin {
            Origin::Oci(r) => dir.join("oci").join(format!("{}.access", r.digest)),
            Origin::Https { sha256, .. } => dir.join("https").join(format!("{sha256}.access")),
        })
    }

    /// Whether a pull of `origin` with these credentials succeeded before.
    fn pulled_with(&self, origin: &Origin, access: &str) -> bool {
        let Some(path) = self.access_file(origin) else {
            return false;
        };
        super::store::read_private(&path, 64 << 10)
            .map(|b| String::from_utf8_lossy(&b).lines().any(|l| l == access))
            .unwrap_or(false)
    }

    /// For a cache hit: no keys, nothing to check (`Some` of nothing); with keys, for each set
    /// a signature kept with the component that verifies with it now (`None`: not verified
    /// offline, so the cache is not used).
    fn cached_signature(
        &self,
        origin: &Origin,
        keys: &[&TrustedKeys],
    ) -> Option<Vec<(Vec<u8>, String, usize)>> {
        if keys.is_empty() {
            return Some(Vec::new());
        }
        let Origin::Oci(r) = origin else {
            return None;
        };
        let kept = self.kept_signatures(r);
        keys.iter()
            .map(|k| {
                kept.iter().find_map(|(payload, signature)| {
                    let by = verify::verify_payload(k, payload, signature, &r.digest).ok()?;
                    Some((payload.clone(), signature.clone(), by))
                })
            })
            .collect()
    }

    /// The signatures kept with manifest `r` (at most 16).
    fn kept_signatures(&self, r: &OciRef) -> Vec<(Vec<u8>, String)> {
        use base64::Engine as _;
        let Some(dir) = &self.cache else {
            return Vec::new();
        };
        let Ok(raw) =
            super::store::read_private(&dir.join("oci").join(format!("{}.sig", r.digest)), 2 << 20)
        else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap_or_default();
        v.as_array()
            .into_iter()
            .flatten()
            .take(verify::MAX_SIGNATURES)
            .filter_map(|e| {
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(e["payload"].as_str()?)
                    .ok()?;
                Some((payload, e["signature"].as_str()?.to_string()))
            })
            .collect()
    }

    /// Keeps an accepted component in the cache (a cache that cannot be written costs a pull at
    /// the next start, nothing else), with who pulled it.
    pub fn keep(&self, origin: &Origin, fetched: &Fetched) {
        let Some(dir) = &self.cache else {
            return;
        };
        if !fetched.cached {
            match origin {
                Origin::Oci(r) => {
                    let _ = super::store::write_private(
                        &dir.join("blobs").join(format!("{}.wasm", fetched.sha256)),
                        &fetched.bytes,
                    );
                    if let Some(m) = &fetched.manifest {
                        let _ = super::store::write_private(
                            &dir.join("oci").join(format!("{}.json", r.digest)),
                            m,
                        );
                    }
                    if !fetched.signatures.is_empty() {
                        // Added to what other Plugins (other keys) had kept for this manifest.
                        use base64::Engine as _;
                        let mut kept = self.kept_signatures(r);
                        for (payload, signature, _) in &fetched.signatures {
                            if !kept.iter().any(|(_, s)| s == signature) {
                                kept.push((payload.clone(), signature.clone()));
                            }
                        }
                        let keep = kept.len().saturating_sub(verify::MAX_SIGNATURES);
                        let list: Vec<serde_json::Value> = kept[keep..]
                            .iter()
                            .map(|(p, s)| {
                                serde_json::json!({
                                    "payload": base64::engine::general_purpose::STANDARD.encode(p),
                                    "signature": s,
                                })
                            })
                            .collect();
                        let _ = super::store::write_private(
                            &dir.join("oci").join(format!("{}.sig", r.digest)),
                            serde_json::Value::Array(list).to_string().as_bytes(),
                        );
                    }
                }
                Origin::Https { sha256, .. } => {
                    let _ = super::store::write_private(
                        &dir.join("https").join(format!("{sha256}.wasm")),
                        &fetched.bytes,
                    );
                }
            }
        }
        let Some(path) = self.access_file(origin) else {
            return;
        };
        let mut lines: Vec<String> = super::store::read_private(&path, 64 << 10)
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .lines()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if lines.contains(&fetched.access) {
            return;
        }
        // Bounded: the most recent 256 combinations that pulled it.
        lines.push(fetched.access.clone());
        let keep = lines.len().saturating_sub(256);
        let text = lines[keep..].join("\n") + "\n";
        let _ = super::store::write_private(&path, text.as_bytes());
    }

    /// Removes from the cache everything no Plugin names now: manifests (and their records) not
    /// in `manifests`, layers not named by a kept manifest nor in `layers`, https components not
    /// in `https`. The cache holds what the objects name, not every digest ever pulled.
    pub fn retain(
        &self,
        manifests: &std::collections::BTreeSet<String>,
        layers: &std::collections::BTreeSet<String>,
        https: &std::collections::BTreeSet<String>,
    ) {
        let Some(dir) = &self.cache else {
            return;
        };
        let stems = |sub: &str| -> Vec<(String, PathBuf)> {
            std::fs::read_dir(dir.join(sub))
                .into_iter()
                .flatten()
                .filter_map(|e| {
                    let path = e.ok()?.path();
                    let name = path.file_name()?.to_str()?;
                    // A file being written (`.tmp-…`) is its writer's.
                    if name.starts_with('.') {
                        return None;
                    }
                    let stem = name.split('.').next()?.to_string();
                    Some((stem, path))
                })
                .collect()
        };
        let mut kept_layers = layers.clone();
        for (stem, path) in stems("oci") {
            if manifests.contains(&stem) {
                if path.extension().is_some_and(|e| e == "json")
                    && let Ok(raw) = super::store::read_private(&path, MAX_MANIFEST)
                    && let Ok((layer, _)) = wasm_layer(&raw, self.max_bytes)
                {
                    kept_layers.insert(layer);
                }
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
        for (stem, path) in stems("blobs") {
            if !kept_layers.contains(&stem) {
                let _ = std::fs::remove_file(&path);
            }
        }
        for (stem, path) in stems("https") {
            if !https.contains(&stem) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    fn cached(&self, origin: &Origin) -> Option<Fetched> {
        let dir = self.cache.as_ref()?;
        let read = |p: &Path| super::store::read_private(p, self.max_bytes + 65536).ok();
        let (bytes, sha) = match origin {
            Origin::Oci(r) => {
                let manifest = read(&dir.join("oci").join(format!("{}.json", r.digest)))?;
                if hex_sha(&manifest) != r.digest {
                    return None;
                }
                let (layer, size) = wasm_layer(&manifest, self.max_bytes).ok()?;
                let bytes = read(&dir.join("blobs").join(format!("{layer}.wasm")))?;
                if bytes.len() as u64 != size {
                    return None;
                }
                (bytes, layer)
            }
            Origin::Https { sha256, .. } => {
                let bytes = read(&dir.join("https").join(format!("{sha256}.wasm")))?;
                (bytes, sha256.clone())
            }
        };
        (hex_sha(&bytes) == sha).then(|| Fetched {
            bytes: bytes.into(),
            sha256: sha,
            manifest: None,
            access: String::new(),
            signatures: Vec::new(),
            cached: true,
        })
    }

    async fn fetch_oci(
        &self,
        r: &OciRef,
        credentials: Option<&Credentials>,
        keys: &[&TrustedKeys],
    ) -> Result<Fetched, FetchError> {
        let mut session =
            self.registry
                .session(&r.registry, &r.repository, credentials.cloned(), false);
        let raw = session
            .manifest(
                &format!("sha256:{}", r.digest),
                &MANIFEST_TYPES,
                MAX_MANIFEST,
            )
            .await?;
        if hex_sha(&raw) != r.digest {
            return Err(FetchError::new(
                "DigestMismatch",
                format!("the manifest served for {r} does not hash to its digest"),
            ));
        }
        let (layer_digest, size) = wasm_layer(&raw, self.max_bytes)?;
        // Signed by the keys asked for, before the layer is downloaded.
        let mut signatures = Vec::new();
        for k in keys {
            signatures.push(self.verify_signature(&mut session, r, k).await?);
        }
        // The declared size bounds the read: a layer longer than its manifest says is refused
        // before it is all in memory.
        let bytes = session
            .blob(&layer_digest, usize::try_from(size).unwrap_or(usize::MAX))
            .await
            .map_err(|e| match e.reason {
                "TooLarge" => FetchError::new(
                    "DigestMismatch",
                    format!("the wasm layer is longer than the {size} bytes its manifest declares"),
                ),
                _ => e,
            })?;
        if hex_sha(&bytes) != layer_digest {
            return Err(FetchError::new(
                "DigestMismatch",
                "the wasm layer's bytes do not hash to the digest the manifest names",
            ));
        }
        Ok(Fetched {
            bytes: bytes.into(),
            sha256: layer_digest,
            manifest: Some(raw),
            access: String::new(),
            signatures,
            cached: false,
        })
    }

    /// A cosign signature of manifest `r` by one of `keys`, from the registry (see `verify`).
    async fn verify_signature(
        &self,
        session: &mut super::registry::Session,
        r: &OciRef,
        keys: &TrustedKeys,
    ) -> Result<(Vec<u8>, String, usize), FetchError> {
        let tag = verify::signature_tag(&r.digest);
        let raw = session
            .manifest(&tag, &MANIFEST_TYPES, MAX_MANIFEST)
            .await
            .map_err(|e| match e.reason {
                "NotFound" => FetchError::new(
                    "SignatureMissing",
                    format!("no cosign signature ({tag}) beside {r}"),
                ),
                _ => e,
            })?;
        let payloads =
            verify::signed_payloads(&raw).map_err(|m| FetchError::new("SignatureInvalid", m))?;
        if payloads.is_empty() {
            return Err(FetchError::new(
                "SignatureMissing",
                format!("{tag} holds no signed payload"),
            ));
        }
        let mut why = String::new();
        for p in payloads {
            let payload = session
                .blob(&p.digest_hex, usize::try_from(p.size).unwrap_or(usize::MAX))
                .await?;
            if hex_sha(&payload) != p.digest_hex {
                why = "a signature payload does not hash to its digest".into();
                continue;
            }
            match verify::verify_payload(keys, &payload, &p.signature_b64, &r.digest) {
                Ok(by) => return Ok((payload, p.signature_b64, by)),
                Err(e) => why = e,
            }
        }
        Err(FetchError::new(
            "SignatureInvalid",
            format!("no signature of {r} by verify.publicKeys: {why}"),
        ))
    }

    async fn fetch_https(&self, url: &str, sha256: &str) -> Result<Fetched, FetchError> {
        let bytes = self
            .registry
            .get_url(url, self.max_bytes)
            .await
            .map_err(|e| match e.reason {
                "TooLarge" => FetchError::new(
                    "TooLarge",
                    format!(
                        "{url} is larger than --max-plugin-bytes ({})",
                        self.max_bytes
                    ),
                ),
                _ => e,
            })?;
        if hex_sha(&bytes) != sha256 {
            return Err(FetchError::new(
                "DigestMismatch",
                format!("{url} does not hash to the sha256 the Plugin names"),
            ));
        }
        Ok(Fetched {
            bytes: bytes.into(),
            sha256: sha256.to_string(),
            manifest: None,
            access: String::new(),
            signatures: Vec::new(),
            cached: false,
        })
    }
}

/// Who pulled `origin`: a hash of the registry, repository and credentials (never the
/// credentials themselves).
fn access_key(origin: &Origin, credentials: Option<&Credentials>) -> String {
    let (registry, repository) = match origin {
        Origin::Oci(r) => (r.registry.as_str(), r.repository.as_str()),
        Origin::Https { url, .. } => (url.as_str(), ""),
    };
    let mut text = format!("{registry}\0{repository}\0");
    if let Some(c) = credentials {
        text.push_str(&format!("{}\0{}", c.username, c.password));
    }
    hex_sha(text.as_bytes())
}

fn hex_sha(bytes: &[u8]) -> String {
    crate::sandbox::sha256_hex(bytes)
}

/// The digest (hex) of the one wasm layer of a manifest, checked: an image manifest whose config
/// is a wasm config media type and which holds exactly one layer, of a wasm media type, whose
/// declared size is within `max_bytes`.
pub fn wasm_layer(raw: &[u8], max_bytes: usize) -> Result<(String, u64), FetchError> {
    let bad = |m: String| FetchError::new("NotAWasmArtifact", m);
    let v: serde_json::Value =
        serde_json::from_slice(raw).map_err(|_| bad("the manifest is not JSON".into()))?;
    if let Some(mt) = v["mediaType"].as_str()
        && !MANIFEST_TYPES.contains(&mt)
    {
        return Err(bad(format!(
            "the manifest's media type is {}, not an image manifest",
            crate::contract::validate::log_text(mt, 128)
        )));
    }
    let config = v["config"]["mediaType"].as_str().unwrap_or_default();
    if !CONFIG_TYPES.contains(&config) {
        return Err(bad(format!(
            "the config media type is {:?}, not a wasm artifact ({})",
            crate::contract::validate::log_text(config, 128),
            CONFIG_TYPES.join(" or ")
        )));
    }
    let layers = v["layers"].as_array().cloned().unwrap_or_default();
    if layers.len() != 1 {
        return Err(bad(format!(
            "the artifact has {} layers; a wasm artifact has exactly one",
            layers.len()
        )));
    }
    let layer = &layers[0];
    let mt = layer["mediaType"].as_str().unwrap_or_default();
    if !LAYER_TYPES.contains(&mt) {
        return Err(bad(format!(
            "the layer's media type is {:?}, not {}",
            crate::contract::validate::log_text(mt, 128),
            LAYER_TYPES.join(" or ")
        )));
    }
    let size = layer["size"].as_u64().unwrap_or(u64::MAX);
    if size > max_bytes as u64 {
        return Err(FetchError::new(
            "TooLarge",
            format!("the wasm layer is {size} bytes, more than --max-plugin-bytes ({max_bytes})"),
        ));
    }
    let digest = layer["digest"].as_str().unwrap_or_default();
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
        .ok_or_else(|| bad("the layer's digest is not sha256:<64 hex digits>".into()))?;
    Ok((hex.to_string(), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest(config: &str, layers: Vec<serde_json::Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": config, "digest": format!("sha256:{D}"), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    fn layer(mt: &str, size: u64) -> serde_json::Value {
        json!({"mediaType": mt, "digest": format!("sha256:{D}"), "size": size})
    }

    #[test]
    fn both_wasm_layouts_are_accepted() {
        for (config, lt) in CONFIG_TYPES.iter().zip(LAYER_TYPES) {
            let m = manifest(config, vec![layer(lt, 100)]);
            assert_eq!(wasm_layer(&m, 1000).unwrap().0, D);
        }
    }

    #[test]
    fn artifacts_that_are_not_one_wasm_layer_within_the_cap_are_refused() {
        let two = manifest(
            CONFIG_TYPES[0],
            vec![layer(LAYER_TYPES[0], 1), layer(LAYER_TYPES[0], 1)],
        );
        assert!(
            wasm_layer(&two, 1000)
                .unwrap_err()
                .message
                .contains("2 layers")
        );
        let image = manifest(
            "application/vnd.oci.image.config.v1+json",
            vec![layer("application/vnd.oci.image.layer.v1.tar+gzip", 1)],
        );
        assert_eq!(
            wasm_layer(&image, 1000).unwrap_err().reason,
            "NotAWasmArtifact"
        );
        let big = manifest(CONFIG_TYPES[0], vec![layer(LAYER_TYPES[0], 5000)]);
        assert_eq!(wasm_layer(&big, 1000).unwrap_err().reason, "TooLarge");
        let no_size = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "config": {"mediaType": CONFIG_TYPES[0]},
            "layers": [{"mediaType": LAYER_TYPES[0], "digest": format!("sha256:{D}")}],
        }))
        .unwrap();
        assert_eq!(wasm_layer(&no_size, 1000).unwrap_err().reason, "TooLarge");
        assert!(wasm_layer(b"not json", 1000).is_err());
    }

    #[test]
    fn pull_secret_credentials_are_found_for_their_registry_only() {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("u:p:w");
        let cfg = serde_json::to_vec(&json!({"auths": {
            "https://reg.example:5000/v2/": {"auth": auth},
            "other.example": {"username": "a", "password": "b"},
        }}))
        .unwrap();
        let c = credentials_for(&cfg, "reg.example:5000").unwrap().unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p:w"));
        assert!(credentials_for(&cfg, "third.example").unwrap().is_none());
        assert!(!format!("{c:?}").contains("p:w"));
        assert!(credentials_for(b"{}", "reg.example").is_err());
    }
}
