//! The few Kubernetes name rules the shared decisions need (the host's full set is in its
//! `contract::validate`, which agrees with these).

/// A value as it may appear in an error: escaped and at most 80 characters, quoted.
pub fn shown(s: &str) -> String {
    let mut out = s
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

/// A DNS-1123 label: at most 63 lowercase letters, digits and '-', alphanumeric at both ends.
pub fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253.
pub fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

/// An object name as it may stand in a request path: 1–253 of letters, digits and `-._:`, not
/// `.` or `..`.
pub fn object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'))
}

/// A kind: group a DNS-1123 subdomain or "" (core), version a DNS-1123 label, kind letters and
/// digits starting with a letter, at most 63.
pub fn kind(group: &str, version: &str, kind: &str) -> bool {
    (group.is_empty() || dns_subdomain(group))
        && dns_label(version)
        && !kind.is_empty()
        && kind.len() <= 63
        && kind.starts_with(|c: char| c.is_ascii_alphabetic())
        && kind.chars().all(|c| c.is_ascii_alphanumeric())
}

/// A UID as the API server makes them: letters, digits and '-', at most 128.
pub fn uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}
