use super::*;
use wcm_sdk::serde_json::json;
use wcm_sdk::testing::MockHost;
use wcm_sdk::{EventType, KindRef};

const UID: &str = "0b5e6c1a-0000-4000-8000-00000000f00f";

fn a_foo(deployment_name: &str, replicas: i32) -> serde_json::Value {
    json!({"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
        "metadata": {"name": "example-foo", "namespace": "default", "uid": UID},
        "spec": {"deploymentName": deployment_name, "replicas": replicas}})
}

fn run(host: &MockHost) -> Result<Action, Error> {
    host.run::<Typed<SampleController>>(ObjectKey::namespaced("default", "example-foo"))
}

fn deployment(host: &MockHost, name: &str) -> Option<Deployment> {
    host.object::<Deployment>(Some("default"), name)
}

#[test]
fn a_foo_gets_its_deployment_owned_by_it_and_a_status() {
    let host = MockHost::for_reconciler::<Typed<SampleController>>();
    host.seed(&a_foo("example-foo", 1));
    run(&host).expect("reconciled");

    let d = deployment(&host, "example-foo").expect("the Deployment is applied");
    assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(1));
    let owner = &d.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!((owner.uid.as_str(), owner.controller), (UID, Some(true)));
    let stored = host
        .object::<Foo>(Some("default"), "example-foo")
        .expect("the Foo");
    assert_eq!(
        stored.status,
        Some(FooStatus {
            available_replicas: 0
        })
    );
    let synced: Vec<_> = host
        .events()
        .into_iter()
        .filter(|e| e.reason == "Synced")
        .collect();
    assert_eq!(synced.len(), 1);
    assert_eq!(synced[0].event_type, EventType::Normal);
}

#[test]
fn the_status_follows_the_deployments_available_replicas_and_is_written_only_on_a_change() {
    let host = MockHost::for_reconciler::<Typed<SampleController>>();
    host.seed(&a_foo("example-foo", 3));
    run(&host).expect("reconciled");
    // The cluster's Deployment controller reports two available Pods.
    let kind = KindRef::of::<Deployment>();
    let key = ObjectKey::namespaced("default", "example-foo");
    host.cluster()
        .patch_status(&kind, &key, json!({"status": {"availableReplicas": 2}}))
        .expect("status");
    host.sync_cache().clear_records();
    run(&host).expect("reconciled");
    let stored = host
        .object::<Foo>(Some("default"), "example-foo")
        .expect("the Foo");
    assert_eq!(
        stored.status,
        Some(FooStatus {
            available_replicas: 2
        })
    );
    assert!(!host.wakes_itself(&ObjectKey::namespaced("default", "example-foo")));

    host.sync_cache().clear_records();
    run(&host).expect("reconciled");
    assert!(host.events().is_empty(), "nothing changed, no Synced event");
}

#[test]
fn a_new_deployment_name_replaces_the_old_deployment() {
    let host = MockHost::for_reconciler::<Typed<SampleController>>();
    host.seed(&a_foo("web-a", 1));
    run(&host).expect("reconciled");
    assert!(deployment(&host, "web-a").is_some());

    let mut renamed = host
        .object_value(
            &KindRef::of::<Foo>(),
            &ObjectKey::namespaced("default", "example-foo"),
        )
        .expect("the Foo");
    renamed["spec"]["deploymentName"] = json!("web-b");
    host.seed(&renamed);
    host.sync_cache();
    run(&host).expect("reconciled");
    assert!(deployment(&host, "web-b").is_some());
    assert!(
        deployment(&host, "web-a").is_none(),
        "the old one is pruned"
    );
}

#[test]
fn a_deployment_the_foo_does_not_control_is_left_alone_and_reported() {
    let host = MockHost::for_reconciler::<Typed<SampleController>>();
    host.seed(&a_foo("taken", 1));
    host.seed(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "taken", "namespace": "default"}, "spec": {"replicas": 7}}));
    let err = run(&host).expect_err("the child is refused");
    assert!(err.message().contains("taken"), "{}", err.message());
    let d = deployment(&host, "taken").expect("still there");
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(7));
    assert!(d.metadata.owner_references.is_none());
    assert!(host.events().iter().any(|e| e.reason == "ChildFailed"));
}

#[test]
fn a_foo_without_a_deployment_name_is_a_terminal_error() {
    let host = MockHost::for_reconciler::<Typed<SampleController>>();
    host.seed(&a_foo("", 1));
    let err = run(&host).expect_err("refused");
    assert!(err.is_terminal());
    assert!(host.calls().is_empty());
}
