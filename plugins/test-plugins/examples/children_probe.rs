//! `children-probe`: returns the children its primary ConfigMap (label `wcm.test/children`)
//! asks for, and updates its own metrics, so a test can judge by what the API server stores:
//! - `data.children`: a comma-separated list of `Kind/name` (`ConfigMap/a`, `Service/web`,
//!   `Secret/s`): each becomes a child (a Service on port 80; a Secret is a kind the plugin
//!   does not declare);
//! - `data.flood`: a number N: the counter `reconciles` is increased for N distinct label values
//!   (a label flood, which the host's series budget stops);
//! - every reconcile: `reconciles{result="ok"}` + 1, and the number of children observed in the
//!   histogram `children`.

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use wcm_sdk::{
    Action, Children, Context, Description, Error, Metric, Permission, Reconciler, Request, Watch,
};

struct ChildrenProbe;

fn meta(name: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

impl Reconciler for ChildrenProbe {
    fn describe() -> Description {
        Description::new("children-probe", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.test/children"))
            // The host records the ApplySet on the primary.
            .permission(Permission::of::<ConfigMap>(&["patch"]))
            .owns::<ConfigMap>()
            .owns::<Service>()
            .metric(Metric::counter("reconciles", "Reconciles, by result.").labels(&["result"]))
            .metric(
                Metric::histogram("children", "Children returned per reconcile.")
                    .buckets(&[1.0, 2.0, 4.0, 8.0]),
            )
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let data = cm.data.unwrap_or_default();
        let mut children = Children::new();
        for entry in data
            .get("children")
            .map(String::as_str)
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let Some((kind, name)) = entry.split_once('/') else {
                return Err(Error::terminal(format!("bad entry {entry:?}")));
            };
            children = match kind {
                "ConfigMap" => children.add(&ConfigMap {
                    metadata: meta(name),
                    data: Some([("owner".to_string(), req.name().to_string())].into()),
                    ..Default::default()
                })?,
                "Service" => children.add(&Service {
                    metadata: meta(name),
                    spec: Some(ServiceSpec {
                        ports: Some(vec![ServicePort {
                            port: 80,
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                })?,
                "Secret" => children.add(&Secret {
                    metadata: meta(name),
                    ..Default::default()
                })?,
                other => return Err(Error::terminal(format!("unknown kind {other:?}"))),
            };
        }
        let flood: u32 = data.get("flood").and_then(|n| n.parse().ok()).unwrap_or(0);
        for i in 0..flood {
            // Refused past the series budget; the reconcile goes on.
            let _ = ctx.metrics().inc("reconciles", &[&format!("flood-{i}")]);
        }
        let _ = ctx.metrics().inc("reconciles", &["ok"]);
        let _ = ctx
            .metrics()
            .observe("children", &[], children.len() as f64);
        Ok(Action::done().with_children(children))
    }
}

wcm_sdk::export_plugin!(ChildrenProbe);
