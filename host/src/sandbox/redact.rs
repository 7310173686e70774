//! What keeps secrets out of a recording: every known form of a secret value (raw, JSON-escaped,
//! base64, hex, percent-encoded) replaced by a placeholder, and the credentials an HTTP exchange
//! carries (credential headers, JSON and form fields named like credentials) found so that they are
//! replaced the same way wherever they occur.
//!
//! A placeholder names the secret setting (`redacted-secret-NAME`) or numbers a credential found in
//! the exchange (`redacted-credential-N`): it is made from no part of the value, so it gives nothing
//! away, however short or guessable the value.

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::Value;

/// Secret values shorter than this (in characters) cannot be searched for without hitting unrelated
/// text: a plugin that holds one is not recorded at all.
pub const MIN_SECRET_CHARS: usize = 4;

/// Most credentials collected from one recording's exchanges; past it the recording is refused.
pub const MAX_FOUND: usize = 256;

/// Longest credential searched for (a JWT or a cloud session token fits); a longer one refuses the
/// recording: its forms would make the matcher large, and it cannot be left raw either.
pub const MAX_CREDENTIAL_BYTES: usize = 8 << 10;

/// Most bytes of patterns (every form of every value) one matcher is built from; past it the
/// recording is refused. Bounds the matcher's memory (a contiguous NFA, about linear in this).
const MAX_PATTERN_BYTES: usize = 2 << 20;

/// Most matches one string may hold (overlapping ones counted each); past it the recording is
/// refused rather than searched without bound.
const MAX_MATCHES_PER_STRING: usize = 1 << 20;

/// What a replay hands the plugin in place of its secret setting `name`, and what stands for that
/// value wherever a recording would have held it.
pub fn secret_placeholder(name: &str) -> String {
    let safe: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("redacted-secret-{safe}")
}

fn credential_placeholder(n: usize) -> String {
    format!("redacted-credential-{n}")
}

/// Why a recording cannot be made safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsafe {
    #[error(
        "a secret value is shorter than {MIN_SECRET_CHARS} characters, too short to find reliably"
    )]
    TooShort,
    #[error("more than {MAX_FOUND} credentials in its HTTP exchanges")]
    TooManyCredentials,
    #[error("a credential in its HTTP exchanges is longer than {MAX_CREDENTIAL_BYTES} bytes")]
    CredentialTooLong,
    #[error("its redacted form would exceed the recording's size bound")]
    TooLarge,
    #[error("recordings are being redacted faster than they are written (some are skipped)")]
    Busy,
}

/// The forms of a value that a recording is searched for: the value, its JSON-escaped forms (as
/// serde and as Python's `json.dumps` write it, and escaped twice, for JSON inside a JSON string),
/// and for each of these its lowercase and uppercase hex, its percent-encodings (reserved bytes
/// only or every byte, either case, `+` for space as forms do) and base64 (standard and URL-safe,
/// with and without padding, and the part of it that is the same at any of the three byte
/// alignments, so the value is found inside the base64 of a longer text too).
pub fn forms(value: &str) -> Vec<String> {
    let mut texts = vec![value.to_string()];
    let once = json_escaped(value, false);
    texts.push(json_escaped(&once, false));
    texts.push(json_escaped(value, true));
    texts.push(once);
    texts.sort();
    texts.dedup();
    let mut out = Vec::new();
    for t in &texts {
        let b = t.as_bytes();
        out.push(t.clone());
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        out.push(hex.to_ascii_uppercase());
        out.push(hex);
        for upper in [true, false] {
            out.push(percent(b, upper, false, false));
            out.push(percent(b, upper, true, false));
            out.push(percent(b, upper, false, true));
        }
        for engine in [&STANDARD, &URL_SAFE] {
            out.push(engine.encode(b));
        }
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            // The part of base64(prefix + value) that only the value decides, for a prefix of
            // 0, 1 or 2 bytes (mod 3): char i covers bits 6i..6i+6 of the input.
            for k in 0..3usize {
                let mut input = vec![0u8; k];
                input.extend_from_slice(b);
                let enc = engine.encode(&input);
                let start = (8 * k).div_ceil(6);
                let end = 8 * (k + b.len()) / 6;
                if let Some(core) = enc.get(start..end) {
                    out.push(core.to_string());
                }
            }
            out.push(engine.encode(b));
        }
    }
    out.retain(|f| !f.is_empty());
    out.sort();
    out.dedup();
    out
}

