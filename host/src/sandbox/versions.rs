//! The contract versions a plugin can be built against (`wcm:reconciler@0.2.0`, the current one,
//! and `@0.1.0`), behind one call path: a plugin of an earlier version is called through its own
//! bindings and its values converted to the current ones, so the rest of the host knows one
//! contract.

use anyhow::Result;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::call_ctx::CallCtx;
use crate::contract::{self as bindings, Action, Description, ReconcileError, Request, v0_1};

/// A linked component of one of the served versions, ready to instantiate.
pub enum PluginPre {
    Current(bindings::PluginPre<CallCtx>),
    V0_1(v0_1::PluginPre<CallCtx>),
}

/// An instance of a plugin.
pub enum PluginInstance {
    Current(bindings::Plugin),
    V0_1(v0_1::Plugin),
}

impl PluginPre {
    /// Picks the version by the component's exports; fails naming every version served.
    pub fn new(pre: InstancePre<CallCtx>) -> Result<Self> {
        let current = match bindings::PluginPre::new(pre.clone()) {
            Ok(p) => return Ok(PluginPre::Current(p)),
            Err(e) => e,
        };
        match v0_1::PluginPre::new(pre) {
            Ok(p) => Ok(PluginPre::V0_1(p)),
            Err(old) => Err(anyhow::anyhow!(
                "not a plugin of world wcm:reconciler/plugin@0.2.0 ({current:#}) nor of \
                 @0.1.0 ({old:#})"
            )),
        }
    }

    /// The contract version the plugin was built against.
    pub fn version(&self) -> &'static str {
        match self {
            PluginPre::Current(_) => "wcm:reconciler@0.2.0",
            PluginPre::V0_1(_) => "wcm:reconciler@0.1.0",
        }
    }

    pub async fn instantiate_async(
        &self,
        store: &mut Store<CallCtx>,
    ) -> wasmtime::Result<PluginInstance> {
        Ok(match self {
            PluginPre::Current(p) => PluginInstance::Current(p.instantiate_async(store).await?),
            PluginPre::V0_1(p) => PluginInstance::V0_1(p.instantiate_async(store).await?),
        })
    }
}

impl PluginInstance {
    pub async fn describe(&self, store: &mut Store<CallCtx>) -> wasmtime::Result<Description> {
        match self {
            PluginInstance::Current(p) => p.wcm_reconciler_reconciler().call_describe(store).await,
            PluginInstance::V0_1(p) => {
                let old = p.wcm_reconciler_reconciler().call_describe(store).await?;
                // Same records, field for field: converted once per load.
                let value = serde_json::to_value(old)?;
                Ok(serde_json::from_value(value)?)
            }
        }
    }

    pub async fn reconcile(
        &self,
        store: &mut Store<CallCtx>,
        req: &Request,
    ) -> wasmtime::Result<Result<Action, ReconcileError>> {
        match self {
            PluginInstance::Current(p) => {
                p.wcm_reconciler_reconciler()
                    .call_reconcile(store, req)
                    .await
            }
            PluginInstance::V0_1(p) => {
                use v0_1::exports::wcm::reconciler::reconciler as old;
                let old_req = old::Request {
                    key: v0_1::wcm::reconciler::types::ObjectKey {
                        namespace: req.key.namespace.clone(),
                        name: req.key.name.clone(),
                    },
                    object: req.object.clone(),
                    attempt: req.attempt,
                };
                let out = p
                    .wcm_reconciler_reconciler()
                    .call_reconcile(store, &old_req)
                    .await?;
                Ok(match out {
                    Ok(old::Action::Done) => Ok(Action::Done),
                    Ok(old::Action::RequeueAfter(ms)) => Ok(Action::RequeueAfter(ms)),
                    Err(e) => Err(ReconcileError {
                        message: e.message,
                        terminal: e.terminal,
                        retry_after_ms: None,
                    }),
                })
            }
        }
    }
}
