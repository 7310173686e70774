//! The `Plugin` object (`plugins.wcm.dev/v1alpha1`, cluster-scoped): what the host reads from it,
//! checked before it shapes a request, a path or a grant. The CRD's schema
//! (`manifests/crds/plugins.wcm.dev.yaml`) refuses most bad input at the API server; everything is
//! checked again here, since an object may come from an older schema or a server that did not
//! validate it.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;

/// The API group, version and kind.
pub const GROUP: &str = "wcm.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "Plugin";

/// The key a Plugin object has among the loader's files: `Plugin/NAME` (no file stem holds `/`).
pub fn key_of(name: &str) -> String {
    format!("{KIND}/{name}")
}

/// `spec` of a Plugin.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginSpec {
    pub source: SourceSpec,
    #[serde(default)]
    pub pull_secret: Option<String>,
    #[serde(default)]
    pub verify: Option<VerifySpec>,
    /// What NAME.toml holds, under the same keys; rendered to TOML and read by the same code.
    #[serde(default)]
    pub settings: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SourceSpec {
    #[serde(default)]
    pub oci: Option<String>,
    #[serde(default)]
    pub https: Option<HttpsSpec>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HttpsSpec {
    pub url: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifySpec {
    #[serde(default)]
    pub public_keys: Vec<String>,
}

/// Where the component comes from, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Oci(OciRef),
    Https {
        url: String,
        /// host[:port], as `--plugin-registry` names it.
        authority: String,
        sha256: String,
    },
}

impl Origin {
    /// The SHA-256 (hex) the component's bytes must have.
    pub fn sha256(&self) -> &str {
        match self {
            Origin::Oci(r) => &r.digest,
            Origin::Https { sha256, .. } => sha256,
        }
    }

    /// The registry or host it is fetched from.
    pub fn authority(&self) -> &str {
        match self {
            Origin::Oci(r) => &r.registry,
            Origin::Https { authority, .. } => authority,
        }
    }

    /// As written in the object (for status and logs: built from checked parts only).
    pub fn shown(&self) -> String {
        match self {
            Origin::Oci(r) => r.to_string(),
            Origin::Https { url, sha256, .. } => format!("{url}#sha256:{sha256}"),
        }
    }
}

/// `registry[:port]/repository[:tag]@sha256:HEX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciRef {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    /// The manifest's digest, hex.
    pub digest: String,
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        write!(f, "@sha256:{}", self.digest)
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `host:443` → `host`: registries are named without the https default port, as a URL's
/// authority is (both `--plugin-registry` and a source are compared in this form).
pub fn normal_authority(a: &str) -> String {
    a.strip_suffix(":443").unwrap_or(a).to_string()
}

/// The most `shards` a Plugin object's settings may ask for.
pub const MAX_OBJECT_SHARDS: u32 = 16;

/// A registry host: DNS labels or an IPv4 address, optional port.
pub fn check_authority(a: &str) -> Result<(), String> {
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (a, None),
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{a:?}: the port is not a number"));
    }
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(ok_label) {
        return Err(format!(
            "{a:?} is not a registry host (lowercase DNS name or IPv4 address, optional :port)"
        ));
    }
    Ok(())
}

impl OciRef {
    pub fn parse(s: &str) -> Result<OciRef, String> {
        if s.len() > 512 {
            return Err("the OCI reference is longer than 512 characters".into());
        }
        let Some((name, digest)) = s.rsplit_once("@sha256:") else {
            return Err(
                "the OCI reference has no digest: pin it as registry/repository@sha256:DIGEST \
                 (a tag alone may point at other bytes tomorrow, and replicas would disagree)"
                    .into(),
            );
        };
        if !is_hex64(digest) {
            return Err("the digest is not sha256:<64 lowercase hex digits>".into());
        }
        let Some((registry, path)) = name.split_once('/') else {
            return Err(
                "the OCI reference names no registry (registry/repository@sha256:…)".into(),
            );
        };
        check_authority(registry)?;
        // A tag: after the last `:` of the path, if any.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) => (r, Some(t)),
            None => (path, None),
        };
        if let Some(t) = tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                && !t.starts_with(['.', '-']);
            if !ok {
                return Err(format!("the tag {:?} is not a valid tag", t));
            }
        }
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
                && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        if repository.is_empty()
            || repository.len() > 255
            || !repository.split('/').all(component_ok)
        {
            return Err(format!(
                "the repository {repository:?} is not a valid OCI repository name"
            ));
        }
        Ok(OciRef {
            registry: normal_authority(registry),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest: digest.to_string(),
        })
    }
}

