//! The name rules the shared decisions need: the host's own checks (`wcm-validate`), as yes/no.

pub use wcm_validate::shown;

/// A DNS-1123 label: at most 63 lowercase letters, digits and '-', alphanumeric at both ends.
pub fn dns_label(s: &str) -> bool {
    wcm_validate::dns_label(s).is_ok()
}

/// An object name as it may stand in a request path: 1–253 of letters, digits and `-._:`, not
/// `.` or `..`.
pub fn object_name(s: &str) -> bool {
    wcm_validate::name(s).is_ok()
}

/// A kind: group a DNS-1123 subdomain or "" (core), version a DNS-1123 label, kind letters and
/// digits starting with a letter, at most 63.
pub fn kind(group: &str, version: &str, kind: &str) -> bool {
    wcm_validate::kind(group, version, kind).is_ok()
}

/// A UID as the API server makes them: letters, digits and '-', at most 128.
pub fn uid(s: &str) -> bool {
    wcm_validate::uid(s).is_ok()
}
