//! A few calls to the test Keystone and Neutron, for tests and benchmarks that read back what the
//! plugin did: plain HTTP/1.1 on loopback, one connection per request, no crate beyond std.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::openstack::OpenStack;

/// An answer: status, headers (lowercase names) and the body as JSON (`Null` when it is not).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request to an `http://` URL.
pub fn http(url: &str, method: &str, token: Option<&str>, body: Option<&Value>) -> Result<Answer> {
    let rest = url.strip_prefix("http://").context("http:// only")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = std::net::TcpStream::connect(authority)
        .with_context(|| format!("connect to {authority}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        req.push_str(&format!("X-Auth-Token: {t}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, payload) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let payload = if chunked {
        dechunk(payload)
    } else {
        payload.to_string()
    };
    Ok(Answer {
        status,
        headers,
        body: serde_json::from_str(&payload).unwrap_or(Value::Null),
    })
}

fn dechunk(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

impl OpenStack {
    fn token(&self, auth: Value) -> Result<String> {
        let a = http(
            &format!("{}/auth/tokens", self.info().keystone_url),
            "POST",
            None,
            Some(&json!({"auth": auth})),
        )?;
        if a.status != 201 {
            bail!("Keystone answered {}: {}", a.status, a.body);
        }
        a.header("x-subject-token")
            .map(str::to_string)
            .context("no X-Subject-Token")
    }

    /// A token of the project user (`wcm-network`), through its application credential.
    pub fn user_token(&self) -> Result<String> {
        let i = self.info();
        self.token(json!({"identity": {"methods": ["application_credential"],
            "application_credential": {"id": i.application_credential_id,
                                       "secret": i.application_credential_secret}}}))
    }

    /// A token of the cloud admin, scoped to the admin project.
    pub fn admin_token(&self) -> Result<String> {
        let i = self.info();
        self.token(json!({
            "identity": {"methods": ["password"], "password": {"user": {
                "name": i.admin_username, "password": i.admin_password, "domain": {"name": "Default"}}}},
            "scope": {"project": {"name": i.admin_project, "domain": {"name": "Default"}}},
        }))
    }

    /// A Neutron GET (`path` after `/v2.0/`) that must answer 200.
    pub fn neutron_get(&self, token: &str, path: &str) -> Result<Value> {
        let a = http(
            &format!("{}/v2.0/{path}", self.info().neutron_url),
            "GET",
            Some(token),
            None,
        )?;
        if a.status != 200 {
            bail!("Neutron GET {path}: {} {}", a.status, a.body);
        }
        Ok(a.body)
    }

    /// Sets up the network plugin for this OpenStack in `plugins_dir`: its credentials in the
    /// Secret `namespace/openstack` (application credential `id` and `secret`), and a
    /// `network.toml` naming the endpoints, allowing their addresses and reading that Secret.
    /// `extra` is put first (settings such as `resync_seconds = 20`, one per line).
    pub async fn configure_network_plugin(
        &self,
        client: &kube::Client,
        namespace: &str,
        plugins_dir: &std::path::Path,
        extra: &str,
    ) -> Result<()> {
        use k8s_openapi::api::core::v1::Secret;
        let i = self.info();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "openstack"},
            "stringData": {"id": i.application_credential_id, "secret": i.application_credential_secret},
        }))?;
        kube::Api::<Secret>::namespaced(client.clone(), namespace)
            .create(&kube::api::PostParams::default(), &secret)
            .await?;
        let authority = |url: &str| -> String {
            let rest = url.trim_start_matches("http://");
            rest.split('/').next().unwrap_or(rest).to_string()
        };
        std::fs::write(
            plugins_dir.join("network.toml"),
            format!(
                "{extra}isolation = \"worker\"\nallowed_hosts = [\"{}\", \"{}\"]\n[config]\nkeystone-url = \"{}\"\nneutron-url = \"{}\"\n[secrets]\napplication-credential-id = \"{namespace}/openstack/id\"\napplication-credential-secret = \"{namespace}/openstack/secret\"\n",
                authority(&i.keystone_url),
                authority(&i.neutron_url),
                i.keystone_url,
                i.neutron_url,
            ),
        )?;
        Ok(())
    }

    /// Lifts the project's Neutron quotas for networks and subnets (default: 100 each).
    pub fn unlimited_quota(&self) -> Result<()> {
        let admin = self.admin_token()?;
        let a = http(
            &format!(
                "{}/v2.0/quotas/{}",
                self.info().neutron_url,
                self.info().project_id
            ),
            "PUT",
            Some(&admin),
            Some(&json!({"quota": {"network": -1, "subnet": -1, "port": -1}})),
        )?;
        if a.status != 200 {
            bail!("Neutron quota update: {} {}", a.status, a.body);
        }
        Ok(())
    }
}
