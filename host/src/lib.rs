//! wasm-controller-manager: a Kubernetes controller manager whose reconcilers are sandboxed
//! WebAssembly components. See docs/architecture.md for the five parts and how they connect.

pub mod app;
pub mod cache;
pub mod controller;
pub mod events;
pub mod informer;
pub mod inspect;
pub mod kubeapi;
pub mod metrics;
pub mod permissions;
pub mod plugin_files;
pub mod plugins;
pub mod queue;
pub mod rate_limit;
pub mod sandbox;
pub use wcm_selector as selector;
pub mod services;
pub mod settings;
