//! Rules the host applies to what a plugin hands it, shared with the SDK's MockHost so that a
//! plugin that passes its unit tests behaves the same in the cluster:
//! - [`applyset`]: the children a reconcile returns (contract 0.3), their ApplySet (KEP-3659)
//!   and which objects a prune may delete;
//! - [`metrics`]: a plugin's declared metrics, the updates it makes and its series budget;
//! - `schedules` (feature `schedules`): a plugin's cron schedules and their ticks.

pub mod applyset;
pub mod metrics;
mod names;
#[cfg(feature = "schedules")]
pub mod schedules;

pub use names::shown;
