//! Contract 0.3 in MockHost: children applied and pruned as the host does, and the plugin's own
//! metrics kept with the host's rules.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use serde_json::{Value, json};
use wcm_sdk::testing::{MockHost, Verb};
use wcm_sdk::{
    Action, Children, Context, Description, Error, EventType, KindRef, Metric, ObjectKey,
    Permission, Reconciler, Request, Watch,
};

const UID: &str = "6f1e2d3c-0000-4000-8000-000000000001";

/// One ConfigMap per watched ConfigMap "app", plus a Service while `data.service` is "yes", plus
/// a Secret (which it does not declare) while `data.secret` is "yes".
struct Owner;

fn child_cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("from".to_string(), "owner".to_string())].into());
    cm
}

impl Reconciler for Owner {
    fn describe() -> Description {
        Description::new("owner", "1.0.0")
            .primary(Watch::of::<Deployment>())
            .permission(Permission::of::<Deployment>(&["patch"]))
            .owns::<ConfigMap>()
            .owns::<Service>()
            .metric(Metric::counter("reconciles", "Reconciles by result.").labels(&["result"]))
            .metric(
                Metric::histogram("children", "Children per reconcile.").buckets(&[1.0, 2.0, 4.0]),
            )
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(d) = req.object::<Deployment>()? else {
            return Ok(Action::done());
        };
        let labels = d.metadata.labels.clone().unwrap_or_default();
        let mut children = Children::new().add(&child_cm("settings"))?;
        if labels.get("service").map(String::as_str) == Some("yes") {
            let mut svc = Service::default();
            svc.metadata.name = Some("web".into());
            children = children.add(&svc)?;
        }
        if labels.get("secret").map(String::as_str) == Some("yes") {
            let mut s = Secret::default();
            s.metadata.name = Some("creds".into());
            children = children.add(&s)?;
        }
        let _ = ctx.metrics().inc("reconciles", &["ok"]);
        let _ = ctx
            .metrics()
            .observe("children", &[], children.len() as f64);
        Ok(Action::done().with_children(children))
    }
}

fn deployment(labels: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "app", "namespace": "team", "uid": UID, "labels": labels}})
}

fn key() -> ObjectKey {
    ObjectKey::namespaced("team", "app")
}

fn stored(host: &MockHost, kind: KindRef, name: &str) -> Option<Value> {
    host.object_value(&kind, &ObjectKey::namespaced("team", name))
}

#[test]
fn children_are_applied_owned_labelled_and_pruned_but_never_what_the_plugin_did_not_apply() {
    let host = MockHost::for_reconciler::<Owner>();
    host.seed(&deployment(json!({"service": "yes"})));
    host.run::<Owner>(key()).expect("reconciled");

    let cm = stored(&host, KindRef::of::<ConfigMap>(), "settings").expect("applied");
    let owner = &cm["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["uid"].as_str(), owner["controller"].as_bool()),
        (Some(UID), Some(true))
    );
    assert_eq!(owner["blockOwnerDeletion"], true);
    let id = cm["metadata"]["labels"]["applyset.kubernetes.io/part-of"]
        .as_str()
        .expect("member label")
        .to_string();
    assert!(stored(&host, KindRef::of::<Service>(), "web").is_some());
    let parent = stored(&host, KindRef::of::<Deployment>(), "app").expect("primary");
    assert_eq!(
        parent["metadata"]["labels"]["applyset.kubernetes.io/id"],
        json!(id)
    );
    assert_eq!(
        parent["metadata"]["annotations"]["applyset.kubernetes.io/contains-group-kinds"],
        "ConfigMap,Service"
    );

    // A Service with the same member label that the plugin did not apply.
    host.seed(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "by-hand",
        "namespace": "team", "labels": {"applyset.kubernetes.io/part-of": id},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "app", "uid": UID, "controller": true}]}}));
    // The Service leaves the set (a label of the primary changes; what the host recorded on it
    // stays): exactly it is deleted.
    let mut parent = parent;
    parent["metadata"]["labels"]["service"] = json!("no");
    host.seed(&parent);
    host.sync_cache();
    host.run::<Owner>(key()).expect("reconciled");
    assert!(
        stored(&host, KindRef::of::<Service>(), "web").is_none(),
        "pruned"
    );
    assert!(
        stored(&host, KindRef::of::<Service>(), "by-hand").is_some(),
        "never pruned"
    );
    assert!(stored(&host, KindRef::of::<ConfigMap>(), "settings").is_some());
    let deletes: Vec<_> = host
        .calls()
        .into_iter()
        .filter(|c| c.verb == Verb::Delete)
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    let pruned = host
        .events()
        .into_iter()
        .filter(|e| e.reason == "ChildPruned")
        .count();
    assert_eq!(pruned, 1);
    // The record shrank to what is left.
    let parent = stored(&host, KindRef::of::<Deployment>(), "app").expect("primary");
    assert_eq!(
        parent["metadata"]["annotations"]["applyset.kubernetes.io/contains-group-kinds"],
        "ConfigMap"
    );
}