/// A string's text between the quotes of its JSON form; `ascii` escapes every non-ASCII character
/// as `\uXXXX` (Python's default).
fn json_escaped(s: &str, ascii: bool) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    let inner = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default();
    if !ascii {
        return inner.to_string();
    }
    let mut out = String::with_capacity(inner.len());
    for c in inner.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// Percent-encoding: of every byte but RFC 3986's unreserved ones (or of every byte), hex digits in
/// either case, and optionally `+` for a space (HTML forms).
fn percent(b: &[u8], upper: bool, plus: bool, every: bool) -> String {
    let mut out = String::with_capacity(b.len() * 3);
    for &x in b {
        if plus && x == b' ' {
            out.push('+');
        } else if !every && (x.is_ascii_alphanumeric() || b"-._~".contains(&x)) {
            out.push(char::from(x));
        } else if upper {
            out.push_str(&format!("%{x:02X}"));
        } else {
            out.push_str(&format!("%{x:02x}"));
        }
    }
    out
}

/// Replaces every form of a set of values with their placeholders.
pub struct Redactor {
    ac: Option<AhoCorasick>,
    /// The placeholder of each pattern, and whether it stands for a secret setting (which wins
    /// over a credential where their matches overlap).
    placeholders: Vec<(String, bool)>,
    /// Bytes the replacements may add before the recording is refused.
    growth_left: usize,
}

