//! The engine: shared informers and their caches, rate-limited work queues, and one controller per
//! running plugin that turns changes into keys and keys into calls.
//!
//! Guarantees (client-go's): one list+watch per (kind, namespace, selector, metadata-only) however
//! many plugins use it; a key is never handed to two workers at once; a key changed while in flight
//! is reconciled again after; failures back off per key; a controller starts its workers only after
//! every informer it reads has synced.

pub mod cache;
pub mod controller;
pub mod informer;
pub mod queue;
pub mod rate_limit;
pub mod schedule;
pub mod shard;
pub mod shard_watch;
pub mod sharded;
pub mod shrink;
pub mod subscription;