#[test]
fn a_child_of_an_undeclared_kind_fails_alone_with_an_event_and_a_terminal_error() {
    let host = MockHost::for_reconciler::<Owner>();
    host.seed(&deployment(json!({"secret": "yes"})));
    let err = host
        .run::<Owner>(key())
        .expect_err("the Secret is not declared");
    assert!(err.is_terminal(), "{err}");
    assert!(
        err.message().contains("Secret \"creds\": 403 NotDeclared"),
        "{err}"
    );
    assert!(
        stored(&host, KindRef::of::<ConfigMap>(), "settings").is_some(),
        "the others are applied"
    );
    assert!(stored(&host, KindRef::of::<Secret>(), "creds").is_none());
    let warned: Vec<_> = host
        .events()
        .into_iter()
        .filter(|e| e.reason == "ChildFailed" && e.event_type == EventType::Warning)
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
}

#[test]
fn an_object_made_before_the_cache_saw_it_is_not_taken_over_and_the_primarys_own_is_applied_with_its_uid()
 {
    let host = MockHost::for_reconciler::<Owner>();
    host.seed(&deployment(json!({})));
    // Someone made ConfigMap "settings" a moment ago: the API server has it, the cache not yet.
    host.seed_api(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "team"}, "data": {"from": "someone"}}));
    let err = host.run::<Owner>(key()).expect_err("not taken over");
    assert!(
        err.message()
            .contains("ConfigMap \"settings\": 409 AlreadyExists"),
        "{err}"
    );
    assert!(
        host.events()
            .iter()
            .any(|e| e.reason == "ChildFailed" && e.note.contains("not taken over")),
        "{:?}",
        host.events()
    );
    let cm = stored(&host, KindRef::of::<ConfigMap>(), "settings").expect("still there");
    assert_eq!(cm["data"]["from"], "someone");
    assert!(cm["metadata"]["ownerReferences"].is_null(), "{cm}");

    // Once it is gone, the child is created (POST), then applied with its UID.
    host.cluster()
        .delete(
            &KindRef::of::<ConfigMap>(),
            &ObjectKey::namespaced("team", "settings"),
        )
        .expect("deleted");
    host.sync_cache().clear_records();
    host.run::<Owner>(key()).expect("reconciled");
    let verbs: Vec<Verb> = host
        .calls()
        .into_iter()
        .filter(|c| c.name.as_deref() == Some("settings") || c.verb == Verb::Create)
        .map(|c| c.verb)
        .collect();
    assert_eq!(
        verbs,
        vec![Verb::Create, Verb::Patch, Verb::Patch],
        "create first, then apply, then drop the create's Update entry (a JSON patch)"
    );
    let cm = stored(&host, KindRef::of::<ConfigMap>(), "settings").expect("applied");
    let managers: Vec<(String, String)> = cm["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| (m["manager"].to_string(), m["operation"].to_string()))
        .collect();
    assert_eq!(
        managers,
        vec![("\"wcm:owner\"".to_string(), "\"Apply\"".to_string())],
        "only the apply's entry"
    );
    assert_eq!(cm["data"]["from"], "owner");
    assert_eq!(cm["metadata"]["ownerReferences"][0]["uid"], UID);
}

#[test]
fn metrics_are_kept_and_a_label_flood_stops_at_the_series_budget() {
    let host = MockHost::for_reconciler::<Owner>();
    host.seed(&deployment(json!({"service": "yes"})));
    host.run::<Owner>(key()).expect("reconciled");
    host.run::<Owner>(key()).expect("reconciled");
    assert_eq!(host.metric_value("reconciles", &["ok"]), Some(2.0));
    assert_eq!(host.histogram("children", &[]), Some((2, 4.0)));

    host.with_metric_series(5);
    let ctx = host.context();
    let refused = (0..20)
        .filter(|i| {
            ctx.metrics()
                .inc("reconciles", &[&format!("r{i}")])
                .is_err()
        })
        .count();
    assert_eq!(refused, 15);
    assert_eq!(host.metric_refusals().get("series-budget"), Some(&15));
    assert!(
        ctx.metrics().set("reconciles", &["ok"], 1.0).is_err(),
        "a counter is not set"
    );
    assert!(ctx.metrics().inc("undeclared", &[]).is_err());
}
