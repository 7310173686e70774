//! The SDK's controller helpers (owner references, create-or-update, status only if changed) and
//! MockHost's cluster-side operations, against MockHost as a plugin's unit test uses them.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use wcm_sdk::helpers::{self, Outcome};
use wcm_sdk::testing::{MockHost, Verb};
use wcm_sdk::{Context, KindRef, ObjectKey, PatchType};

fn owner() -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("foo".into()),
            namespace: Some("ns".into()),
            uid: Some("owner-uid".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn deploy_kind() -> KindRef {
    KindRef::new("apps", "v1", "Deployment")
}

#[test]
fn a_controller_ref_blocks_owner_deletion_as_upstreams_new_controller_ref() {
    let r = helpers::controller_ref(&owner()).expect("stored owner");
    assert_eq!(r.controller, Some(true));
    assert_eq!(r.block_owner_deletion, Some(true));
    assert_eq!(
        (r.kind.as_str(), r.uid.as_str()),
        ("ConfigMap", "owner-uid")
    );
}

#[test]
fn is_controlled_by_compares_the_controller_refs_uid() {
    let o = owner();
    let mut child = Deployment::default();
    assert!(!helpers::is_controlled_by(&child, &o));
    child.metadata.owner_references = helpers::controller_ref(&o).map(|r| vec![r]);
    assert!(helpers::is_controlled_by(&child, &o));
    // Same name, another incarnation (uid): not controlled by it.
    let mut other = o.clone();
    other.metadata.uid = Some("new-uid".into());
    assert!(!helpers::is_controlled_by(&child, &other));
    // An owner reference that is not the controller does not count.
    child.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
    assert!(!helpers::is_controlled_by(&child, &o));
}

#[test]
fn create_or_update_creates_then_updates_then_writes_nothing_when_unchanged() {
    let host = MockHost::new();
    let ctx: Context = host.context();
    let api = ctx.api_namespaced::<Deployment>("ns");
    let set = |replicas| {
        move |d: &mut Deployment| {
            d.spec.get_or_insert_with(DeploymentSpec::default).replicas = Some(replicas);
        }
    };
    let (_, done) = helpers::create_or_update(&api, "web", set(1)).unwrap();
    assert_eq!(done, Outcome::Created);
    let (d, done) = helpers::create_or_update(&api, "web", set(2)).unwrap();
    assert_eq!(done, Outcome::Updated);
    assert_eq!(d.spec.unwrap().replicas, Some(2));
    let writes = host.calls().len();
    let (_, done) = helpers::create_or_update(&api, "web", set(2)).unwrap();
    assert_eq!(done, Outcome::Unchanged);
    assert_eq!(
        host.calls().len(),
        writes + 1,
        "only the read: {:?}",
        host.calls()
    );
}

#[test]
fn apply_creates_or_updates_in_one_server_side_apply() {
    let host = MockHost::new();
    let ctx: Context = host.context();
    let api = ctx.api_namespaced::<Deployment>("ns");
    let mut d = Deployment::default();
    d.metadata.name = Some("web".into());
    d.spec = Some(DeploymentSpec {
        replicas: Some(3),
        ..DeploymentSpec::default()
    });
    let stored = helpers::apply(&api, &d).unwrap();
    assert_eq!(stored.spec.unwrap().replicas, Some(3));
    let calls = host.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].patch_type, Some(PatchType::Apply));
    let body = calls[0].body.as_ref().unwrap();
    assert_eq!(body["kind"], "Deployment");
    assert_eq!(body["apiVersion"], "apps/v1");
}

