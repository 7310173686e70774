//! Plugins for the host's tests and benchmarks, one component per example: `well-behaved`,
//! `infinite-loop`, `memory-bomb`, `panicker`, `undeclared-call`, `oversized-output`,
//! `typed-pod-noop` and `noop`. This library holds what they share.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Context, Description, Error, Patch, Watch};

/// The version every test plugin reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The ConfigMap's `data.value`, or `"yes"` without one.
pub fn value_of(cm: &ConfigMap) -> &str {
    cm.data
        .as_ref()
        .and_then(|d| d.get("value"))
        .map_or("yes", String::as_str)
}

/// Sets annotation `key` of the ConfigMap to `value` when it differs, and says whether it did
/// (never in `kube-*` namespaces, where the host refuses plugins' writes).
/// Patching only on a difference ends the loop: the plugin's own patch comes back as a change.
pub fn annotate(ctx: &Context, cm: &ConfigMap, key: &str, value: &str) -> Result<bool, Error> {
    // Kubernetes' own namespaces are protected: no plugin acts there unless its operator names
    // them, so the test plugins that watch every ConfigMap leave those alone.
    if cm
        .metadata
        .namespace
        .as_deref()
        .is_some_and(|ns| ns.starts_with("kube-"))
    {
        return Ok(false);
    }
    let current = cm.metadata.annotations.as_ref().and_then(|a| a.get(key));
    if current.map(String::as_str) == Some(value) {
        return Ok(false);
    }
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    ctx.api_namespaced::<ConfigMap>(cm.metadata.namespace.as_deref().unwrap_or_default())
        .patch(
            name,
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )?;
    Ok(true)
}

/// Whether the ConfigMap carries annotation `key` (a probe that has already reported).
pub fn has_annotation(cm: &ConfigMap, key: &str) -> bool {
    cm.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// The HTTP code of a call's answer, 0 for success: what the hostile probes report.
pub fn code<T>(r: Result<T, wcm_sdk::ApiError>) -> u16 {
    match r {
        Ok(_) => 0,
        Err(e) => e.code,
    }
}

/// A plugin named `name` whose primary watch is every ConfigMap (full objects, all namespaces).
pub fn configmap_plugin(name: &str) -> Description {
    Description::new(name, VERSION).primary(Watch::of::<ConfigMap>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn descriptions_are_valid() {
        assert_eq!(super::configmap_plugin("well-behaved").validate(), Ok(()));
    }
}
