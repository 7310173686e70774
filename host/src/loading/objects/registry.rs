//! A client of the OCI distribution API with just what Plugin objects need: a manifest and a blob
//! (by digest, or a tag's manifest for a cosign signature), basic or token authentication, and the
//! two uploads of the `push` subcommand.
//!
//! Written here rather than taken from oci-client (see `docs/decisions.md`) because a registry is
//! hostile until proven otherwise: every answer is read with a cap before it is in memory (oci-client
//! reads manifests, token answers and error bodies whole), a token is asked for only at a realm on a
//! registry of `--plugin-registry` over https, credentials and tokens live for one session (one
//! fetch of one Plugin: nothing one pull Secret gave is used for another), and a redirect is followed
//! only to a registry of the list (three at most).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE,
};
use reqwest::{Method, StatusCode, Url};

use super::fetch::{Credentials, FetchError};

/// A manifest (or a token answer, an index, a signature manifest) is at most this large.
pub const MAX_MANIFEST: usize = 1 << 20;
/// A token answer is at most this large, and the token in it at most `MAX_TOKEN`.
const MAX_TOKEN_ANSWER: usize = 64 << 10;
const MAX_TOKEN: usize = 8 << 10;
const MAX_REDIRECTS: usize = 3;

/// The shared HTTP client and the operator's list of registries.
#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    allowed: Arc<BTreeSet<String>>,
    plain_http: Arc<BTreeSet<String>>,
}

/// `host[:port]` of a URL, as `--plugin-registry` names it (no port when it is the default).
pub fn authority_of(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    })
}

/// Whether a request may go to `url`: https to a registry of the list, or plain http to one of
/// `--plugin-registry-plain-http`.
fn may_reach(
    url: &Url,
    allowed: &BTreeSet<String>,
    plain: &BTreeSet<String>,
) -> Result<(), String> {
    let Some(authority) = authority_of(url) else {
        return Err("a URL without a host".into());
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{authority}: a URL carrying credentials"));
    }
    match url.scheme() {
        "https" if allowed.contains(&authority) => Ok(()),
        "http" if plain.contains(&authority) => Ok(()),
        "https" | "http" => Err(format!(
            "{}://{authority} is not in --plugin-registry{}",
            url.scheme(),
            if url.scheme() == "http" {
                "-plain-http"
            } else {
                ""
            }
        )),
        other => Err(format!("the scheme {other:?} is not https")),
    }
}

impl RegistryClient {
    /// `extra_ca_pem`: CA certificates trusted besides the system's.
    pub fn new(
        allowed: BTreeSet<String>,
        plain_http: BTreeSet<String>,
        extra_ca_pem: Option<&[u8]>,
    ) -> anyhow::Result<RegistryClient> {
        // reqwest is built without a crypto provider of its own: the process's is ring, as for
        // every other TLS client of the host (a second install is refused, harmlessly).
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let allowed = Arc::new(allowed);
        let plain_http = Arc::new(plain_http);
        // reqwest drops Authorization when a redirect leaves the host, so a token or password
        // never follows one to another registry.
        let policy = |a: Arc<BTreeSet<String>>, p: Arc<BTreeSet<String>>| {
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() > MAX_REDIRECTS {
                    return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
                }
                match may_reach(attempt.url(), &a, &p) {
                    Ok(()) => attempt.follow(),
                    Err(m) => attempt.error(format!("a redirect to {m}")),
                }
            })
        };
        let build = |system_roots: bool| -> anyhow::Result<reqwest::Client> {
            let mut builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(30))
                .redirect(policy(allowed.clone(), plain_http.clone()))
                .user_agent(concat!(
                    "wasm-controller-manager/",
                    env!("CARGO_PKG_VERSION")
                ))
                .https_only(plain_http.is_empty());
            let extra = match extra_ca_pem {
                Some(pem) => reqwest::Certificate::from_pem_bundle(pem)?,
                None => Vec::new(),
            };
            builder = if system_roots {
                builder.tls_certs_merge(extra)
            } else {
                builder.tls_certs_only(extra)
            };
            Ok(builder.build()?)
        };
        // A system without CA certificates (a bare root filesystem) still serves registries of
        // --plugin-registry-ca: only those are trusted then, said once.
        let http = match build(true) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "the system's CA certificates cannot be used ({e:#}): registries are trusted only through --plugin-registry-ca"
                );
                build(false)?
            }
        };
        Ok(RegistryClient {
            http,
            allowed,
            plain_http,
        })
    }

    /// Whether a request may go to `url` (see `may_reach`).
    pub fn check_url(&self, url: &Url) -> Result<(), FetchError> {
        may_reach(url, &self.allowed, &self.plain_http)
            .map_err(|m| FetchError::new("NotAllowed", m))
    }

    /// A session with one repository: its credentials and token are its own.
    pub fn session(
        &self,
        registry: &str,
        repository: &str,
        credentials: Option<Credentials>,
        push: bool,
    ) -> Session {
        let scheme = if self.plain_http.contains(registry) {
            "http"
        } else {
            "https"
        };
        Session {
            client: self.clone(),
            registry: registry.to_string(),
            base: format!("{scheme}://{registry}"),
            repository: repository.to_string(),
            credentials,
            actions: if push { "pull,push" } else { "pull" },
            authorization: None,
        }
    }

    /// GET of a plain https URL, read with a cap (for `source.https`).
    pub async fn get_url(&self, url: &str, max: usize) -> Result<Vec<u8>, FetchError> {
        let parsed = Url::parse(url).map_err(|e| FetchError::new("InvalidSpec", format!("{e}")))?;
        self.check_url(&parsed)?;
        let response = self
            .http
            .get(parsed)
            .send()
            .await
            .map_err(|e| unreachable("GET", url, &e))?;
        let response = expect_success(response, "GET", url)?;
        read_capped(response, max, "the component").await
    }
}

