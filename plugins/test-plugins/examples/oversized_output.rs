//! `oversized-output`: sends a merge patch whose body carries an 8 MiB annotation value, to test
//! the host's cap on what a plugin may send. Whatever the host answers is returned as the
//! reconcile's outcome (if the host traps the plugin instead, the call never returns).

use wcm_sdk::{
    Action, Context, Description, Error, KindRef, PatchType, Permission, Reconciler, Request,
};

struct OversizedOutput;

const VALUE_BYTES: usize = 8 << 20;

impl Reconciler for OversizedOutput {
    fn describe() -> Description {
        test_plugins::configmap_plugin("oversized-output").permission(Permission::new(
            "",
            "configmaps",
            &["get", "patch"],
        ))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        if req.is_deleted() {
            return Ok(Action::done());
        }
        // Built as text in one buffer, through the raw host call: a JSON value would hold copies.
        let (head, tail) = (
            r#"{"metadata":{"annotations":{"wcm.test/oversized":""#,
            r#""}}}"#,
        );
        let mut body = String::with_capacity(head.len() + VALUE_BYTES + tail.len());
        body.push_str(head);
        body.extend(std::iter::repeat_n('x', VALUE_BYTES));
        body.push_str(tail);
        let kind = KindRef::new("", "v1", "ConfigMap");
        ctx.host()
            .patch(
                &kind,
                &req.key,
                PatchType::Merge,
                &body,
                &Default::default(),
            )
            .map_err(|e| Error::from(e).context("oversized patch"))?;
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(OversizedOutput);