impl PluginSpec {
    /// The object's spec, or why it cannot be used.
    pub fn from_value(spec: &Value) -> Result<PluginSpec, String> {
        serde_json::from_value(spec.clone()).map_err(|e| format!("spec: {e}"))
    }

    /// The source, checked, and allowed by the operator's list of registries and hosts.
    pub fn origin(&self, allowed: &BTreeSet<String>) -> Result<Origin, String> {
        let keys = self.trusted_keys()?;
        let origin = match (&self.source.oci, &self.source.https) {
            (Some(r), None) => Origin::Oci(OciRef::parse(r)?),
            (None, Some(h)) => {
                let rest = h
                    .url
                    .strip_prefix("https://")
                    .ok_or("source.https.url must start with https://")?;
                if h.url.len() > 2048 || h.url.chars().any(|c| c.is_control() || c == ' ') {
                    return Err("source.https.url is too long or holds spaces".into());
                }
                let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
                if authority.contains('@') {
                    return Err("source.https.url must not carry credentials".into());
                }
                check_authority(authority)?;
                if !is_hex64(&h.sha256) {
                    return Err("source.https.sha256 is not 64 lowercase hex digits".into());
                }
                Origin::Https {
                    url: h.url.clone(),
                    authority: normal_authority(authority),
                    sha256: h.sha256.clone(),
                }
            }
            _ => return Err("source must name exactly one of oci or https".into()),
        };
        if keys.is_some() && matches!(origin, Origin::Https { .. }) {
            return Err(
                "verify.publicKeys: cosign signatures live in an OCI registry beside the artifact; an https source cannot be verified"
                    .into(),
            );
        }
        if !allowed.contains(&normal_authority(origin.authority())) {
            return Err(format!(
                "{} is not in --plugin-registry ({})",
                origin.authority(),
                if allowed.is_empty() {
                    "empty: no registry is allowed".to_string()
                } else {
                    allowed.iter().cloned().collect::<Vec<_>>().join(", ")
                }
            ));
        }
        Ok(origin)
    }

    /// `verify.publicKeys` as written (none: no verification asked).
    pub fn public_keys(&self) -> &[String] {
        self.verify
            .as_ref()
            .map(|v| v.public_keys.as_slice())
            .unwrap_or_default()
    }

    /// The Plugin's cosign public keys, parsed, if it asks for verification.
    pub fn trusted_keys(&self) -> Result<Option<super::verify::TrustedKeys>, String> {
        match self.public_keys() {
            [] => Ok(None),
            keys => super::verify::TrustedKeys::parse(keys).map(Some),
        }
    }

    /// The pull Secret's name, checked as a Kubernetes object name.
    pub fn pull_secret(&self) -> Result<Option<&str>, String> {
        match &self.pull_secret {
            None => Ok(None),
            Some(n) => {
                // A DNS subdomain, as Secret names are.
                let ok = !n.is_empty()
                    && n.len() <= 253
                    && n.split('.')
                        .all(|l| crate::contract::validate::namespace(l).is_ok());
                if !ok {
                    return Err(format!("pullSecret {n:?} is not a Secret name"));
                }
                Ok(Some(n))
            }
        }
    }