/// One repository of one registry, for one fetch or one push.
pub struct Session {
    client: RegistryClient,
    /// `host[:port]` the session is with: only it is answered a challenge.
    registry: String,
    base: String,
    repository: String,
    credentials: Option<Credentials>,
    actions: &'static str,
    /// The Authorization value earned by the first challenge.
    authorization: Option<String>,
}

impl Session {
    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.repository)
    }

    /// Sends a request, answering one authentication challenge on the way.
    async fn send(
        &mut self,
        method: Method,
        url: &str,
        headers: &[(reqwest::header::HeaderName, &str)],
        body: Option<bytes::Bytes>,
    ) -> Result<reqwest::Response, FetchError> {
        let parsed =
            Url::parse(url).map_err(|e| FetchError::new("Unreachable", format!("{url}: {e}")))?;
        self.client.check_url(&parsed)?;
        let mut challenged = false;
        loop {
            let mut request = self.client.http.request(method.clone(), parsed.clone());
            for (name, value) in headers {
                request = request.header(name, *value);
            }
            if let Some(a) = &self.authorization {
                request = request.header(AUTHORIZATION, a);
            }
            if let Some(b) = &body {
                request = request.body(b.clone());
            }
            let response = request
                .send()
                .await
                .map_err(|e| unreachable(method.as_str(), url, &e))?;
            if response.status() == StatusCode::UNAUTHORIZED && !challenged {
                challenged = true;
                // Credentials go only to the registry the session is with, never to a host a
                // redirect led to (a CDN or storage host answers a signed URL, not a login).
                let from = authority_of(response.url()).unwrap_or_default();
                let ours = Url::parse(&self.base)
                    .ok()
                    .and_then(|u| authority_of(&u))
                    .unwrap_or_default();
                if from != ours {
                    return Err(FetchError::new(
                        "Unauthorized",
                        format!(
                            "{from}, reached by a redirect from {}, asks for credentials: they are sent to {} only",
                            self.registry, self.registry
                        ),
                    ));
                }
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                drop(response);
                self.authorization = Some(self.authorize(challenge.as_deref()).await?);
                continue;
            }
            return Ok(response);
        }
    }

    /// The Authorization value a challenge asks for.
    async fn authorize(&self, challenge: Option<&str>) -> Result<String, FetchError> {
        let Some(challenge) = challenge.and_then(Challenge::parse) else {
            return Err(FetchError::new(
                "Unauthorized",
                "the registry refused the request without a challenge this host understands (Basic or Bearer)",
            ));
        };
        let basic = |c: &Credentials| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.password))
            )
        };
        match challenge {
            Challenge::Basic => match &self.credentials {
                Some(c) => Ok(basic(c)),
                None => Err(FetchError::new(
                    "Unauthorized",
                    "the registry asks for credentials: name a pullSecret holding them",
                )),
            },
            Challenge::Bearer { realm, service } => {
                let mut url = Url::parse(&realm).map_err(|_| {
                    FetchError::new("Unauthorized", "the registry's token realm is not a URL")
                })?;
                // The token service is asked with the pull Secret's password: only one the
                // operator listed, over https.
                if url.scheme() != "https" && !self.base.starts_with("http://") {
                    return Err(FetchError::new(
                        "Unauthorized",
                        "the registry's token realm is not https",
                    ));
                }
                self.client.check_url(&url).map_err(|e| {
                    FetchError::new(
                        "Unauthorized",
                        format!("the registry's token realm: {}", e.message),
                    )
                })?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = &service {
                        q.append_pair("service", s);
                    }
                    q.append_pair(
                        "scope",
                        &format!("repository:{}:{}", self.repository, self.actions),
                    );
                }
                let mut request = self.client.http.get(url);
                if let Some(c) = &self.credentials {
                    request = request.header(AUTHORIZATION, basic(c));
                }
                let response = request
                    .send()
                    .await
                    .map_err(|e| unreachable("GET", "the token realm", &e))?;
                let response = expect_success(response, "GET", "the token realm")?;
                let body = read_capped(response, MAX_TOKEN_ANSWER, "the token answer").await?;
                let v: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|_| FetchError::new("Unauthorized", "the token answer is not JSON"))?;
                let token = v["token"]
                    .as_str()
                    .or(v["access_token"].as_str())
                    .unwrap_or_default();
                if token.is_empty()
                    || token.len() > MAX_TOKEN
                    || !token.bytes().all(|b| b.is_ascii_graphic())
                {
                    return Err(FetchError::new(
                        "Unauthorized",
                        "the token answer holds no usable token",
                    ));
                }
                Ok(format!("Bearer {token}"))
            }
        }
    }

    /// A manifest by digest (`sha256:HEX`) or tag, at most `max` bytes.
    pub async fn manifest(
        &mut self,
        reference: &str,
        accept: &[&str],
        max: usize,
    ) -> Result<Vec<u8>, FetchError> {
        let url = self.url(&format!("manifests/{reference}"));
        let accept = accept.join(", ");
        let response = self
            .send(Method::GET, &url, &[(ACCEPT, accept.as_str())], None)
            .await?;
        let response = expect_success(response, "GET", &url)?;
        read_capped(response, max, "the manifest").await
    }

    /// A blob by digest (hex), at most `max` bytes.
    pub async fn blob(&mut self, digest_hex: &str, max: usize) -> Result<Vec<u8>, FetchError> {
        let url = self.url(&format!("blobs/sha256:{digest_hex}"));
        let response = self.send(Method::GET, &url, &[], None).await?;
        let response = expect_success(response, "GET", &url)?;
        read_capped(response, max, "the blob").await
    }

    /// Uploads a blob (one monolithic PUT) and returns its digest (hex).
    pub async fn push_blob(&mut self, bytes: bytes::Bytes) -> Result<String, FetchError> {
        let digest = crate::sandbox::sha256_hex(&bytes);
        let start = self.url("blobs/uploads/");
        let response = self
            .send(
                Method::POST,
                &start,
                &[(CONTENT_LENGTH, "0")],
                Some(bytes::Bytes::new()),
            )
            .await?;
        let response = expect_success(response, "POST", &start)?;
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| FetchError::new("Unreachable", "the upload answer has no Location"))?;
        let mut url = Url::parse(&start)
            .and_then(|u| u.join(location))
            .map_err(|_| FetchError::new("Unreachable", "the upload Location is not a URL"))?;
        url.query_pairs_mut()
            .append_pair("digest", &format!("sha256:{digest}"));
        let url = url.to_string();
        let response = self
            .send(
                Method::PUT,
                &url,
                &[(CONTENT_TYPE, "application/octet-stream")],
                Some(bytes),
            )
            .await?;
        expect_success(response, "PUT", "the blob upload")?;
        Ok(digest)
    }

    /// Uploads a manifest under `tag` and returns its digest (hex).
    pub async fn push_manifest(
        &mut self,
        tag: &str,
        media_type: &str,
        bytes: bytes::Bytes,
    ) -> Result<String, FetchError> {
        let digest = crate::sandbox::sha256_hex(&bytes);
        let url = self.url(&format!("manifests/{tag}"));
        let response = self
            .send(
                Method::PUT,
                &url,
                &[(CONTENT_TYPE, media_type)],
                Some(bytes),
            )
            .await?;
        expect_success(response, "PUT", &url)?;
        Ok(digest)
    }
}

