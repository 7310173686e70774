//! Checks for every value a guest hands the host, before it shapes a request path, a query, a
//! metric label or a log line. The rules are Kubernetes' own (DNS-1123 labels and subdomains, path
//! segment names), kept strict: a value that passes can be put into a URL path as it is.
//!
//! This crate sits below both the host and the SDK's `MockHost`: the host refuses a plugin's value
//! with exactly these checks, and `MockHost` runs the same ones, so a unit test sees the refusal the
//! cluster would give (same `400 BadRequest` and message for API calls, same dropped event).
//! [`BAD_INPUTS`] is one table of refused values that both sides' tests feed through.

use std::fmt;

/// A value from a guest that was refused, and why. Its `Display` is safe to log: the offending
/// value is quoted with escapes and cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub what: &'static str,
    pub value: String,
    pub why: String,
}

impl Invalid {
    pub fn new(what: &'static str, value: &str, why: impl Into<String>) -> Self {
        Invalid {
            what,
            value: value.chars().take(80).collect(),
            why: why.into(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} {}: {}",
            self.what,
            shown(&self.value),
            self.why
        )
    }
}

impl std::error::Error for Invalid {}

/// The HTTP status and reason the host answers a refused API call with (and `MockHost` too).
pub const REFUSED_CODE: u16 = 400;
pub const REFUSED_REASON: &str = "BadRequest";

/// A guest string as it may appear in a log line or an error: escaped (no newlines or control
/// characters survive) and at most 80 characters, quoted.
pub fn shown(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(80)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if s.chars().count() > 80 {
        out.push('…');
    }
    format!("\"{out}\"")
}

/// A namespace: a DNS-1123 label (lowercase letters, digits, '-'; at most 63).
pub fn namespace(ns: &str) -> Result<(), Invalid> {
    dns_label(ns).map_err(|why| Invalid::new("namespace", ns, why))
}

/// An object name as it may stand in a request path: 1–253 characters from letters, digits and
/// `-._:`, not `.` or `..` (Kubernetes' path segment rule, minus anything a URL would interpret).
pub fn name(n: &str) -> Result<(), Invalid> {
    let bad = |why: &str| Err(Invalid::new("name", n, why));
    if n.is_empty() {
        return bad("must not be empty");
    }
    if n.len() > 253 {
        return bad("must be at most 253 characters");
    }
    if n == "." || n == ".." {
        return bad("must not be '.' or '..'");
    }
    if let Some(c) = n
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':')))
    {
        return bad(&format!(
            "character {} is not allowed (letters, digits and '-._:' only)",
            c.escape_debug()
        ));
    }
    Ok(())
}

/// A kind: group a DNS-1123 subdomain or "" (core), version a DNS-1123 label, kind a CamelCase
/// identifier.
pub fn kind(group: &str, version: &str, kind: &str) -> Result<(), Invalid> {
    if !group.is_empty() {
        dns_subdomain(group).map_err(|why| Invalid::new("API group", group, why))?;
    }
    dns_label(version).map_err(|why| Invalid::new("API version", version, why))?;
    let ok = !kind.is_empty()
        && kind.len() <= 63
        && kind.starts_with(|c: char| c.is_ascii_alphabetic())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if !ok {
        return Err(Invalid::new(
            "kind",
            kind,
            "must be letters and digits, starting with a letter, at most 63",
        ));
    }
    Ok(())
}

/// A label selector in the API server's syntax (parsed, so nothing but a selector reaches a query).
pub fn label_selector(s: &str) -> Result<(), Invalid> {
    if s.len() > 4096 {
        return Err(Invalid::new(
            "label selector",
            s,
            "must be at most 4096 bytes",
        ));
    }
    wcm_selector::Selector::parse(s).map_err(|e| Invalid::new("label selector", s, e))?;
    Ok(())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of 1–63 letters, digits and
/// `-_.`, starting and ending with a letter or digit.
pub fn label_key(k: &str) -> Result<(), Invalid> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        dns_subdomain(p).map_err(|why| Invalid::new("label key prefix", k, why))?;
    }
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(Invalid::new(
            "label key",
            k,
            "the name must be 1-63 letters, digits and '-_.', starting and ending with a letter or digit",
        ));
    }
    Ok(())
}

/// A UID as the API server makes them (a UUID; letters, digits and '-', at most 128).
pub fn uid(u: &str) -> Result<(), Invalid> {
    let ok =
        !u.is_empty() && u.len() <= 128 && u.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new("uid", u, "must be letters, digits and '-'"))
    }
}

/// An event's reason or action: 1–128 characters from letters, digits and `-._:` (the API server
/// allows 128; CamelCase words are the convention).
pub fn event_word(what: &'static str, s: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            what,
            s,
            "must be 1-128 characters from letters, digits and '-._:'",
        ))
    }
}

/// The object an event is about and its reason and action, as the host checks them before it
/// records the event (a refused event is dropped, with a warning in the host's log).
pub fn event(
    kind: (&str, &str, &str),
    namespace: Option<&str>,
    name: &str,
    uid: Option<&str>,
    reason: &str,
    action: &str,
) -> Result<(), Invalid> {
    self::kind(kind.0, kind.1, kind.2)?;
    if let Some(ns) = namespace {
        self::namespace(ns)?;
    }
    self::name(name)?;
    if let Some(u) = uid {
        self::uid(u)?;
    }
    event_word("reason", reason)?;
    event_word("action", action)?;
    Ok(())
}