    /// `settings` as NAME.toml text (the same keys), for the loader's one settings parser, checked
    /// against what a Plugin object may ask for (`Ceilings`). The instance name is always the
    /// object's name: holding `create` on a Plugin named N is what it takes to run code as plugin N
    /// (and RBAC's `resourceNames` can say which N).
    pub fn settings_toml(&self, object_name: &str, ceilings: &Ceilings) -> Result<String, String> {
        let mut map = self.settings.clone().unwrap_or_default();
        match map.get("name") {
            None => {}
            Some(Value::String(n)) if n == object_name => {}
            Some(_) => {
                return Err(format!(
                    "settings.name: a Plugin object's instance name is its own name ({object_name}); \
                     create a Plugin of that name instead"
                ));
            }
        }
        map.insert("name".into(), Value::String(object_name.to_string()));
        let text = toml::to_string(&map).map_err(|e| format!("settings: {e}"))?;
        let parsed = crate::loading::settings::PluginSettings::parse(&text)
            .map_err(|e| format!("settings: {e}"))?;
        ceilings.check(&parsed)?;
        Ok(text)
    }
}

/// What the settings of a Plugin object may ask for: never more than the operator's flags give a
/// plugin (budgets and limits at most the host's defaults, none unlimited), hosts only from
/// `--plugin-object-host`, and no protected namespace. A file in the plugins directory is the
/// operator's own and is not bound by these.
#[derive(Debug, Clone, Default)]
pub struct Ceilings {
    pub budgets: crate::cluster::services::BudgetSettings,
    pub limits: crate::sandbox::Limits,
    pub max_workers: u32,
    /// Hosts a Plugin object may list in `allowed_hosts` (`--plugin-object-host`).
    pub hosts: BTreeSet<String>,
    pub protected: Vec<String>,
}

