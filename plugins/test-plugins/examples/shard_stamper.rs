//! `shard-stamper`: for sharding tests. Each ConfigMap it reconciles whose `data.value` differs
//! from its `wcm.test/stamped` annotation gets, in one patch, `wcm.test/stamped` = that value,
//! `wcm.test/by` = the replica named by its `replica` setting (NAME.toml `config`), and
//! `wcm.test/at` = the reconcile's start (milliseconds since the Unix epoch). With `burn_ms` set,
//! each reconcile first spends about that much guest CPU (the benchmark's ~1 ms plugin).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request};

const STAMPED: &str = "wcm.test/stamped";

struct ShardStamper;

impl Reconciler for ShardStamper {
    fn describe() -> Description {
        test_plugins::configmap_plugin("shard-stamper")
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        if let Some(ms) = ctx.config_parse::<u64>("burn_ms")? {
            burn(Duration::from_millis(ms.min(100)));
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

/// Spends about `d` of CPU.
fn burn(d: Duration) {
    let start = Instant::now();
    let mut x: u64 = 1;
    while start.elapsed() < d {
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
        std::hint::black_box(x);
    }
}

wcm_sdk::export_plugin!(ShardStamper);
