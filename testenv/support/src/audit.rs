//! The apiserver's audit log: what the apiserver itself saw, so tests can prove who did what.
//!
//! testenv runs kube-apiserver with a Metadata-level policy (no request or response bodies) and the
//! blocking log backend, so the event of a request is in the file once its response has arrived.
//! The file is JSON lines and only grows; an apiserver restarted by the tests appends to it.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// One `audit.k8s.io/v1` Event, the fields tests use. Every field has a default, so an event with
/// missing or unknown fields still parses. Go omits empty strings, so absent and `""` are the same.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuditEvent {
    /// `Metadata` for everything this policy records.
    pub level: String,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// `ResponseComplete`, or `ResponseStarted` for watches (`RequestReceived` is omitted).
    pub stage: String,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, …
    pub verb: String,
    /// The authenticated user (the impersonator, when impersonating).
    pub user: UserInfo,
    pub impersonated_user: Option<UserInfo>,
    pub user_agent: String,
    pub object_ref: Option<ObjectRef>,
    pub response_status: Option<ResponseStatus>,
    /// RFC 3339 with microseconds.
    pub stage_timestamp: String,
    /// When the request reached the API server (RFC 3339 with microseconds, UTC: the texts of two
    /// events compare as their times do).
    pub request_received_timestamp: String,
    /// E.g. `authorization.k8s.io/decision` (`allow` / `forbid`) and `authorization.k8s.io/reason`.
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

/// The object a request was about. `api_group` is empty for the core group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ObjectRef {
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub api_group: String,
    pub api_version: String,
    pub subresource: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ResponseStatus {
    /// HTTP status code.
    pub code: i32,
    pub reason: String,
    pub message: String,
}

impl AuditEvent {
    /// The user the request acted as: the impersonated user if any, else the authenticated one.
    pub fn effective_user(&self) -> &str {
        match &self.impersonated_user {
            Some(u) => &u.username,
            None => &self.user.username,
        }
    }

    /// The HTTP status code of the response, if the event has one.
    pub fn code(&self) -> Option<i32> {
        self.response_status.as_ref().map(|s| s.code)
    }
}

/// A position in the audit log (a byte offset): [`crate::TestEnv::audit_events_since`] returns
/// only the events written after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditMark(u64);

impl AuditMark {
    /// The start of the log.
    pub const START: AuditMark = AuditMark(0);
}

pub(crate) fn mark(path: &Path) -> Result<AuditMark> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("read the audit log {}", path.display()))?;
    Ok(AuditMark(meta.len()))
}

pub(crate) fn read_since(path: &Path, mark: AuditMark) -> Result<Vec<AuditEvent>> {
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("open the audit log {}", path.display()))?;
    let len = file.metadata()?.len();
    // The log only grows. Should it ever be shorter than the mark, read it all: returning nothing
    // would let a test that asserts "no such event" pass on a log it never read.
    let start = if mark.0 <= len { mark.0 } else { 0 };
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .with_context(|| format!("read the audit log {}", path.display()))?;
    Ok(parse_lines(&bytes))
}

/// Parses JSON lines; lines that are not an event (a partial last line, garbage) are skipped.
pub(crate) fn parse_lines(bytes: &[u8]) -> Vec<AuditEvent> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shape of a real kube-apiserver v1.36 event (impersonated GET answered 404).
    const EVENT: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b7c","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns1/configmaps/absent","verb":"get","user":{"username":"admin","uid":"admin-uid","groups":["system:masters","system:authenticated"]},"impersonatedUser":{"username":"system:serviceaccount:ns1:default","groups":["system:serviceaccounts","system:serviceaccounts:ns1","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kube-rs","objectRef":{"resource":"configmaps","namespace":"ns1","name":"absent","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","message":"configmaps \"absent\" not found","reason":"NotFound","details":{"name":"absent","kind":"configmaps"},"code":404},"requestReceivedTimestamp":"2026-01-01T00:00:00.000000Z","stageTimestamp":"2026-01-01T00:00:00.001000Z","annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC: allowed"}}"#;

    #[test]
    fn parses_an_event() {
        let events = parse_lines(format!("{EVENT}\n").as_bytes());
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.verb, "get");
        assert_eq!(e.user.username, "admin");
        assert_eq!(e.effective_user(), "system:serviceaccount:ns1:default");
        assert_eq!(e.code(), Some(404));
        let o = e.object_ref.as_ref().expect("objectRef");
        assert_eq!(
            (o.resource.as_str(), o.namespace.as_str(), o.name.as_str()),
            ("configmaps", "ns1", "absent")
        );
        assert_eq!(o.api_group, "");
        assert_eq!(
            e.annotations
                .get("authorization.k8s.io/decision")
                .map(String::as_str),
            Some("allow")
        );
    }

    #[test]
    fn skips_bad_and_partial_lines_and_tolerates_missing_fields() {
        let partial = &EVENT[..EVENT.len() / 2];
        let text = format!("not json\n\n{{\"verb\":\"list\",\"future\":1}}\n{EVENT}\n{partial}");
        let events = parse_lines(text.as_bytes());
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].verb, "list");
        assert_eq!(events[0].effective_user(), "");
        assert_eq!(events[0].code(), None);
        assert_eq!(events[1].verb, "get");
    }
}
