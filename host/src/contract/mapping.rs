//! Mappings beyond the three of `wcm:reconciler@0.1.0` (controller owner, fixed key, same key).
//!
//! Declared in the description's `extensions` under [`EXTENSION`], one entry per secondary watch
//! (`null` keeps the watch's own mapping), so plugins built against 0.1.0 can declare them:
//!
//! ```json
//! {"secondaries": [null, "any-owner", {"label": "app.kubernetes.io/instance"}]}
//! ```
//!
//! - `any-owner`: every owner reference to the primary kind, not only the controller one (a
//!   ConfigMap shared by two Deployments wakes both), as controller-runtime's
//!   `EnqueueRequestForOwner` without `OnlyControllerOwner`.
//! - `{"label": KEY}`: the value of the object's label `KEY` names the primary object (in the
//!   object's namespace, for a namespaced primary); an object without the label, or whose value is
//!   not a valid name, maps to nothing. Like a `MapFunc` that reads a label.
//!
//! The plugin's own mapping stays in the 0.1 field as the fallback of a host that predates this
//! extension (the SDK puts the controller owner there for `any-owner`).

use serde::Deserialize;

use super::{Description, validate};

/// The extension key.
pub const EXTENSION: &str = "mappings";

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExtraMapping {
    AnyOwner,
    Label(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Declared {
    #[serde(default)]
    secondaries: Vec<Option<ExtraMapping>>,
}

/// The extended mapping of each secondary watch, in order (`None`: its own 0.1 mapping).
pub fn mappings(d: &Description) -> Result<Vec<Option<ExtraMapping>>, String> {
    let declared: Declared = super::extension(
        d,
        EXTENSION,
        r#"{"secondaries": [null | "any-owner" | {"label": KEY}, ...]}"#,
        |x: &Declared| x.secondaries.len(),
    )?;
    for m in declared.secondaries.iter().flatten() {
        if let ExtraMapping::Label(key) = m {
            validate::label_key(key).map_err(|e| format!("extension {EXTENSION}: {e}"))?;
        }
    }
    let mut out = declared.secondaries;
    out.resize(d.secondaries.len(), None);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn description(ext: Option<&str>, secondaries: usize) -> Description {
        crate::contract::test_description(EXTENSION, ext, secondaries)
    }

    #[test]
    fn each_secondary_gets_its_declared_mapping_or_its_own() {
        let d = description(
            Some(r#"{"secondaries": [null, "any-owner", {"label": "example.com/owner"}]}"#),
            4,
        );
        assert_eq!(
            mappings(&d),
            Ok(vec![
                None,
                Some(ExtraMapping::AnyOwner),
                Some(ExtraMapping::Label("example.com/owner".into())),
                None
            ])
        );
        assert_eq!(mappings(&description(None, 2)), Ok(vec![None, None]));
    }

    #[test]
    fn bad_declarations_are_refused_with_the_reason() {
        for (ext, want) in [
            (r#"{"secondaries": ["sideways"]}"#, "unknown variant"),
            (
                r#"{"secondaries": [null, null]}"#,
                "2 entries for 1 secondaries",
            ),
            (r#"{"secondaries": [{"label": "a b"}]}"#, "label key"),
            (r#"{"secondaries": [{"label": ""}]}"#, "label key"),
            (r#"{"others": []}"#, "unknown field"),
        ] {
            let err = mappings(&description(Some(ext), 1)).expect_err(ext);
            assert!(err.contains(want), "{ext}: {err}");
        }
    }
}