/// A string option that becomes a query parameter: at most `max` bytes of printable ASCII.
pub fn printable(what: &'static str, s: &str, max: usize) -> Result<(), Invalid> {
    if s.len() > max {
        return Err(Invalid::new(
            what,
            s,
            format!("must be at most {max} bytes"),
        ));
    }
    if s.chars().any(|c| !c.is_ascii_graphic() && c != ' ') {
        return Err(Invalid::new(what, s, "must be printable ASCII"));
    }
    Ok(())
}

/// The longest field manager suffix: the API server allows 128 bytes for `wcm:NAME:SUFFIX`, with
/// a plugin name of at most 63.
pub const MAX_FIELD_MANAGER_SUFFIX: usize = 128 - "wcm:".len() - 63 - 1;

/// A field manager suffix (`wcm:NAME:SUFFIX`): no ':' in it, and within the API server's 128.
pub fn field_manager_suffix(m: &str) -> Result<(), Invalid> {
    let max = MAX_FIELD_MANAGER_SUFFIX;
    let ok = !m.is_empty()
        && m.len() <= max
        && m.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "field manager suffix",
            m,
            format!("must be 1-{max} lowercase letters, digits and '-'"),
        ))
    }
}

/// A list's page size.
pub fn limit(l: u32) -> Result<(), Invalid> {
    if (1..=10_000).contains(&l) {
        Ok(())
    } else {
        Err(Invalid::new("limit", &l.to_string(), "must be 1 to 10000"))
    }
}

/// A list's continue token.
pub fn continue_token(t: &str) -> Result<(), Invalid> {
    printable("continue token", t, 8192)
}

/// A list's field selector (the API server parses it; the host bounds it).
pub fn field_selector(f: &str) -> Result<(), Invalid> {
    printable("field selector", f, 4096)
}

/// A delete precondition on the resourceVersion.
pub fn precondition_resource_version(rv: &str) -> Result<(), Invalid> {
    printable("precondition resourceVersion", rv, 64)
}

/// A DNS-1123 label: 1-63 lowercase letters, digits and `-`, starting and ending with a letter or digit.
pub fn dns_label(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > 63 {
        return Err("must be 1-63 characters");
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err("must be lowercase letters, digits and '-'");
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// A DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253.
pub fn dns_subdomain(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > 253 {
        return Err("must be 1-253 characters");
    }
    s.split('.').try_for_each(dns_label)
}

/// Where a bad value goes in a call or event, for [`BAD_INPUTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Namespace,
    Name,
    Group,
    Version,
    Kind,
    LabelSelector,
    FieldSelector,
    FieldManagerSuffix,
    EventReason,
    EventAction,
    EventUid,
}

/// Values the host refuses, each with where it goes and what the refusal names. The host's tests
/// and the SDK's `MockHost` tests feed this same table, so the two cannot drift apart.
pub const BAD_INPUTS: &[(Field, &str, &str)] = &[
    (Field::Namespace, "kube-system/secrets", "namespace"),
    (Field::Namespace, "UPPER", "namespace"),
    (Field::Namespace, "", "namespace"),
    (Field::Namespace, "ns?watch=1", "namespace"),
    (Field::Name, "a/../b", "name"),
    (Field::Name, "..", "name"),
    (Field::Name, "x\ny", "name"),
    (Field::Name, "sp ace", "name"),
    (Field::Group, "Apps", "API group"),
    (Field::Version, "v1/..", "API version"),
    (Field::Kind, "Config-Map", "kind"),
    (Field::Kind, "", "kind"),
    (Field::LabelSelector, "a in (", "label selector"),
    (Field::LabelSelector, "=x", "label selector"),
    (Field::FieldSelector, "metadata.name=\n", "field selector"),
    (Field::FieldManagerSuffix, "Mine", "field manager suffix"),
    (Field::FieldManagerSuffix, "a:b", "field manager suffix"),
    (Field::FieldManagerSuffix, "", "field manager suffix"),
    (Field::EventReason, "", "reason"),
    (Field::EventReason, "has space", "reason"),
    (Field::EventAction, "", "action"),
    (Field::EventAction, "Create\n", "action"),
    (Field::EventUid, "u/1", "uid"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_of_the_shared_table_is_refused_naming_its_field() {
        for (field, value, what) in BAD_INPUTS {
            let r = match field {
                Field::Namespace => namespace(value),
                Field::Name => name(value),
                Field::Group => kind(value, "v1", "Foo"),
                Field::Version => kind("", value, "Foo"),
                Field::Kind => kind("", "v1", value),
                Field::LabelSelector => label_selector(value),
                Field::FieldSelector => field_selector(value),
                Field::FieldManagerSuffix => field_manager_suffix(value),
                Field::EventReason => event_word("reason", value),
                Field::EventAction => event_word("action", value),
                Field::EventUid => uid(value),
            };
            let e = r.expect_err(&format!("{field:?} {value:?} passed"));
            assert_eq!(e.what, *what, "{field:?} {value:?}");
        }
    }
}
