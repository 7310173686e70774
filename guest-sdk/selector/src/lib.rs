//! Label selectors in the API server's syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
//! `a notin (x)`, `a`, `!a`, joined by commas.
//!
//! One implementation for the host's cache reads and the SDK's in-memory test host, so a plugin
//! tested offline selects exactly what it will select when it runs.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selector {
    reqs: Vec<Req>,
}

impl Selector {
    /// Parses a selector; the error names the requirement that is not valid.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            reqs.push(parse_req(part).ok_or_else(|| {
                format!("invalid label selector requirement {part:?} in {text:?}")
            })?);
        }
        Ok(Selector { reqs })
    }

    /// Whether a label map matches.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    /// Whether the labels that `label` looks up match (for label sets held in other forms).
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v.as_str()),
            Req::NotEq(k, v) => label(k) != Some(v.as_str()),
            Req::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
        })
    }
}

/// Splits a selector's text on the commas that are not inside parentheses (its requirements).
pub fn split_top_level(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// A label value as the API server accepts it: empty, or at most 63 characters from letters,
/// digits and `-_.`, starting and ending with a letter or digit.
fn valid_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn value(v: &str) -> Option<String> {
    let v = v.trim();
    valid_value(v).then(|| v.to_string())
}

fn set(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    inner.split(',').map(value).collect()
}

fn parse_req(part: &str) -> Option<Req> {
    if let Some(k) = part.strip_prefix('!') {
        let k = k.trim();
        return valid_key(k).then(|| Req::NotExists(k.to_string()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        let k = k.trim();
        return valid_key(k)
            .then_some(())
            .and(value(v))
            .map(|v| Req::NotEq(k.to_string(), v));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        let k = k.trim();
        return valid_key(k)
            .then_some(())
            .and(value(v))
            .map(|v| Req::Eq(k.to_string(), v));
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    match words.as_slice() {
        [k] if valid_key(k) => Some(Req::Exists(k.to_string())),
        [k, rest] if valid_key(k) => {
            let rest = rest.trim();
            if let Some(s) = rest.strip_prefix("notin") {
                Some(Req::NotIn(k.to_string(), set(s)?))
            } else if let Some(s) = rest.strip_prefix("in") {
                Some(Req::In(k.to_string(), set(s)?))
            } else {
                None
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_operator() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("node-role.kubernetes.io/control-plane", ""),
        ]);
        let m = |s: &str| Selector::parse(s).expect("valid").matches(&l);
        assert!(m(""));
        assert!(m("app=web") && m("app==web") && !m("app=db"));
        assert!(m("app!=db") && !m("app!=web") && m("missing!=x"));
        assert!(m("app in (web, db)") && !m("app in (db)"));
        assert!(m("app notin (db)") && !m("app notin (web,db)") && m("missing notin (x)"));
        assert!(
            m("node-role.kubernetes.io/control-plane")
                && !m("!node-role.kubernetes.io/control-plane")
        );
        assert!(m("app=web,tier in (front,back),!missing"));
        assert!(!m("app=web,tier=back"));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Selector::parse("app in web").is_err());
        assert!(Selector::parse("a b c").is_err());
        assert!(Selector::parse("=x").is_err());
        assert!(Selector::parse("app=web&watch=true").is_err());
        assert!(Selector::parse("app in (web,a b)").is_err());
        assert!(Selector::parse("app!=-x").is_err());
        assert!(Selector::parse("app=").is_ok(), "an empty value is a value");
    }
}
