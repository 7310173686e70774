//! Label selectors for MockHost: the host's own parser and matcher (crate `wcm-selector`), applied
//! to an object's `metadata` as JSON, so offline tests select exactly what the host selects.

use serde_json::Value;

pub(crate) struct Selector(wcm_selector::Selector);

impl Selector {
    pub(crate) fn parse(text: &str) -> Result<Selector, String> {
        wcm_selector::Selector::parse(text).map(Selector)
    }

    pub(crate) fn matches(&self, metadata: &Value) -> bool {
        self.0.matches_with(|k| {
            metadata
                .get("labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors() {
        let meta = json!({"labels": {"app": "web", "tier": "front", "node-role.kubernetes.io/control-plane": ""}});
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("node-role.kubernetes.io/control-plane", true),
            ("!node-role.kubernetes.io/master", true),
            ("node-role.kubernetes.io/master", false),
        ] {
            let s = Selector::parse(sel).expect(sel);
            assert_eq!(s.matches(&meta), want, "{sel}");
        }
        assert!(Selector::parse("a in x").is_err());
        assert!(Selector::parse("=x").is_err());
    }
}
