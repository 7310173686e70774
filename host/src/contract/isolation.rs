//! How calls of one plugin are isolated from each other, and the default a plugin may declare
//! for itself (extension `isolation`, `"call"` or `"worker"`). The operator's `isolation` in
//! NAME.toml wins over it.
//!
//! A plugin whose runtime is costly to start (CPython in a component: milliseconds per fresh
//! instance, microseconds warm) and which keeps no state between keys declares `"worker"`; the
//! isolation between plugins is the same in both modes.

use serde::Deserialize;

use super::Description;

/// The extension key.
pub const EXTENSION: &str = "isolation";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// A fresh instance for every reconcile: nothing carries over between keys.
    #[default]
    Call,
    /// One warm instance per worker, replaced after any failure and every 10,000 calls.
    Worker,
}

/// The isolation the plugin declares for itself, if any.
pub fn declared(d: &Description) -> Result<Option<Isolation>, String> {
    super::extension::<Option<Isolation>>(d, EXTENSION, r#""call" | "worker""#, |_| 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_may_declare_its_isolation() {
        let d = |v| super::super::test_description(EXTENSION, v, 0);
        assert_eq!(declared(&d(None)), Ok(None));
        assert_eq!(
            declared(&d(Some(r#""worker""#))),
            Ok(Some(Isolation::Worker))
        );
        assert_eq!(declared(&d(Some(r#""call""#))), Ok(Some(Isolation::Call)));
        let bad = declared(&d(Some(r#""shared""#))).unwrap_err();
        assert!(bad.contains("isolation"), "{bad}");
    }
}
