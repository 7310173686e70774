//! `shard-stamper`: for sharding tests. Each ConfigMap it reconciles whose `data.value` differs
//! from its `wcm.test/stamped` annotation gets, in one patch, `wcm.test/stamped` = that value,
//! `wcm.test/by` = the replica named by its `replica` setting (NAME.toml `config`), and
//! `wcm.test/at` = the reconcile's start (milliseconds since the Unix epoch). With `burn_k` set,
//! each reconcile first does that many thousand steps of arithmetic: a fixed amount of CPU work,
//! whatever the CPU quota (the sharding benchmark's ~1 ms plugin; it measures the CPU it takes).
//! A deletion reconcile (no object) reads the ConfigMap by name, as a plugin about to clean up
//! after an object makes sure it is gone: the API server's audit log shows which replica
//! reconciled which key as deleted.

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request};

const STAMPED: &str = "wcm.test/stamped";

struct ShardStamper;

impl Reconciler for ShardStamper {
    fn describe() -> Description {
        test_plugins::configmap_plugin("shard-stamper")
            .permission(Permission::of::<ConfigMap>(&["get", "patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let Some(cm) = req.object::<ConfigMap>()? else {
            ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
                .get_opt(req.name())?;
            return Ok(Action::done());
        };
        if let Some(k) = ctx.config_parse::<u64>("burn_k")? {
            burn(k.min(100_000));
        }
        let value = test_plugins::value_of(&cm);
        let stamped = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(STAMPED));
        if stamped.map(String::as_str) == Some(value) {
            return Ok(Action::done());
        }
        let replica = ctx.config("replica").unwrap_or_default();
        ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
            .patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    STAMPED: value,
                    "wcm.test/by": replica,
                    "wcm.test/at": started.to_string(),
                }}})),
            )?;
        Ok(Action::done())
    }
}

/// `k` thousand steps of a linear congruential generator.
fn burn(k: u64) {
    let mut x: u64 = 1;
    for _ in 0..k {
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
        x = std::hint::black_box(x);
    }
}

wcm_sdk::export_plugin!(ShardStamper);
