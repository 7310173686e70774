//! The Keystone (identity v3) and Neutron (networking v2.0) calls the plugin makes, over the
//! SDK's HTTP client.
//!
//! A token is obtained once per instance and reused until five minutes before it expires; with
//! `isolation = "worker"` an instance lives across reconciles, so that is once per worker, not once
//! per reconcile. A 401 from Neutron gets one new token and one retry. The cached token is keyed by
//! the credentials, so rotated credentials get a new token at once.

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use serde_json::{Value, json};
use wcm_sdk::Context;
use wcm_sdk::http::{HttpError, HttpErrorKind, HttpResponse, Method};

/// Tokens are renewed this long before they expire.
const RENEW_BEFORE: u64 = 300;
/// Per-request timeout (connect, first byte, between bytes).
const TIMEOUT: Duration = Duration::from_secs(10);

/// How the plugin authenticates to Keystone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Credentials {
    ApplicationCredential {
        id: String,
        secret: String,
    },
    Password {
        username: String,
        password: String,
        user_domain: String,
        project: String,
        project_domain: String,
    },
}

/// Where the services are and who the plugin is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cloud {
    /// Identity v3 root, e.g. `http://keystone:5000/v3`.
    pub keystone: String,
    /// Networking root, e.g. `http://neutron:9696` (without `/v2.0`).
    pub neutron: String,
    pub credentials: Credentials,
}

struct Token {
    value: String,
    expires_at: u64,
    /// Which cloud and credentials it was issued for.
    key: u64,
}

thread_local! {
    static TOKEN: RefCell<Option<Token>> = const { RefCell::new(None) };
}

/// Why a call failed, and what the status condition should say.
#[derive(Debug)]
pub struct Failure {
    /// `KeystoneUnavailable`, `AuthenticationFailed`, `NeutronUnavailable`, `NeutronRejected`.
    pub reason: &'static str,
    pub error: HttpError,
}

impl Failure {
    fn keystone(error: HttpError) -> Failure {
        let reason = match error.status() {
            Some(401) | Some(403) => "AuthenticationFailed",
            _ => "KeystoneUnavailable",
        };
        Failure { reason, error }
    }

    fn neutron(error: HttpError) -> Failure {
        let reason = if error.status() == Some(401) {
            // Even a fresh token was refused.
            "AuthenticationFailed"
        } else if error.is_retryable() {
            "NeutronUnavailable"
        } else {
            "NeutronRejected"
        };
        Failure { reason, error }
    }

    /// Neutron's own error type (`NetworkNotFound`, `GatewayConflictWithAllocationPools`, ...).
    pub fn neutron_type(&self) -> Option<String> {
        let body: Value = self.error.response()?.body_json().ok()?;
        Some(body["NeutronError"]["type"].as_str()?.to_string())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.error)
    }
}

/// The `id` of a Neutron object, checked before it goes into a path: a UUID's characters only.
pub fn id_of(item: &Value) -> Result<&str, Failure> {
    item["id"]
        .as_str()
        .filter(|id| {
            !id.is_empty()
                && id.len() <= 64
                && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        })
        .ok_or_else(|| {
            Failure::neutron(HttpError::new(
                HttpErrorKind::Decode,
                "Neutron returned an object without a usable id",
            ))
        })
}