/// What a `WWW-Authenticate` header asks for.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

impl Challenge {
    fn parse(header: &str) -> Option<Challenge> {
        if header.len() > 4096 {
            return None;
        }
        let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = auth_params(rest)?;
        let get = |k: &str| {
            params
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        };
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
        })
    }
}

/// `a="x", b=y` → pairs; quoted values may hold commas and `\"`.
fn auth_params(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.push(chars.next()?),
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return None;
            }
        } else {
            while let Some(c) = chars.peek() {
                if *c == ',' {
                    break;
                }
                value.push(*c);
                chars.next();
            }
        }
        if out.len() >= 16 {
            return None;
        }
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
}

fn unreachable(method: &str, what: &str, e: &reqwest::Error) -> FetchError {
    // reqwest's text names the URL, which `what` already says.
    let mut text = e.to_string();
    if let Some(u) = e.url() {
        text = text.replace(u.as_str(), "").replace(" for url ()", "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    let reason = if e.is_redirect() {
        "NotAllowed"
    } else {
        "Unreachable"
    };
    FetchError::new(reason, format!("{method} {what}: {text}"))
}

/// The response when it is a success; else why not (its body is never read).
fn expect_success(
    response: reqwest::Response,
    method: &str,
    what: &str,
) -> Result<reqwest::Response, FetchError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let reason = match status.as_u16() {
        401 | 403 => "Unauthorized",
        404 => "NotFound",
        _ => "Unreachable",
    };
    Err(FetchError::new(
        reason,
        format!("{method} {what}: HTTP {status}"),
    ))
}