impl Redactor {
    /// `secrets`: (setting name, value) of the plugin's secret settings; `found`: credentials
    /// collected from its exchanges. Empty values are nothing to hide; a value shorter than
    /// [`MIN_SECRET_CHARS`] refuses the recording. `max_growth`: bytes the placeholders may add.
    pub fn new<'a>(
        secrets: impl Iterator<Item = (&'a str, &'a str)>,
        found: &[String],
        max_growth: usize,
    ) -> Result<Redactor, Unsafe> {
        let mut values: Vec<(String, String, bool)> = Vec::new();
        for (name, value) in secrets {
            values.push((value.to_string(), secret_placeholder(name), true));
        }
        for (i, value) in found.iter().enumerate() {
            if value.len() > MAX_CREDENTIAL_BYTES {
                return Err(Unsafe::CredentialTooLong);
            }
            if !values.iter().any(|(v, _, _)| v == value) {
                values.push((value.clone(), credential_placeholder(i + 1), false));
            }
        }
        values.retain(|(v, _, _)| !v.is_empty());
        if values
            .iter()
            .any(|(v, _, _)| v.chars().count() < MIN_SECRET_CHARS)
        {
            return Err(Unsafe::TooShort);
        }
        let mut patterns = Vec::new();
        let mut placeholders = Vec::new();
        let mut pattern_bytes = 0usize;
        for (value, placeholder, secret) in &values {
            for f in forms(value) {
                pattern_bytes += f.len();
                if pattern_bytes > MAX_PATTERN_BYTES {
                    return Err(Unsafe::TooLarge);
                }
                patterns.push(f);
                placeholders.push((placeholder.clone(), *secret));
            }
        }
        let ac = if patterns.is_empty() {
            None
        } else {
            // Every match, overlapping ones included (scrub merges them): with leftmost matching
            // a planted credential that starts just before a secret would hide its first bytes
            // and leave the rest unmatched. A contiguous NFA: memory about linear in the patterns,
            // never the DFA's states × alphabet.
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .kind(Some(AhoCorasickKind::ContiguousNFA))
                    .build(&patterns)
                    .map_err(|_| Unsafe::TooLarge)?,
            )
        };
        Ok(Redactor {
            ac,
            placeholders,
            growth_left: max_growth,
        })
    }

    /// The string with every form replaced, or `None` when there was none. Overlapping matches
    /// are merged into one span, replaced by one placeholder (a secret's, if any
    /// of them is a secret's), so no match can shield part of another.
    pub fn scrub(&mut self, s: &str) -> Result<Option<String>, Unsafe> {
        let Some(ac) = &self.ac else {
            return Ok(None);
        };
        if !ac.is_match(s) {
            return Ok(None);
        }
        let mut matches: Vec<(usize, usize, usize)> = Vec::new();
        let iter = ac
            .try_find_overlapping_iter(s)
            .map_err(|_| Unsafe::TooLarge)?;
        for m in iter {
            if matches.len() >= MAX_MATCHES_PER_STRING {
                return Err(Unsafe::TooLarge);
            }
            matches.push((m.start(), m.end(), m.pattern().as_usize()));
        }
        matches.sort_unstable();
        // Merged spans: (start, end, placeholder index).
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        for (start, end, p) in matches {
            match spans.last_mut() {
                Some(last) if start < last.1 => {
                    last.1 = last.1.max(end);
                    if self.placeholders[p].1 && !self.placeholders[last.2].1 {
                        last.2 = p;
                    }
                }
                _ => spans.push((start, end, p)),
            }
        }
        let mut out = String::with_capacity(s.len());
        let mut at = 0;
        for (start, end, p) in spans {
            let placeholder = &self.placeholders[p].0;
            let grows = placeholder.len().saturating_sub(end - start);
            if grows > self.growth_left {
                return Err(Unsafe::TooLarge);
            }
            self.growth_left -= grows;
            // Match bounds are byte offsets of whole patterns; a span may still split a
            // character where patterns of different values meet: never slice inside one.
            let (Some(before), Some(_)) = (s.get(at..start), s.get(start..end)) else {
                return Err(Unsafe::TooLarge);
            };
            out.push_str(before);
            out.push_str(placeholder);
            at = end;
        }
        out.push_str(s.get(at..).unwrap_or_default());
        Ok(Some(out))
    }

    /// Scrubs every string of a JSON value, object keys included.
    pub fn scrub_value(&mut self, v: &mut Value) -> Result<(), Unsafe> {
        match v {
            Value::String(s) => {
                if let Some(clean) = self.scrub(s)? {
                    *s = clean;
                }
            }
            Value::Array(a) => {
                for x in a {
                    self.scrub_value(x)?;
                }
            }
            Value::Object(o) => {
                let mut renamed = Vec::new();
                for (k, x) in o.iter_mut() {
                    self.scrub_value(x)?;
                    if let Some(clean) = self.scrub(k)? {
                        renamed.push((k.clone(), clean));
                    }
                }
                for (old, new) in renamed {
                    if let Some(x) = o.remove(&old) {
                        o.insert(new, x);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Whether a field or parameter name denotes a credential (`token`, `access_token`, `id_token`,
/// `X-Subject-Token`, `password`, `client_secret`, `api_key`, …), whatever its case and separators.
pub fn is_credential_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    [
        "token",
        "password",
        "passwd",
        "passphrase",
        "secret",
        "apikey",
        "privatekey",
    ]
    .iter()
    .any(|s| n.ends_with(s))
        || n == "authorization"
}

/// Collects credentials into `found` (without duplicates, at most [`MAX_FOUND`]).
#[derive(Debug, Default)]
pub struct Credentials {
    pub found: Vec<String>,
    pub too_many: bool,
}

/// Headers whose values are credentials, besides any named like one ([`is_credential_name`]:
/// `X-Vault-Token`, `X-API-Key`, `PRIVATE-TOKEN`, ...).
pub fn is_credential_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || is_credential_name(&n)
}

impl Credentials {
    fn add(&mut self, value: &str) {
        let value = value.trim();
        if value.is_empty() || self.found.iter().any(|f| f == value) {
            return;
        }
        if self.found.len() >= MAX_FOUND {
            self.too_many = true;
            return;
        }
        self.found.push(value.to_string());
    }

    /// The value of credential header `name` (`Authorization: Basic …`, `X-Subject-Token`, a
    /// cookie): the whole value; for authorization headers the part after the scheme, and for
    /// Basic the decoded user:password and the password alone; for `Cookie` each pair's value, for
    /// `Set-Cookie` its first pair's (the rest are attributes: `Path=/`, `SameSite=Lax`).
    pub fn header(&mut self, name: &str, value: &str) {
        self.add(value);
        let name = name.to_ascii_lowercase();
        if name == "cookie" || name == "set-cookie" {
            for pair in value.split(';') {
                if let Some((_, v)) = pair.split_once('=') {
                    self.add(v);
                }
                if name == "set-cookie" {
                    break;
                }
            }
            return;
        }
        if let Some((scheme, rest)) = value.trim().split_once(' ') {
            self.add(rest);
            if scheme.eq_ignore_ascii_case("basic")
                && let Ok(decoded) = STANDARD.decode(rest.trim())
                && let Ok(text) = String::from_utf8(decoded)
            {
                self.add(&text);
                if let Some((_, password)) = text.split_once(':') {
                    self.add(password);
                }
            }
        }
    }

    /// Credentials in a text: the string fields named like credentials of a JSON document, or the
    /// parameters named so of a form-encoded body or a query string.
    pub fn text(&mut self, s: &str) {
        let t = s.trim_start();
        if t.starts_with('{') || t.starts_with('[') {
            if let Ok(v) = serde_json::from_str::<Value>(t) {
                self.json(&v, false);
            }
            return;
        }
        let query = s.split_once('?').map_or(s, |(_, q)| q);
        if query.contains('=') && !query.contains(char::is_whitespace) {
            for pair in query.split('&') {
                if let Some((k, v)) = pair.split_once('=')
                    && is_credential_name(&percent_decode(k))
                {
                    self.add(&percent_decode(v));
                }
            }
        }
    }

    fn json(&mut self, v: &Value, named: bool) {
        match v {
            Value::String(s) if named => self.add(s),
            Value::Array(a) => a.iter().for_each(|x| self.json(x, named)),
            Value::Object(o) => {
                for (k, x) in o {
                    self.json(x, is_credential_name(k));
                }
            }
            _ => {}
        }
    }

    /// Every string in a recorded exchange that holds a JSON document or a query.
    pub fn value(&mut self, v: &Value) {
        match v {
            Value::String(s) => self.text(s),
            Value::Array(a) => a.iter().for_each(|x| self.value(x)),
            Value::Object(o) => o.values().for_each(|x| self.value(x)),
            _ => {}
        }
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (x, _) => out.push(x),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Each way a value may be written, as a plugin or a library would write it.
    fn encodings(v: &str) -> Vec<(&'static str, String)> {
        let b = v.as_bytes();
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        vec![
            ("raw", v.to_string()),
            ("json", json_escaped(v, false)),
            ("json twice", json_escaped(&json_escaped(v, false), false)),
            ("json ascii", json_escaped(v, true)),
            ("base64", STANDARD.encode(b)),
            ("base64 no pad", STANDARD_NO_PAD.encode(b)),
            ("base64url", URL_SAFE.encode(b)),
            ("base64url no pad", URL_SAFE_NO_PAD.encode(b)),
            ("hex", hex.clone()),
            ("HEX", hex.to_ascii_uppercase()),
            ("percent", percent(b, true, false, false)),
            ("percent lower", percent(b, false, false, false)),
            ("form", percent(b, true, true, false)),
            ("percent every byte", percent(b, true, false, true)),
        ]
    }

    fn scrubbed(r: &mut Redactor, s: &str) -> String {
        r.scrub(s)
            .expect("in bounds")
            .unwrap_or_else(|| s.to_string())
    }

    #[test]
    fn every_form_of_every_value_is_replaced() {
        let secrets = [
            ("quote", "pa\"ss\\word42"),
            ("four", "Zq~7"),
            ("unicode", "mot de passe é ✓"),
            ("plain", "hunter2hunter2"),
        ];
        let mut r = Redactor::new(secrets.iter().copied(), &[], usize::MAX).expect("redactor");
        for (name, value) in secrets {
            for (how, form) in encodings(value) {
                let text = format!("before {form} after");
                let out = scrubbed(&mut r, &text);
                assert!(!out.contains(&form), "{name} {how}: {out}");
                assert!(
                    out.contains(&secret_placeholder(name)),
                    "{name} {how}: {out}"
                );
                assert!(
                    out.starts_with("before ") && out.ends_with(" after"),
                    "{out}"
                );
            }
        }
    }

    #[test]
    fn a_value_inside_the_base64_of_a_longer_text_is_replaced() {
        let value = "pa\"ss\\word42";
        let mut r = Redactor::new([("pw", value)].into_iter(), &[], usize::MAX).expect("r");
        for prefix in ["", "u:", "us:", "use:", "{\"password\":\""] {
            for engine in [&STANDARD, &URL_SAFE_NO_PAD] {
                let whole = engine.encode(format!("{prefix}{value}-and-more"));
                let out = scrubbed(&mut r, &whole);
                // The characters of the encoding that only the value decides.
                let (p, n) = (prefix.len(), value.len());
                let only_value = &whole[(8 * p).div_ceil(6)..8 * (p + n) / 6];
                assert!(!out.contains(only_value), "{prefix:?}: {out}");
                assert!(out.contains(&secret_placeholder("pw")), "{prefix:?}: {out}");
            }
        }
    }

    #[test]
    fn short_values_refuse_and_empty_values_are_ignored() {
        assert!(matches!(
            Redactor::new([("pin", "123")].into_iter(), &[], usize::MAX),
            Err(Unsafe::TooShort)
        ));
        assert!(Redactor::new([("x", "")].into_iter(), &[], usize::MAX).is_ok());
        // Four characters are found.
        assert!(Redactor::new([("pin", "1234")].into_iter(), &[], usize::MAX).is_ok());
    }

    #[test]
    fn growth_past_the_bound_refuses_rather_than_leaving_a_value() {
        let mut r = Redactor::new([("k", "k3y9")].into_iter(), &[], 1000).expect("r");
        let text = "k3y9".repeat(10_000);
        assert_eq!(r.scrub(&text), Err(Unsafe::TooLarge));
    }

    #[test]
    fn object_keys_and_nested_strings_are_scrubbed() {
        let mut r = Redactor::new([("k", "s3cr3tval")].into_iter(), &[], usize::MAX).expect("r");
        let mut v = json!({"s3cr3tval": ["x s3cr3tval", {"y": "czNjcjN0dmFs"}]});
        r.scrub_value(&mut v).expect("scrub");
        let text = v.to_string();
        assert!(
            !text.contains("s3cr3tval") && !text.contains("czNjcjN0dmFs"),
            "{text}"
        );
    }

    #[test]
    fn credential_names_are_recognised_and_collected() {
        for n in [
            "token",
            "access_token",
            "id_token",
            "refresh_token",
            "X-Subject-Token",
            "password",
            "Password",
            "client_secret",
            "api_key",
            "apiKey",
            "private_key",
            "authorization",
        ] {
            assert!(is_credential_name(n), "{n}");
        }
        for n in [
            "token_type",
            "expires_at",
            "methods",
            "id",
            "name",
            "password_expires_at",
        ] {
            assert!(!is_credential_name(n), "{n}");
        }
        let mut c = Credentials::default();
        c.text(r#"{"token": {"methods": ["password"], "id": "abcd"}, "access_token": "at-1", "nested": [{"password": "pw-2"}]}"#);
        c.text("grant_type=refresh_token&refresh_token=rt%2B3&scope=a+b");
        c.text("/v3/auth?api_key=k-4&x=1");
        c.header("Authorization", "Basic dXNlcjpwdy01");
        assert_eq!(
            c.found,
            [
                "at-1",
                "pw-2",
                "rt+3",
                "k-4",
                "Basic dXNlcjpwdy01",
                "dXNlcjpwdy01",
                "user:pw-5",
                "pw-5"
            ]
        );
    }

    #[test]
    fn header_values_yield_credentials_and_never_their_syntax() {
        let mut c = Credentials::default();
        // Padding is base64, not a cookie: "=" is no credential (it would refuse the recording).
        c.header("authorization", "Basic dXNlcjpwYXNzd29yZA==");
        c.header(
            "set-cookie",
            "sid=abcdef123; Path=/; SameSite=Lax; Domain=example.com",
        );
        c.header("cookie", "a=first-value; b=second-value");
        for junk in ["=", "/", "Lax", "example.com", "="] {
            assert!(!c.found.iter().any(|f| f == junk), "{junk}: {:?}", c.found);
        }
        for want in [
            "user:password",
            "password",
            "abcdef123",
            "first-value",
            "second-value",
        ] {
            assert!(c.found.iter().any(|f| f == want), "{want}: {:?}", c.found);
        }
        for h in [
            "X-Vault-Token",
            "x-api-key",
            "PRIVATE-TOKEN",
            "X-Amz-Security-Token",
            "Cookie",
        ] {
            assert!(is_credential_header(h), "{h}");
        }
        assert!(!is_credential_header("content-type"));
    }

    #[test]
    fn a_planted_credential_overlapping_a_secret_does_not_shield_any_of_it() {
        // Someone who can put credential-named fields in what the plugin reads plants "context +
        // a guessed first character": with leftmost matching it would take the secret's first
        // character and leave the rest of it unmatched.
        let secret = "pa\"ss\\word42";
        let body = format!(
            r#"{{"auth":{{"password":"{}"}}}}"#,
            json_escaped(secret, false)
        );
        let planted: Vec<String> = ["d\":\"p", "d\":\"q", "\":\"pa"]
            .iter()
            .map(|p| p.to_string())
            .collect();
        let mut r = Redactor::new([("pw", secret)].into_iter(), &planted, 1 << 20).expect("safe");
        let out = r.scrub(&body).expect("bounded").expect("matched");
        for part in ["word42", "\\\"ss", "a\\"] {
            assert!(!out.contains(part), "{part} left in {out}");
        }
        assert!(
            out.contains("redacted-secret-pw"),
            "the secret's placeholder wins: {out}"
        );
    }

    #[test]
    fn a_credential_too_long_to_search_refuses_the_recording() {
        let long = "t".repeat(MAX_CREDENTIAL_BYTES + 1);
        assert_eq!(
            Redactor::new(std::iter::empty(), &[long], 1 << 20).err(),
            Some(Unsafe::CredentialTooLong)
        );
        // Many long-but-allowed credentials: refused by the pattern bound, not built.
        let many: Vec<String> = (0..256)
            .map(|i| format!("{i:04}{}", "x".repeat(MAX_CREDENTIAL_BYTES - 8)))
            .collect();
        assert_eq!(
            Redactor::new(std::iter::empty(), &many, 1 << 20).err(),
            Some(Unsafe::TooLarge)
        );
    }
}
