//! Rust bindings of `wit/reconciler.wit` (world `plugin`), generated at compile time.
//!
//! Host functions are async (API calls await the network on a fiber) and trappable (a plugin
//! that exceeds a cap is stopped, not answered).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "wcm:reconciler/plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    // A hot reload compares the new description with the running one.
    additional_derives: [PartialEq],
});

pub use exports::wcm::reconciler::reconciler::{Action, Description, ReconcileError, Request};
pub use wcm::reconciler::types::{
    ApiError, KindRef, Mapping, ObjectKey, Permission, Secondary, Watch,
};
