//! `typed-pod-noop`: watches Pods and parses each request's object into a k8s-openapi `Pod`, then
//! does nothing: the dispatch benchmark's typed guest.

use k8s_openapi::api::core::v1::Pod;
use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request, Watch};

struct TypedPodNoop;

impl Reconciler for TypedPodNoop {
    fn describe() -> Description {
        Description::new("typed-pod-noop", test_plugins::VERSION).primary(Watch::of::<Pod>())
    }

    fn reconcile(_ctx: &Context, req: Request) -> Result<Action, Error> {
        if let Some(json) = &req.object {
            let pod: Pod = serde_json::from_str(json)
                .map_err(|e| Error::terminal(format!("reading pod {}: {e}", req.key)))?;
            std::hint::black_box(&pod);
        }
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(TypedPodNoop);
