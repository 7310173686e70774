//! Checks for every value a guest hands the host, before it shapes a request path, a query, a
//! metric label or a log line. The rules are Kubernetes' own (DNS-1123 labels and subdomains, path
//! segment names), kept strict: a value that passes can be put into a URL path as it is.

use super::{KindRef, ObjectKey};

// The checks themselves live in `wcm-validate`, below both the host and the SDK's MockHost, so a
// plugin's unit test is refused exactly what the host refuses.
pub use wcm_validate::{
    Invalid, continue_token, dns_label, dns_subdomain, event_word, field_manager_suffix,
    field_selector, label_key, label_selector, limit, name, namespace,
    precondition_resource_version, printable, shown, uid,
};

/// An object key: its namespace (when given) and its name.
pub fn object_key(k: &ObjectKey) -> Result<(), Invalid> {
    if let Some(ns) = &k.namespace {
        namespace(ns)?;
    }
    name(&k.name)
}

/// A kind: group a DNS-1123 subdomain or "" (core), version a DNS-1123 label, kind a CamelCase
/// identifier.
pub fn kind(k: &KindRef) -> Result<(), Invalid> {
    wcm_validate::kind(&k.group, &k.version, &k.kind)
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A guest's log text made safe for one log line: control characters (newlines included), line and
/// paragraph separators and bidirectional overrides (which reorder what a terminal shows) escaped,
/// at most `max` bytes kept.
pub fn log_text(s: &str, max: usize) -> String {
    let cut = truncate(s, max);
    let mut out = String::with_capacity(cut.len());
    for c in cut.chars() {
        let bidi = matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}');
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if cut.len() < s.len() {
        out.push_str("…[truncated]");
    }
    out
}

/// Caps on what one `describe` may declare: every per-plugin structure the host builds from it is
/// bounded by these.
pub const MAX_SECONDARIES: usize = 32;
pub const MAX_PERMISSIONS: usize = 64;
pub const MAX_OUTBOUND_HOSTS: usize = 32;
pub const MAX_CONFIG_KEYS: usize = 256;
pub const MAX_EXTENSIONS: usize = 64;

/// RBAC verbs a plugin may declare.
const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "*",
];

