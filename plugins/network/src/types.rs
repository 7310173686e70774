//! The `Network` custom resource (`samplecrd.k8s.io/v1`). Its CRD is generated from these types
//! (`#[derive(CustomResource)]`): `manifests/crds/networks.samplecrd.k8s.io.yaml` is
//! `cargo run -p network --example crd`, and a unit test fails when the two differ.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the user asks for: a network with one subnet.
// Each printcolumn repeats `type_ = "string"`, which the lint takes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(
    CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "samplecrd.k8s.io",
    version = "v1",
    kind = "Network",
    namespaced,
    doc = "A network that the network plugin keeps in sync with OpenStack Neutron.",
    status = "NetworkStatus",
    shortname = "net",
    derive = "Default",
    derive = "PartialEq",
    // Groups ending in k8s.io are reserved; the API server accepts this one only when it says so.
    annotation("api-approved.kubernetes.io", "unapproved, experimental-only"),
    printcolumn(name = "CIDR", type_ = "string", json_path = ".spec.cidr"),
    printcolumn(name = "Gateway", type_ = "string", json_path = ".spec.gateway"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Network-ID",
        type_ = "string",
        json_path = ".status.networkId",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct NetworkSpec {
    /// The subnet of the network, e.g. 192.168.0.0/24 (host bits zero).
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isCIDR(self)", "message": "must be a CIDR such as 192.168.0.0/24"}
    ]))]
    pub cidr: String,
    /// The gateway address, inside the CIDR, e.g. 192.168.0.1 (checked by the plugin).
    #[schemars(length(min = 1, max = 45))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isIP(self)", "message": "must be an IP address such as 192.168.0.1"}
    ]))]
    pub gateway: String,
}

/// What the plugin found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// The Neutron network's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_id: Option<String>,
    /// The Neutron subnet's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// The metadata.generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready (Neutron matches the spec), Synced (the last sync succeeded), Invalid (the spec cannot
    /// be used).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A status condition (the shape of `metav1.Condition`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    // The plugin always writes it; a default of "" would not be a date-time, which the API
    // server refuses in a CRD.
    #[serde(default)]
    #[schemars(extend("format" = "date-time"), transform = no_default)]
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A field's schema without the `default` that `#[serde(default)]` gives it.
fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
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

/// The CRD of [`Network`], as shipped in `manifests/crds/`: a header comment, then the YAML.
#[cfg(not(target_arch = "wasm32"))]
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let yaml = serde_yaml_ng::to_string(&Network::crd()).unwrap_or_else(|e| format!("# {e}\n"));
    format!(
        "# The Network custom resource: a network that the network plugin keeps in sync with OpenStack\n\
         # Neutron. Generated from plugins/network/src/types.rs: cargo run -p network --example crd\n{yaml}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The shipped CRD is the one the derive generates (regenerate it with
    /// `cargo run -p network --example crd > manifests/crds/networks.samplecrd.k8s.io.yaml`).
    #[test]
    fn the_shipped_crd_is_the_derived_one() {
        let shipped = include_str!("../../../manifests/crds/networks.samplecrd.k8s.io.yaml");
        assert_eq!(
            shipped,
            crd_yaml(),
            "manifests/crds/networks.samplecrd.k8s.io.yaml is not what the Network type derives; \
             regenerate it with `cargo run -p network --example crd`"
        );
    }

    #[test]
    fn the_derived_crd_says_what_the_plugin_relies_on() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(Network::crd()).expect("serializes");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(crd["metadata"]["name"], "networks.samplecrd.k8s.io");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert!(
            version["subresources"]["status"].is_object(),
            "status is a subresource (the plugin writes it with patch_status)"
        );
        let schema = &version["schema"]["openAPIV3Schema"];
        assert_eq!(
            schema["properties"]["spec"]["required"],
            serde_json::json!(["cidr", "gateway"])
        );
        let conditions = &schema["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            conditions["items"]["required"],
            serde_json::json!(["reason", "status", "type"])
        );
    }
}
