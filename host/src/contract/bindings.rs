//! Rust bindings of the contract, generated at compile time: the current version
//! (`wit/reconciler.wit`, `wcm:reconciler@0.3.0`) at the top level, and every earlier
//! version the host still serves in a module of its own (`v0_2`, `v0_1`).
//!
//! Host functions are async (API calls await the network on a fiber) and trappable (a plugin
//! that exceeds a cap is stopped, not answered).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "wcm:reconciler/plugin@0.3.0",
    imports: { default: async | trappable },
    exports: { default: async },
    // A hot reload compares the new description with the running one; an older version's values
    // are converted through serde (same field names).
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

pub use exports::wcm::reconciler::reconciler::{Description, Outcome, ReconcileError, Request};
pub use wcm::reconciler::types::{
    Action, ApiError, Child, KindRef, Mapping, Metric, MetricKind, ObjectKey, Permission, Schedule,
    Secondary, Watch,
};

/// `wcm:reconciler@0.2.0`, frozen in `host/wit-0.2.0/`.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "wit-0.2.0",
        world: "wcm:reconciler/plugin@0.2.0",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
    });
}

/// `wcm:reconciler@0.1.0`, frozen in `host/wit-0.1.0/`.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "wit-0.1.0",
        world: "wcm:reconciler/plugin@0.1.0",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
    });
}
