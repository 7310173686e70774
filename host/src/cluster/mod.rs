//! What plugins reach in the cluster, always on their behalf: API calls and event writes made under
//! the plugin's own identity, so the API server's RBAC decides and its audit log tells plugins apart;
//! the declared permissions as a first fence that costs the API server nothing. Also the host's own
//! dealings with the cluster: discovery and leader election.

pub mod api;
pub mod discovery;
pub mod election;
pub mod events;
pub mod identity;
pub mod layouts;
pub mod leader;
pub mod permissions;
pub mod rbac;
pub mod reach;
pub mod scope;
pub mod services;
pub mod shards;
pub mod tenure;
