//! Plugins for the host's tests and benchmarks, one component per example: `well-behaved`,
//! `infinite-loop`, `memory-bomb`, `panicker`, `undeclared-call`, `oversized-output`,
//! `typed-pod-noop` and `noop`. This library holds what they share.

use k8s_openapi::api::core::v1::ConfigMap;
use wcm_sdk::{Description, Watch};

/// The version every test plugin reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

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
