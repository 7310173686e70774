//! Change filters: which updates of a watched object wake the plugin.
//!
//! Declared in the description's `extensions` under [`EXTENSION`] (so plugins built against
//! `wcm:reconciler@0.1.0` can declare them, and a host that predates them ignores them):
//!
//! ```json
//! {"primary": "ignore-status", "secondaries": [null, "generation"]}
//! ```
//!
//! What `ignore-status` and `generation` let through is decided in the `wcm-change-filter` crate,
//! which the SDK's `MockHost` shares, so a plugin's unit test sees what the host does.
//!
//! Creations, deletions and resyncs always pass; an object changed while a watch was down arrives
//! as an update after the relist and is filtered like any other update.

use serde::Deserialize;
pub use wcm_change_filter::ChangeFilter;

use super::Description;

/// The extension key.
pub const EXTENSION: &str = "change-filters";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Declared {
    #[serde(default)]
    primary: Option<ChangeFilter>,
    #[serde(default)]
    secondaries: Vec<Option<ChangeFilter>>,
}

/// The filter of each watch, the primary first and then each secondary in order.
pub fn filters(d: &Description) -> Result<Vec<ChangeFilter>, String> {
    let declared: Declared = super::extension(
        d,
        EXTENSION,
        r#"{"primary": "ignore-status"|"generation"|"all", "secondaries": [...]}"#,
        |x: &Declared| x.secondaries.len(),
    )?;
    let mut out = vec![declared.primary.unwrap_or_default()];
    for i in 0..d.secondaries.len() {
        out.push(
            declared
                .secondaries
                .get(i)
                .copied()
                .flatten()
                .unwrap_or_default(),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn description(ext: Option<&str>, secondaries: usize) -> Description {
        crate::contract::test_description(EXTENSION, ext, secondaries)
    }

    #[test]
    fn declarations_are_parsed_and_checked() {
        assert_eq!(
            filters(&description(None, 1)),
            Ok(vec![ChangeFilter::All, ChangeFilter::All])
        );
        assert_eq!(
            filters(&description(
                Some(r#"{"primary":"ignore-status","secondaries":[null,"generation"]}"#),
                2
            )),
            Ok(vec![
                ChangeFilter::IgnoreStatus,
                ChangeFilter::All,
                ChangeFilter::Generation
            ])
        );
        let bad = filters(&description(Some(r#"{"primary":"spec-only"}"#), 0)).unwrap_err();
        assert!(
            bad.contains("spec-only") || bad.contains("unknown variant"),
            "{bad}"
        );
        assert!(filters(&description(Some(r#"{"secondaries":["generation"]}"#), 0)).is_err());
        assert!(filters(&description(Some(r#"{"primry":"generation"}"#), 0)).is_err());
    }
}
