//! wasm-controller-manager: a Kubernetes controller manager whose reconcilers are sandboxed
//! WebAssembly components. See docs/architecture.md for the stages and how they connect:
//!
//! - `contract`: the WIT types every stage shares, and the validation of guest values;
//! - `loading`: the plugins directory, settings, `inspect`;
//! - `engine`: informers, caches, work queues, controllers;
//! - `sandbox`: the wasmtime runtime and the host functions;
//! - `cluster`: API calls, identities, permissions, events on a plugin's behalf;
//! - `serving`: `/metrics`, `/healthz`, `/readyz`, `/plugins`;
//! - `app`: wires them together for `run`.

pub mod app;
pub mod cluster;
pub mod contract;
pub mod engine;
pub mod loading;
pub mod metrics;
pub mod plugin_metrics;
mod safe_fs;
pub mod sandbox;
pub mod serving;
pub mod telemetry;
pub use wcm_selector as selector;