/// Checks what `describe` returned, before anything is built from it.
pub fn description(d: &super::Description) -> Result<(), String> {
    let name = &d.name;
    dns_label(name).map_err(|why| format!("plugin name {} {why}", shown(name)))?;
    let short = |what: &str, s: &str, max: usize| {
        if s.len() > max {
            Err(format!("plugin {name}: {what} is longer than {max} bytes"))
        } else {
            Ok(())
        }
    };
    short("version", &d.version, 128)?;
    let caps = [
        ("secondaries", d.secondaries.len(), MAX_SECONDARIES),
        ("permissions", d.permissions.len(), MAX_PERMISSIONS),
        ("outbound hosts", d.outbound_hosts.len(), MAX_OUTBOUND_HOSTS),
        ("config keys", d.config_keys.len(), MAX_CONFIG_KEYS),
        ("extensions", d.extensions.len(), MAX_EXTENSIONS),
    ];
    for (what, n, max) in caps {
        if n > max {
            return Err(format!(
                "plugin {name} declares {n} {what}; at most {max} are allowed"
            ));
        }
    }
    for w in std::iter::once(&d.primary).chain(d.secondaries.iter().map(|s| &s.watch)) {
        kind(&w.kind).map_err(|e| format!("plugin {name}: a watch has an {e}"))?;
        if let Some(ns) = w.namespace.as_deref().filter(|ns| !ns.is_empty()) {
            namespace(ns).map_err(|e| format!("plugin {name}: a watch has an {e}"))?;
        }
        if let Some(sel) = &w.label_selector {
            label_selector(sel).map_err(|e| format!("plugin {name}: {e}"))?;
        }
    }
    for s in &d.secondaries {
        if let super::Mapping::FixedKey(k) = &s.mapping {
            object_key(k).map_err(|e| format!("plugin {name}: a fixed key has an {e}"))?;
        }
    }
    for p in &d.permissions {
        if !p.group.is_empty() {
            dns_subdomain(&p.group).map_err(|why| {
                format!("plugin {name}: permission group {} {why}", shown(&p.group))
            })?;
        }
        let resource_ok = p.resource == "*"
            || p.resource.split('/').count() <= 2
                && p.resource.split('/').all(|part| dns_label(part).is_ok());
        if !resource_ok {
            return Err(format!(
                "plugin {name}: permission resource {} is not a plural resource name (\"nodes\", \"networks/status\" or \"*\")",
                shown(&p.resource)
            ));
        }
        if p.verbs.is_empty() || p.verbs.len() > VERBS.len() {
            return Err(format!(
                "plugin {name}: permission on {} needs 1 to {} verbs",
                p.resource,
                VERBS.len()
            ));
        }
        if let Some(v) = p.verbs.iter().find(|v| !VERBS.contains(&v.as_str())) {
            return Err(format!(
                "plugin {name}: {} is not an RBAC verb ({})",
                shown(v),
                VERBS.join(", ")
            ));
        }
    }
    for h in &d.outbound_hosts {
        short("an outbound host", h, 260)?;
    }
    for k in &d.config_keys {
        short("a config key", k, 253)?;
    }
    if d.workers == Some(0) {
        return Err(format!("plugin {name} declares 0 workers"));
    }
    for (k, v) in &d.extensions {
        short("an extension key", k, 253)?;
        short("an extension value", v, 64 << 10)?;
        if serde_json::from_str::<serde_json::Value>(v).is_err() {
            return Err(format!("plugin {name}: extension {} is not JSON", shown(k)));
        }
    }
    super::declared::metrics(&d.metrics).map_err(|e| format!("plugin {name}: {e}"))?;
    super::declared::schedules(&d.schedules).map_err(|e| format!("plugin {name}: {e}"))?;
    super::change_filter::filters(d).map_err(|e| format!("plugin {name}: {e}"))?;
    super::mapping::mappings(d).map_err(|e| format!("plugin {name}: {e}"))?;
    super::isolation::declared(d).map_err(|e| format!("plugin {name}: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: Option<&str>, n: &str) -> ObjectKey {
        ObjectKey {
            namespace: ns.map(str::to_string),
            name: n.into(),
        }
    }

    #[test]
    fn path_injection_through_namespace_or_name_is_refused() {
        for ns in [
            "kube-system/secrets/topsecret?",
            "kube-system%2Fsecrets",
            "..",
            "a/../b",
            "ns#frag",
            "ns?watch=1",
            "ns\n",
            "",
            "UPPER",
            &"a".repeat(64),
        ] {
            assert!(
                object_key(&key(Some(ns), "x")).is_err(),
                "namespace {ns:?} passed"
            );
        }
        for n in [
            "..",
            ".",
            "a/b",
            "x%2F..%2Fsecrets",
            "x?dryRun=All",
            "x#y",
            "x y",
            "x\u{0}",
            "é",
            "",
            &"a".repeat(254),
        ] {
            assert!(name(n).is_err(), "name {n:?} passed");
        }
    }

    #[test]
    fn ordinary_names_pass() {
        for n in [
            "web-0",
            "control-plane-1",
            "system:controller:pods",
            "a.b.c",
            "My_Name",
        ] {
            assert!(name(n).is_ok(), "{n}");
        }
        assert!(object_key(&key(Some("kube-system"), "coredns")).is_ok());
        assert!(object_key(&key(None, "node-1")).is_ok());
    }

    #[test]
    fn kinds_are_checked_part_by_part() {
        let k = |g: &str, v: &str, kd: &str| KindRef {
            group: g.into(),
            version: v.into(),
            kind: kd.into(),
        };
        assert!(kind(&k("", "v1", "Pod")).is_ok());
        assert!(kind(&k("samplecrd.k8s.io", "v1", "Network")).is_ok());
        assert!(kind(&k("../api", "v1", "Pod")).is_err());
        assert!(kind(&k("", "v1/namespaces", "Pod")).is_err());
        assert!(kind(&k("", "v1", "Pod/x")).is_err());
        assert!(kind(&k("", "", "Pod")).is_err());
    }

    #[test]
    fn log_text_escapes_newlines_and_cuts_long_text() {
        assert_eq!(log_text("a\nb\tc", 100), "a\\nb\\tc");
        // A right-to-left override or a line separator would change what a terminal shows.
        assert_eq!(
            log_text("ok\u{202E}gnp.exe\u{2028}x", 100),
            "ok\\u{202e}gnp.exe\\u{2028}x"
        );
        let long = "x".repeat(10_000);
        let out = log_text(&long, 100);
        assert!(out.len() < 120 && out.ends_with("[truncated]"), "{out}");
        assert_eq!(truncate("héllo", 2), "h");
        assert!(shown(&"\n".repeat(500)).len() < 200);
    }

    #[test]
    fn selectors_are_parsed() {
        assert!(label_selector("app=web,tier!=db").is_ok());
        assert!(label_selector("app=web&watch=true").is_err());
    }
}
