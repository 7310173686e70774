//! The `Network` custom resource (`samplecrd.k8s.io/v1`), as `manifests/crds/` defines it; a unit
//! test compares the two so they cannot drift.

use serde::{Deserialize, Serialize};
use wcm_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use wcm_sdk::{ApiResource, Resource};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Network {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NetworkSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NetworkStatus>,
}

impl Resource for Network {
    type DynamicType = ();

    fn api_resource(_: &()) -> ApiResource {
        ApiResource::new("samplecrd.k8s.io", "v1", "Network")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the user asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSpec {
    /// The subnet, e.g. `192.168.0.0/24`.
    #[serde(default)]
    pub cidr: String,
    /// The gateway address inside it, e.g. `192.168.0.1`.
    #[serde(default)]
    pub gateway: String,
}

/// What the plugin found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A status condition (the shape of `metav1.Condition`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl NetworkStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Sets a condition; its transition time moves only when its status changes.
    pub fn set(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
        generation: Option<i64>,
    ) {
        let status = if status { "True" } else { "False" };
        let previous = self.condition(type_).cloned();
        let last_transition_time = match &previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now_rfc3339(),
        };
        let c = Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time,
            observed_generation: generation,
        };
        match self.conditions.iter_mut().find(|x| x.type_ == type_) {
            Some(x) => *x = c,
            None => self.conditions.push(c),
        }
    }
}

/// The current time as RFC 3339 (UTC, seconds).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

pub fn rfc3339(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let rem = unix % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Seconds since the epoch of an RFC 3339 / ISO 8601 UTC time such as Keystone's
/// `2026-11-23T04:40:00.000000Z`; `None` when it does not read as one.
pub fn parse_utc(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' {
        return None;
    }
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    u64::try_from(secs).ok()
}

// Howard Hinnant's civil-calendar algorithms.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;

    #[test]
    fn times_round_trip() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(
            parse_utc("2023-11-14T22:13:20.000000Z"),
            Some(1_700_000_000)
        );
        assert_eq!(
            parse_utc("2024-02-29T12:00:00Z").map(rfc3339).as_deref(),
            Some("2024-02-29T12:00:00Z")
        );
        assert_eq!(parse_utc("yesterday"), None);
    }

    #[test]
    fn a_transition_time_moves_only_with_the_status() {
        let mut s = NetworkStatus::default();
        s.set("Ready", false, "Pending", "", Some(1));
        s.conditions[0].last_transition_time = "then".into();
        s.set("Ready", false, "StillPending", "", Some(2));
        assert_eq!(s.conditions[0].last_transition_time, "then");
        s.set("Ready", true, "Synced", "", Some(2));
        assert_ne!(s.conditions[0].last_transition_time, "then");
        assert_eq!(s.conditions.len(), 1);
    }

    /// The property names under `path` in the CRD's schema.
    fn crd_properties(schema: &Value, path: &[&str]) -> BTreeSet<String> {
        let mut node = schema;
        for p in path {
            node = if *p == "[]" {
                &node["items"]
            } else {
                &node["properties"][*p]
            };
        }
        node["properties"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The CRD in manifests/ and these types describe the same fields.
    #[test]
    fn the_crd_and_the_rust_type_agree() {
        let crd: Value = serde_yaml_ng::from_str(include_str!(
            "../../../manifests/crds/networks.samplecrd.k8s.io.yaml"
        ))
        .expect("the CRD is YAML");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(crd["spec"]["group"], "samplecrd.k8s.io");
        assert_eq!(crd["spec"]["names"]["kind"], "Network");
        assert_eq!(version["name"], "v1");
        let schema = &version["schema"]["openAPIV3Schema"];
        // Every optional field set, so every field serializes.
        let full = Network {
            metadata: ObjectMeta::default(),
            spec: NetworkSpec {
                cidr: "10.0.0.0/24".into(),
                gateway: "10.0.0.1".into(),
            },
            status: Some(NetworkStatus {
                network_id: Some("n".into()),
                subnet_id: Some("s".into()),
                observed_generation: Some(1),
                conditions: vec![Condition {
                    observed_generation: Some(1),
                    ..Condition::default()
                }],
            }),
        };
        let json = serde_json::to_value(&full).unwrap();
        assert_eq!(
            crd_properties(schema, &["spec"]),
            keys(&json["spec"]),
            "spec"
        );
        assert_eq!(
            crd_properties(schema, &["status"]),
            keys(&json["status"]),
            "status"
        );
        assert_eq!(
            crd_properties(schema, &["status", "conditions", "[]"]),
            keys(&json["status"]["conditions"][0]),
            "conditions"
        );
        // What the schema requires, the type always has.
        let required: BTreeSet<String> = schema["properties"]["spec"]["required"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(required, keys(&json["spec"]));
        assert!(
            version["subresources"]["status"].is_object(),
            "status is a subresource (the plugin writes it with patch_status)"
        );
    }
}