#[test]
fn apply_refuses_an_object_read_back_from_the_cluster() {
    let host = MockHost::new();
    host.seed(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns", "finalizers": ["other.example/cleanup"]}}));
    let ctx: Context = host.context();
    let api = ctx.api_namespaced::<Deployment>("ns");
    let read = api.get("web").unwrap();
    host.clear_records();
    let err = helpers::apply(&api, &read).expect_err("refused");
    assert_eq!(err.code, 400, "{err:?}");
    assert!(err.message.contains("read from the cluster"), "{err:?}");
    assert!(host.calls().is_empty(), "nothing sent");
}

#[test]
fn a_status_written_from_a_stale_read_keeps_what_the_read_did_not_hold() {
    let host = MockHost::new();
    host.seed(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns"}, "status": {"replicas": 1}}));
    let ctx: Context = host.context();
    let api = ctx.api_namespaced::<Deployment>("ns");
    let stale = api.get("web").unwrap();
    // Another writer adds to the status after the read.
    host.cluster()
        .patch_status(
            &wcm_sdk::KindRef::of::<Deployment>(),
            &wcm_sdk::ObjectKey::namespaced("ns", "web"),
            json!({"status": {"readyReplicas": 1}}),
        )
        .unwrap();
    let mut status = stale.status.clone().unwrap_or_default();
    status.replicas = Some(2);
    assert!(helpers::write_status_if_changed(&api, &stale, &status).unwrap());
    let now = api.get("web").unwrap().status.unwrap_or_default();
    assert_eq!(now.replicas, Some(2));
    assert_eq!(
        now.ready_replicas,
        Some(1),
        "the other writer's field is kept"
    );
}

#[test]
fn the_status_is_written_only_when_it_changed_and_removed_fields_are_cleared() {
    let host = MockHost::new();
    host.seed(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns"},
        "status": {"replicas": 2, "readyReplicas": 2}}));
    let ctx: Context = host.context();
    let api = ctx.api_namespaced::<Deployment>("ns");
    let d = api.get("web").unwrap();
    let same = d.status.clone().unwrap();
    assert!(!helpers::write_status_if_changed(&api, &d, &same).unwrap());
    assert!(!host.calls().iter().any(|c| c.verb == Verb::PatchStatus));
    let fewer = DeploymentStatus {
        replicas: Some(3),
        ..DeploymentStatus::default()
    };
    assert!(helpers::write_status_if_changed(&api, &d, &fewer).unwrap());
    let now = api.get("web").unwrap().status.unwrap();
    assert_eq!(now.replicas, Some(3));
    assert_eq!(now.ready_replicas, None, "a field left out is cleared");
}

#[test]
fn the_cluster_acts_without_the_plugins_permissions_and_the_cache_follows() {
    struct P;
    impl wcm_sdk::Reconciler for P {
        fn describe() -> wcm_sdk::Description {
            // No permission at all on Deployments.
            wcm_sdk::Description::new("p", "1.0.0").primary(wcm_sdk::Watch::of::<Deployment>())
        }
        fn reconcile(_: &Context, _: wcm_sdk::Request) -> Result<wcm_sdk::Action, wcm_sdk::Error> {
            Ok(wcm_sdk::Action::done())
        }
    }
    let host = MockHost::for_reconciler::<P>();
    host.seed(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns"}}));
    let key = ObjectKey::namespaced("ns", "web");
    let ctx: Context = host.context();
    assert_eq!(
        ctx.api_namespaced::<Deployment>("ns")
            .delete("web")
            .unwrap_err()
            .code,
        403,
        "the plugin may not"
    );
    host.clear_records();
    host.cluster()
        .patch_status(
            &deploy_kind(),
            &key,
            json!({"status": {"readyReplicas": 1}}),
        )
        .unwrap();
    let cached = ctx
        .cache::<Deployment>()
        .get(&key)
        .unwrap()
        .expect("in the cache");
    assert_eq!(cached.status.unwrap().ready_replicas, Some(1));
    host.cluster().delete(&deploy_kind(), &key).unwrap();
    assert!(host.object_value(&deploy_kind(), &key).is_none());
    assert!(ctx.cache::<Deployment>().get(&key).unwrap().is_none());
    assert!(
        host.calls().is_empty(),
        "not the plugin's calls: {:?}",
        host.calls()
    );
}
