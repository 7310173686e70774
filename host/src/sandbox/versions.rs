//! The contract versions a plugin can be built against (`wcm:reconciler@0.3.0`, the current one,
//! `@0.2.0` and `@0.1.0`), behind one call path: a plugin of an earlier version is called through its own
//! bindings and its values converted to the current ones, so the rest of the host knows one
//! contract.

use anyhow::Result;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::call_ctx::CallCtx;
use crate::contract::{
    self as bindings, Action, Description, Outcome, ReconcileError, Request, v0_1, v0_2,
};

/// A linked component of one of the served versions, ready to instantiate.
pub enum PluginPre {
    Current(bindings::PluginPre<CallCtx>),
    V0_2(v0_2::PluginPre<CallCtx>),
    V0_1(v0_1::PluginPre<CallCtx>),
}

/// An instance of a plugin.
pub enum PluginInstance {
    Current(bindings::Plugin),
    V0_2(v0_2::Plugin),
    V0_1(v0_1::Plugin),
}

impl PluginPre {
    /// Picks the version by the component's exports; fails naming every version served.
    pub fn new(pre: InstancePre<CallCtx>) -> Result<Self> {
        let current = match bindings::PluginPre::new(pre.clone()) {
            Ok(p) => return Ok(PluginPre::Current(p)),
            Err(e) => e,
        };
        let v0_2 = match v0_2::PluginPre::new(pre.clone()) {
            Ok(p) => return Ok(PluginPre::V0_2(p)),
            Err(e) => e,
        };
        match v0_1::PluginPre::new(pre) {
            Ok(p) => Ok(PluginPre::V0_1(p)),
            Err(old) => Err(anyhow::anyhow!(
                "not a plugin of world wcm:reconciler/plugin@0.3.0 ({current:#}) nor of \
                 @0.2.0 ({v0_2:#}) nor of @0.1.0 ({old:#})"
            )),
        }
    }

    /// The contract version the plugin was built against.
    pub fn version(&self) -> &'static str {
        match self {
            PluginPre::Current(_) => "wcm:reconciler@0.3.0",
            PluginPre::V0_2(_) => "wcm:reconciler@0.2.0",
            PluginPre::V0_1(_) => "wcm:reconciler@0.1.0",
        }
    }

    pub async fn instantiate_async(
        &self,
        store: &mut Store<CallCtx>,
    ) -> wasmtime::Result<PluginInstance> {
        Ok(match self {
            PluginPre::Current(p) => PluginInstance::Current(p.instantiate_async(store).await?),
            PluginPre::V0_2(p) => PluginInstance::V0_2(p.instantiate_async(store).await?),
            PluginPre::V0_1(p) => PluginInstance::V0_1(p.instantiate_async(store).await?),
        })
    }
}

impl PluginInstance {
    pub async fn describe(&self, store: &mut Store<CallCtx>) -> wasmtime::Result<Description> {
        match self {
            PluginInstance::Current(p) => p.wcm_reconciler_reconciler().call_describe(store).await,
            PluginInstance::V0_2(p) => {
                let old = p.wcm_reconciler_reconciler().call_describe(store).await?;
                described(serde_json::to_value(old)?)
            }
            PluginInstance::V0_1(p) => {
                let old = p.wcm_reconciler_reconciler().call_describe(store).await?;
                described(serde_json::to_value(old)?)
            }
        }
    }

    pub async fn reconcile(
        &self,
        store: &mut Store<CallCtx>,
        req: &Request,
    ) -> wasmtime::Result<Result<Outcome, ReconcileError>> {
        // An earlier version's action is an outcome that leaves children alone.
        let outcome = |action| Outcome {
            action,
            children: None,
        };
        match self {
            PluginInstance::Current(p) => {
                p.wcm_reconciler_reconciler()
                    .call_reconcile(store, req)
                    .await
            }
            PluginInstance::V0_2(p) => {
                use v0_2::exports::wcm::reconciler::reconciler as old;
                // Same fields but `scheduled`, which 0.2 does not know (serde drops it).
                let old_req: old::Request = serde_json::from_value(serde_json::to_value(req)?)?;
                let out = p
                    .wcm_reconciler_reconciler()
                    .call_reconcile(store, &old_req)
                    .await?;
                Ok(match out {
                    Ok(old::Action::Done) => Ok(outcome(Action::Done)),
                    Ok(old::Action::RequeueAfter(ms)) => Ok(outcome(Action::RequeueAfter(ms))),
                    Err(e) => Err(ReconcileError {
                        message: e.message,
                        terminal: e.terminal,
                        retry_after_ms: e.retry_after_ms,
                    }),
                })
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
                    Ok(old::Action::Done) => Ok(outcome(Action::Done)),
                    Ok(old::Action::RequeueAfter(ms)) => Ok(outcome(Action::RequeueAfter(ms))),
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

/// An earlier version's description as the current one: the same fields, and none of what 0.3
/// added (no schedules, no metrics, no trace context). Converted once per load.
fn described(mut old: serde_json::Value) -> wasmtime::Result<Description> {
    if let Some(fields) = old.as_object_mut() {
        fields.insert("schedules".into(), serde_json::json!([]));
        fields.insert("metrics".into(), serde_json::json!([]));
        fields.insert("propagate_trace_context".into(), serde_json::json!(false));
    }
    Ok(serde_json::from_value(old)?)
}
