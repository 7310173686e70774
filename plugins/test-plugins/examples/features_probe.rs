//! `features-probe`: the guest of the contract-0.3 features benchmark (`host/benches/features.rs`).
//! Its primaries are the ConfigMaps labelled `wcm.bench/features`; what a reconcile does is set by
//! its NAME.toml `[config]`, so one component runs every variant and a change of NAME.toml (an
//! in-place swap) reconciles every primary again:
//! - `children`: absent, no set of children is returned (the baseline); `K`, the full set is K
//!   ConfigMaps `<primary>-c0 … -c<K-1>` (0: the empty set, which prunes what was there);
//! - `metrics = "true"`: counter `reconciles{result="ok"}` + 1 and one observation of the histogram
//!   `children` per reconcile (children-probe's two updates);
//! - `flood = "F"` (with `metrics`): the counter also gets F series of its own per primary
//!   (`<primary>-0 … -<F-1>`), to fill the series budget;
//! - `round`: read by nobody; changing it is how the benchmark forces a re-reconcile of every key.

use k8s_openapi::api::core::v1::ConfigMap;
use wcm_sdk::{
    Action, Children, Context, Description, Error, Metric, Permission, Reconciler, Request, Watch,
};

struct FeaturesProbe;

impl Reconciler for FeaturesProbe {
    fn describe() -> Description {
        Description::new("features-probe", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.bench/features"))
            // The host records the ApplySet on the primary.
            .permission(Permission::of::<ConfigMap>(&["patch"]))
            .owns::<ConfigMap>()
            .metric(Metric::counter("reconciles", "Reconciles, by result.").labels(&["result"]))
            .metric(
                Metric::histogram("children", "Children returned per reconcile.")
                    .buckets(&[1.0, 2.0, 4.0, 8.0]),
            )
            .config_key("children")
            .config_key("metrics")
            .config_key("flood")
            .config_key("round")
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let name = cm.metadata.name.unwrap_or_default();
        let wanted: Option<u32> = ctx.config_parse("children")?;
        let mut children = Children::new();
        for i in 0..wanted.unwrap_or(0) {
            children = children.add(&ConfigMap {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(format!("{name}-c{i}")),
                    ..Default::default()
                },
                data: Some([("owner".to_string(), name.clone())].into()),
                ..Default::default()
            })?;
        }
        if ctx.config("metrics").as_deref() == Some("true") {
            let flood: u32 = ctx.config_parse("flood")?.unwrap_or(0);
            for i in 0..flood {
                // Refused past the series budget; the reconcile goes on.
                let _ = ctx.metrics().inc("reconciles", &[&format!("{name}-{i}")]);
            }
            let _ = ctx.metrics().inc("reconciles", &["ok"]);
            let _ = ctx
                .metrics()
                .observe("children", &[], children.len() as f64);
        }
        Ok(match wanted {
            Some(_) => Action::done().with_children(children),
            None => Action::done(),
        })
    }
}

wcm_sdk::export_plugin!(FeaturesProbe);
