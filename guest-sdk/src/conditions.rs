//! Status conditions (`metav1.Condition`), kept the way apimachinery's `meta.SetStatusCondition`
//! keeps them: one per type, and a transition time that moves only when the status changes.
//!
//! ```
//! use wcm_sdk::conditions::{self, Condition};
//!
//! let mut list: Vec<Condition> = Vec::new();
//! assert!(conditions::set(&mut list, conditions::new("Ready", false, "Pending", "creating", Some(1))));
//! let since = list[0].last_transition_time.clone();
//! // Same status, new reason: the condition changes, its transition time does not.
//! assert!(conditions::set(&mut list, conditions::new("Ready", false, "Waiting", "quota", Some(2))));
//! assert_eq!(list[0].last_transition_time, since);
//! assert!(!conditions::is_true(&list, "Ready"));
//! // Nothing new: nothing changes (so nothing needs writing).
//! assert!(!conditions::set(&mut list, conditions::new("Ready", false, "Waiting", "quota", Some(2))));
//! ```

/// `metav1.Condition`. A custom resource's status that holds `Vec<Condition>` and derives
/// `schemars::JsonSchema` (for its CRD) needs k8s-openapi's `schemars` feature: add
/// `k8s-openapi = { version = "0.29", default-features = false, features = ["v1_36", "schemars"] }`
/// to the plugin's dependencies (features unify, so the SDK's copy gets it too).
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A condition of `type_` with status `"True"` or `"False"`, stamped now. `observed_generation` is
/// the `metadata.generation` the plugin acted on (see [`observed_generation`]).
pub fn new(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Sets `condition` in `conditions`, replacing the one of its type. Its transition time is kept
/// from the old condition when the status did not change. Returns whether anything changed, so a
/// reconcile writes the status only when it must.
pub fn set(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        None => {
            conditions.push(condition);
            true
        }
        Some(old) => {
            if old.status == condition.status {
                condition.last_transition_time = old.last_transition_time.clone();
            }
            if *old == condition {
                return false;
            }
            *old = condition;
            true
        }
    }
}

/// The condition of `type_`, if set.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is set and `"True"`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Removes the condition of `type_`; returns whether it was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// The object's `metadata.generation`: what a status's `observedGeneration` and each condition's
/// `observedGeneration` should say the plugin acted on.
pub fn observed_generation<K: kube_core::Resource>(obj: &K) -> Option<i64> {
    obj.meta().generation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_change_moves_the_transition_time() {
        let mut list = Vec::new();
        set(&mut list, new("Ready", false, "Pending", "", None));
        let old = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        list[0].last_transition_time = old.clone();
        assert!(set(&mut list, new("Ready", true, "Synced", "", Some(3))));
        assert_ne!(list[0].last_transition_time, old);
        assert!(is_true(&list, "Ready"));
        assert_eq!(list.len(), 1);
        assert!(set(&mut list, new("Synced", true, "Ok", "", Some(3))));
        assert_eq!(list.len(), 2);
        assert!(remove(&mut list, "Synced"));
        assert!(!remove(&mut list, "Synced"));
        assert!(find(&list, "Synced").is_none());
    }
}
