//! Label selectors in the API server's syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
//! `a notin (x)`, `a`, `!a`, joined by commas.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Selector(Vec<Requirement>);

impl Selector {
    pub(crate) fn parse(text: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        let mut depth = 0i32;
        let mut start = 0;
        let mut parts = Vec::new();
        for (i, c) in text.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&text[start..]);
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            reqs.push(requirement(part).ok_or_else(|| {
                format!("invalid label selector requirement {part:?} in {text:?}")
            })?);
        }
        Ok(Selector(reqs))
    }

    /// Whether the labels of `metadata` (an object's `metadata` JSON) match.
    pub(crate) fn matches(&self, metadata: &Value) -> bool {
        let label = |k: &str| {
            metadata
                .get("labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => label(k) == Some(v),
            Requirement::NotEq(k, v) => label(k) != Some(v),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

fn requirement(part: &str) -> Option<Requirement> {
    let valid_key =
        |k: &str| !k.is_empty() && !k.contains(|c: char| c.is_whitespace() || "=!(),".contains(c));
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key).then(|| Requirement::NotExists(key.to_string()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return valid_key(k.trim())
            .then(|| Requirement::NotEq(k.trim().to_string(), v.trim().to_string()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return valid_key(k.trim())
            .then(|| Requirement::Eq(k.trim().to_string(), v.trim().to_string()));
    }
    let set = |rest: &str| -> Option<Vec<String>> {
        let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
        Some(
            inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect(),
        )
    };
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    match words.next().map(str::trim) {
        None => valid_key(key).then(|| Requirement::Exists(key.to_string())),
        Some(rest) => {
            if let Some(values) = rest.strip_prefix("notin").and_then(set) {
                valid_key(key).then(|| Requirement::NotIn(key.to_string(), values))
            } else if let Some(values) = rest.strip_prefix("in").and_then(set) {
                valid_key(key).then(|| Requirement::In(key.to_string(), values))
            } else {
                None
            }
        }
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