/// The body, refused as soon as it passes `max` bytes (by its Content-Length, or while read).
async fn read_capped(
    mut response: reqwest::Response,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, FetchError> {
    let too_large = || FetchError::new("TooLarge", format!("{what} is larger than {max} bytes"));
    if response.content_length().is_some_and(|l| l > max as u64) {
        return Err(too_large());
    }
    let mut out = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| FetchError::new("Unreachable", format!("reading {what}: {e}")))?
    {
        if out.len() + chunk.len() > max {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_as_registries_write_them() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into())
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            Challenge::parse(r#"bearer realm="https://a/t?x=\"y\", z""#),
            Some(Challenge::Bearer {
                realm: r#"https://a/t?x="y", z"#.into(),
                service: None
            })
        );
        assert_eq!(Challenge::parse("Bearer service=x"), None, "no realm");
        assert_eq!(Challenge::parse(r#"Bearer realm="unclosed"#), None);
        assert_eq!(Challenge::parse("Negotiate abc"), None);
    }

    #[test]
    fn only_listed_registries_are_reached() {
        let allowed: BTreeSet<String> =
            ["reg.example".to_string(), "127.0.0.1:5000".to_string()].into();
        let plain: BTreeSet<String> = ["127.0.0.1:5000".to_string()].into();
        let ok = |u: &str| may_reach(&Url::parse(u).unwrap(), &allowed, &plain);
        assert!(ok("https://reg.example/v2/").is_ok());
        assert!(
            ok("https://reg.example:443/v2/").is_ok(),
            "the default port"
        );
        assert!(ok("http://127.0.0.1:5000/v2/").is_ok());
        assert!(
            ok("http://reg.example/v2/").is_err(),
            "plain http to an https registry"
        );
        assert!(ok("https://other.example/v2/").is_err());
        assert!(ok("https://reg.example.other.example/v2/").is_err());
        assert!(ok("https://u:p@reg.example/v2/").is_err());
        assert!(ok("file:///etc/passwd").is_err());
    }
}