pub struct Neutron<'a> {
    ctx: &'a Context,
    cloud: &'a Cloud,
    key: u64,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl<'a> Neutron<'a> {
    pub fn new(ctx: &'a Context, cloud: &'a Cloud) -> Self {
        let mut h = DefaultHasher::new();
        cloud.hash(&mut h);
        Neutron {
            ctx,
            cloud,
            key: h.finish(),
        }
    }

    /// A valid token: the cached one, or a new one from Keystone.
    fn token(&self, renew: bool) -> Result<String, Failure> {
        if !renew {
            let cached = TOKEN.with(|t| {
                t.borrow()
                    .as_ref()
                    .filter(|t| t.key == self.key && t.expires_at > now() + RENEW_BEFORE)
                    .map(|t| t.value.clone())
            });
            if let Some(t) = cached {
                return Ok(t);
            }
        }
        let identity = match &self.cloud.credentials {
            Credentials::ApplicationCredential { id, secret } => json!({
                "methods": ["application_credential"],
                "application_credential": {"id": id, "secret": secret},
            }),
            Credentials::Password {
                username,
                password,
                user_domain,
                ..
            } => json!({
                "methods": ["password"],
                "password": {"user": {
                    "name": username, "password": password, "domain": {"name": user_domain},
                }},
            }),
        };
        let mut auth = json!({"identity": identity});
        if let Credentials::Password {
            project,
            project_domain,
            ..
        } = &self.cloud.credentials
        {
            auth["scope"] =
                json!({"project": {"name": project, "domain": {"name": project_domain}}});
        }
        let response = self
            .ctx
            .http()
            .post(format!(
                "{}/auth/tokens",
                self.cloud.keystone.trim_end_matches('/')
            ))
            .timeout(TIMEOUT)
            .json(&json!({"auth": auth}))
            .send()
            .and_then(HttpResponse::error_for_status)
            .map_err(Failure::keystone)?;
        let value = response
            .header("x-subject-token")
            .ok_or_else(|| {
                Failure::keystone(HttpError::new(
                    HttpErrorKind::Decode,
                    "Keystone answered without X-Subject-Token",
                ))
            })?
            .to_string();
        let body: Value = response.body_json().map_err(Failure::keystone)?;
        // Without a readable expiry, assume Keystone's default hour.
        let expires_at = body["token"]["expires_at"]
            .as_str()
            .and_then(crate::types::parse_utc)
            .unwrap_or(now() + 3600);
        TOKEN.with(|t| {
            *t.borrow_mut() = Some(Token {
                value: value.clone(),
                expires_at,
                key: self.key,
            })
        });
        Ok(value)
    }

    /// One Neutron call; a 401 gets one new token and one retry.
    fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<HttpResponse, Failure> {
        let url = format!("{}/v2.0/{path}", self.cloud.neutron.trim_end_matches('/'));
        let mut renew = false;
        loop {
            let token = self.token(renew)?;
            let mut req = self
                .ctx
                .http()
                .request(method, url.clone())
                .timeout(TIMEOUT)
                .header("X-Auth-Token", &token)
                .header("Accept", "application/json");
            if let Some(b) = &body {
                req = req.json(b);
            }
            let response = req.send().map_err(Failure::neutron)?;
            if response.status == 401 && !renew {
                renew = true;
                continue;
            }
            return response.error_for_status().map_err(Failure::neutron);
        }
    }

    /// A list, each item with a usable `id`. An answer without the list is an error, never
    /// "nothing there" (which would create a duplicate).
    fn list(&self, path: &str, field: &str) -> Result<Vec<Value>, Failure> {
        let r = self.call(Method::Get, path, None)?;
        let body: Value = r.body_json().map_err(Failure::neutron)?;
        let items = body[field].as_array().cloned().ok_or_else(|| {
            Failure::neutron(HttpError::new(
                HttpErrorKind::Decode,
                format!("Neutron's answer to GET {path} has no {field:?} list"),
            ))
        })?;
        for item in &items {
            id_of(item)?;
        }
        Ok(items)
    }

    /// The networks of one object: those carrying `tag`, or else those whose description is the
    /// tag (created, then the process stopped before the tag was added), which get the tag now.
    /// Neutron takes tags on networks only after the create, so the description is what makes the
    /// create itself findable: no restart at any point creates a second network.
    pub fn networks_of(&self, tag: &str) -> Result<Vec<Value>, Failure> {
        let tagged = self.list(&format!("networks?tags={tag}"), "networks")?;
        if !tagged.is_empty() {
            return Ok(tagged);
        }
        let described = self.list(&format!("networks?description={tag}"), "networks")?;
        for net in &described {
            self.add_tag(id_of(net)?, tag)?;
        }
        Ok(described)
    }

    fn add_tag(&self, network_id: &str, tag: &str) -> Result<(), Failure> {
        self.call(
            Method::Put,
            &format!("networks/{network_id}/tags/{tag}"),
            None,
        )
        .map(|_| ())
    }

    /// A network named `name` (for people), described as `tag` in the create itself and then
    /// tagged with it.
    pub fn create_network(&self, name: &str, tag: &str) -> Result<Value, Failure> {
        let r = self.call(
            Method::Post,
            "networks",
            Some(json!({"network": {"name": name, "description": tag, "admin_state_up": true}})),
        )?;
        let body: Value = r.body_json().map_err(Failure::neutron)?;
        let network = body["network"].clone();
        self.add_tag(id_of(&network)?, tag)?;
        Ok(network)
    }

    pub fn subnets_of(&self, network_id: &str) -> Result<Vec<Value>, Failure> {
        self.list(&format!("subnets?network_id={network_id}"), "subnets")
    }

    pub fn create_subnet(
        &self,
        network_id: &str,
        name: &str,
        tag: &str,
        cidr: &crate::ip::Cidr,
        gateway: &str,
    ) -> Result<Value, Failure> {
        let r = self.call(
            Method::Post,
            "subnets",
            Some(json!({"subnet": {
                "network_id": network_id,
                "name": name,
                "description": tag,
                "ip_version": cidr.ip_version(),
                "cidr": cidr.to_string(),
                "gateway_ip": gateway,
            }})),
        )?;
        let body: Value = r.body_json().map_err(Failure::neutron)?;
        let subnet = body["subnet"].clone();
        id_of(&subnet)?;
        Ok(subnet)
    }

    /// Moves the gateway, with allocation pools that leave it out (Neutron refuses a gateway
    /// inside a pool: 409 `GatewayConflictWithAllocationPools`).
    pub fn move_gateway(
        &self,
        subnet_id: &str,
        gateway: std::net::IpAddr,
        pools: &[(std::net::IpAddr, std::net::IpAddr)],
    ) -> Result<(), Failure> {
        let pools: Vec<Value> = pools
            .iter()
            .map(|(s, e)| json!({"start": s.to_string(), "end": e.to_string()}))
            .collect();
        self.call(
            Method::Put,
            &format!("subnets/{subnet_id}"),
            Some(json!({"subnet": {"gateway_ip": gateway.to_string(), "allocation_pools": pools}})),
        )
        .map(|_| ())
    }

    /// Deletes a subnet or network; already gone (404) counts as done.
    pub fn delete(&self, collection: &str, id: &str) -> Result<(), Failure> {
        match self.call(Method::Delete, &format!("{collection}/{id}"), None) {
            Err(f) if f.error.status() == Some(404) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}