impl Ceilings {
    pub fn check(&self, s: &crate::loading::settings::PluginSettings) -> Result<(), String> {
        let b = &self.budgets;
        let over = |key: &str, flag: &str, limit: String| {
            Err(format!(
                "settings.{key}: a Plugin object may ask for at most the host's {flag} ({limit})"
            ))
        };
        // A host default of 0 means "no limit": then any positive value is a tightening.
        let rate_ok = |asked: f64, host: f64| asked > 0.0 && (host == 0.0 || asked <= host);
        if let Some(q) = s.api_qps
            && !rate_ok(q, b.api_qps)
        {
            return over(
                "api_qps",
                "--plugin-api-qps",
                format!("{}, and not 0", b.api_qps),
            );
        }
        if s.api_burst.is_some_and(|v| v > b.api_burst) {
            return over("api_burst", "--plugin-api-burst", b.api_burst.to_string());
        }
        if let Some(q) = s.http_qps
            && !rate_ok(q, b.http_qps)
        {
            return over(
                "http_qps",
                "--plugin-http-qps",
                format!("{}, and not 0", b.http_qps),
            );
        }
        if s.http_burst.is_some_and(|v| v > b.http_burst) {
            return over(
                "http_burst",
                "--plugin-http-burst",
                b.http_burst.to_string(),
            );
        }
        if let Some(c) = s.cpu_share
            && !rate_ok(c, b.cpu_share)
        {
            return over(
                "cpu_share",
                "--plugin-cpu-share",
                format!("{}, and not 0", b.cpu_share),
            );
        }
        if s.max_instances.is_some_and(|v| v > b.max_instances) {
            return over(
                "max_instances",
                "--max-instances-per-plugin",
                b.max_instances.to_string(),
            );
        }
        if s.max_watch_streams.is_some_and(|v| v > b.max_watch_streams) {
            return over(
                "max_watch_streams",
                "--max-watch-streams-per-plugin",
                b.max_watch_streams.to_string(),
            );
        }
        if s.max_metric_series.is_some_and(|v| v > b.max_metric_series) {
            return over(
                "max_metric_series",
                "--plugin-metric-series",
                b.max_metric_series.to_string(),
            );
        }
        if s.min_requeue_after_ms
            .is_some_and(|ms| u128::from(ms) < b.min_requeue_after.as_millis())
        {
            return Err(format!(
                "settings.min_requeue_after_ms: a Plugin object may ask for at least the host's --min-requeue-after-ms ({})",
                b.min_requeue_after.as_millis()
            ));
        }
        // Each range is a Lease every replica reads each retry period: whoever may write Plugin
        // objects gets a few, the operator's own NAME.toml more.
        if s.shards.is_some_and(|n| n > MAX_OBJECT_SHARDS) {
            return Err(format!(
                "settings.shards: a Plugin object may ask for at most {MAX_OBJECT_SHARDS} ranges"
            ));
        }
        if s.workers.is_some_and(|w| w > self.max_workers) {
            return over(
                "workers",
                "--max-workers-per-plugin",
                self.max_workers.to_string(),
            );
        }
        if s.memory_mb
            .is_some_and(|mb| (mb as usize) << 20 > self.limits.memory)
        {
            return over(
                "memory_mb",
                "plugin memory limit",
                format!("{} MiB", self.limits.memory >> 20),
            );
        }
        if s.cpu_deadline_ms
            .is_some_and(|ms| u128::from(ms) > self.limits.cpu_deadline.as_millis())
        {
            return over(
                "cpu_deadline_ms",
                "plugin CPU deadline",
                format!("{} ms", self.limits.cpu_deadline.as_millis()),
            );
        }
        for h in &s.allowed_hosts {
            if !self.hosts.contains(h) {
                return Err(format!(
                    "settings.allowed_hosts: {} is not in --plugin-object-host ({})",
                    crate::contract::validate::log_text(h, 256),
                    if self.hosts.is_empty() {
                        "empty: a Plugin object may name no host".to_string()
                    } else {
                        self.hosts.iter().cloned().collect::<Vec<_>>().join(", ")
                    }
                ));
            }
        }
        for ns in s.namespaces.iter().flatten() {
            if self.protected.contains(ns) {
                return Err(format!(
                    "settings.namespaces: {ns} is a protected namespace; only a file in the plugins directory may name it"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn allowed(a: &[&str]) -> BTreeSet<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_pinned_reference_parses_and_a_tag_alone_is_refused() {
        let r =
            OciRef::parse(&format!("reg.example:5000/team/pod-counter:1.2@sha256:{D}")).unwrap();
        assert_eq!(r.registry, "reg.example:5000");
        assert_eq!(r.repository, "team/pod-counter");
        assert_eq!(r.tag.as_deref(), Some("1.2"));
        assert_eq!(r.digest, D);
        assert_eq!(
            r.to_string(),
            format!("reg.example:5000/team/pod-counter:1.2@sha256:{D}")
        );
        let e = OciRef::parse("reg.example/team/pod-counter:1.2").unwrap_err();
        assert!(e.contains("no digest"), "{e}");
    }

    #[test]
    fn crafted_references_are_refused() {
        for bad in [
            format!("reg.example/a@sha256:{}", &D[..63]),
            format!("reg.example/a@sha256:{}", D.to_uppercase()),
            format!("Reg.Example/a@sha256:{D}"),
            format!("reg.example/../a@sha256:{D}"),
            format!("reg.example/a b@sha256:{D}"),
            format!("reg.example:port/a@sha256:{D}"),
            format!("user@reg.example/a@sha256:{D}"),
            format!("reg.example/a:-x@sha256:{D}"),
            format!("a@sha256:{D}"),
            format!("reg.example/a\n@sha256:{D}"),
        ] {
            assert!(OciRef::parse(&bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn only_allowed_registries_and_hosts_are_used() {
        let spec = |v: Value| PluginSpec::from_value(&v).unwrap();
        let oci = spec(json!({"source": {"oci": format!("reg.example/a@sha256:{D}")}}));
        assert!(oci.origin(&allowed(&["reg.example"])).is_ok());
        let e = oci.origin(&allowed(&["other.example"])).unwrap_err();
        assert!(e.contains("not in --plugin-registry"), "{e}");
        assert!(oci.origin(&allowed(&[])).unwrap_err().contains("empty"));
        let https = spec(
            json!({"source": {"https": {"url": "https://files.example/x.wasm", "sha256": D}}}),
        );
        assert_eq!(
            https
                .origin(&allowed(&["files.example"]))
                .unwrap()
                .authority(),
            "files.example"
        );
        let creds = spec(
            json!({"source": {"https": {"url": "https://u:p@files.example/x.wasm", "sha256": D}}}),
        );
        assert!(creds.origin(&allowed(&["files.example"])).is_err());
        let both = spec(
            json!({"source": {"oci": format!("reg.example/a@sha256:{D}"),
            "https": {"url": "https://files.example/x.wasm", "sha256": D}}}),
        );
        assert!(
            both.origin(&allowed(&["reg.example", "files.example"]))
                .is_err()
        );
        let plain =
            spec(json!({"source": {"https": {"url": "http://files.example/x.wasm", "sha256": D}}}));
        assert!(plain.origin(&allowed(&["files.example"])).is_err());
    }

    #[test]
    fn settings_become_the_same_toml_the_loader_reads() {
        let ceilings = Ceilings {
            max_workers: 4,
            hosts: ["neutron:9696".to_string()].into(),
            protected: vec!["wcm-system".into(), "kube-system".into()],
            ..Default::default()
        };
        let with = |settings: Value| {
            PluginSpec::from_value(&json!({
                "source": {"oci": format!("reg.example/a@sha256:{D}")},
                "settings": settings,
            }))
            .unwrap()
            .settings_toml("net", &ceilings)
        };
        let text = with(
            json!({"isolation": "worker", "workers": 2, "namespaces": ["default"],
                         "allowed_hosts": ["neutron:9696"],
                         "config": {"keystone-url": "https://k/v3"}}),
        )
        .unwrap();
        let parsed = crate::loading::settings::PluginSettings::parse(&text).unwrap();
        assert_eq!(parsed.workers, Some(2));
        assert_eq!(parsed.name.as_deref(), Some("net"), "the object's name");
        assert_eq!(parsed.namespaces, Some(vec!["default".to_string()]));
        assert_eq!(parsed.config["keystone-url"], "https://k/v3");
        assert!(with(json!({"worker": 2})).is_err(), "a typo");
        assert!(with(json!({"name": "net"})).is_ok());
        assert!(with(json!({"shards": 16, "shard_by": "namespace"})).is_ok());
        // What only the operator may give.
        for (bad, says) in [
            (json!({"name": "network"}), "instance name"),
            (json!({"workers": 5}), "--max-workers-per-plugin"),
            (json!({"api_qps": 0}), "--plugin-api-qps"),
            (json!({"api_qps": 1000}), "--plugin-api-qps"),
            (json!({"http_qps": 0}), "--plugin-http-qps"),
            (json!({"cpu_share": 0}), "--plugin-cpu-share"),
            (json!({"cpu_share": 8}), "--plugin-cpu-share"),
            (json!({"max_instances": 1000}), "--max-instances-per-plugin"),
            (
                json!({"max_watch_streams": 1000}),
                "--max-watch-streams-per-plugin",
            ),
            (json!({"min_requeue_after_ms": 1}), "--min-requeue-after-ms"),
            (json!({"memory_mb": 100000}), "memory"),
            (json!({"cpu_deadline_ms": 10000000}), "deadline"),
            (
                json!({"allowed_hosts": ["metadata.internal:80"]}),
                "--plugin-object-host",
            ),
            (json!({"shards": 17}), "at most 16 ranges"),
            (json!({"shards": 1}), "shards must be from 2"),
            (json!({"shard_by": "uid"}), "shard_by needs shards"),
            (json!({"namespaces": ["wcm-system"]}), "protected"),
            (
                json!({"namespaces": ["default", "kube-system"]}),
                "protected",
            ),
        ] {
            let e = with(bad.clone()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn pull_secret_names_are_checked() {
        let with = |n: &str| PluginSpec {
            source: SourceSpec {
                oci: None,
                https: None,
            },
            pull_secret: Some(n.into()),
            verify: None,
            settings: None,
        };
        assert_eq!(with("regcred").pull_secret().unwrap(), Some("regcred"));
        assert_eq!(with("reg.cred").pull_secret().unwrap(), Some("reg.cred"));
        for bad in ["", "Reg", "../x", "a/b", &"x".repeat(300)] {
            assert!(with(bad).pull_secret().is_err(), "{bad:?}");
        }
    }
}
