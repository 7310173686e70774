//! `secret-reader`: watches the Secrets of namespace `wcm-sr` and declares nothing else. Its
//! identity gets no grant unless the operator applies one, so the host must not serve it a single
//! Secret before that. Once running it logs each Secret's key (never its data).

use k8s_openapi::api::core::v1::Secret;
use wcm_sdk::{Action, Context, Description, Error, Reconciler, Request, Watch};

struct SecretReader;

impl Reconciler for SecretReader {
    fn describe() -> Description {
        Description::new("secret-reader", test_plugins::VERSION)
            .primary(Watch::of::<Secret>().namespace("wcm-sr"))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        ctx.log()
            .info("secret seen", &[("key", &req.key.to_string())]);
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(SecretReader);
