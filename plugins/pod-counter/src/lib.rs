//! **pod-counter**: counts every pod in the cluster and writes the count to a label on the
//! control-plane nodes; on each count it records an event on every counted pod.
//!
//! - Primary watch: Nodes, metadata only (labels are metadata).
//! - Secondary watch: Pods, metadata only, all mapped to one fixed key (`pod-count`), so a burst of
//!   pod changes coalesces into one recount.
//! - Resync every 10 s (the periodic recount); the operator overrides it with `resync_seconds` in
//!   `pod-counter.toml`.
//! - A node key labels only that node, and only a control-plane one (a worker node key costs one
//!   cache read): a resync is not a recount per node. The aggregate key counts, labels every
//!   control-plane node and records the events, even when a patch fails.
//! - Counts from the informer cache: no API list, so no `pods list` permission. The only API call
//!   is a JSON merge patch of the one label on a control-plane node whose label is stale.
//! - Configuration: `label-key` (default `hopegi/pod-count`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use wcm_sdk::{
    Action, Context, Description, Error, EventType, Mapping, ObjectRef, PartialObjectMeta, Patch,
    Permission, Reconciler, Request, Watch,
};

/// The label written when `label-key` is not configured.
pub const DEFAULT_LABEL_KEY: &str = "hopegi/pod-count";
/// The aggregate key every pod change maps to.
pub const AGGREGATE_KEY: &str = "pod-count";
/// Labels that mark a control-plane node: the current one and the legacy one.
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// The plugin.
pub struct PodCounter;

impl Reconciler for PodCounter {
    fn describe() -> Description {
        Description::new("pod-counter", env!("CARGO_PKG_VERSION"))
            .primary(Watch::of::<Node>().metadata_only())
            .secondary(
                Watch::of::<Pod>().metadata_only(),
                Mapping::fixed_key(AGGREGATE_KEY),
            )
            .resync_seconds(10)
            .permission(Permission::new("", "nodes", &["get", "patch"]))
            .config_key("label-key")
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let label_key = ctx
            .config("label-key")
            .unwrap_or_else(|| DEFAULT_LABEL_KEY.to_string());
        if label_key.trim().is_empty() {
            return Err(Error::terminal("configuration label-key is empty"));
        }
        // Metadata is all this plugin reads: it keeps the large Pod and Node deserializers out of
        // the component.
        let pods = ctx.cache::<PartialObjectMeta<Pod>>();
        let aggregate = req.key.namespace.is_none() && req.key.name == AGGREGATE_KEY;
        if !aggregate {
            // A node key: only a control-plane node is labelled, and only that node. Worker nodes
            // cost one cache read and no count, so a resync is not O(nodes × pods).
            let Some(node) = req.object::<PartialObjectMeta<Node>>()? else {
                return Ok(Action::done());
            };
            if !is_control_plane(&node) {
                return Ok(Action::done());
            }
            let count = pods.count(None, None)?;
            label_nodes(ctx, &label_key, count, std::iter::once(node))?;
            return Ok(Action::done());
        }
        // The aggregate key counts and records an event on every pod, which needs their UIDs: one
        // list gives both.
        let counted = pods.list(None, None)?;
        let count = counted.len();
        let labelled = label_control_plane(ctx, &label_key, count);

        // The events say what was counted whether or not a node could be labelled.
        let note = format!("pod count is {count}");
        let recorder = ctx.recorder();
        for pod in &counted {
            recorder.publish(
                &ObjectRef::from_obj(pod),
                EventType::Normal,
                "SuccessCalculatePod",
                "Count",
                &note,
            );
        }
        let labelled = labelled?;
        wcm_sdk::debug!(ctx, "counted {count} pods"; "key" => req.key, "patched_nodes" => labelled);
        Ok(Action::done())
    }
}

fn is_control_plane(node: &PartialObjectMeta<Node>) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| CONTROL_PLANE_LABELS.iter().any(|k| l.contains_key(*k)))
}

/// Sets `label_key = count` on every control-plane node whose label differs; returns how many
/// nodes were patched. Workers are never touched. A failure on one node does not stop the others;
/// the first failure is returned so that the host retries.
fn label_control_plane(ctx: &Context, label_key: &str, count: usize) -> Result<usize, Error> {
    let cached = ctx.cache::<PartialObjectMeta<Node>>();
    let mut control_plane = BTreeMap::new();
    for selector in CONTROL_PLANE_LABELS {
        for node in cached.list(None, Some(selector))? {
            if let Some(name) = node.metadata.name.clone() {
                control_plane.insert(name, node);
            }
        }
    }
    label_nodes(ctx, label_key, count, control_plane.into_values())
}

/// Sets `label_key = count` on each of `nodes` whose label differs; returns how many were patched.
/// A failure on one node does not stop the others; the first is returned so that the host retries.
fn label_nodes(
    ctx: &Context,
    label_key: &str,
    count: usize,
    nodes: impl IntoIterator<Item = PartialObjectMeta<Node>>,
) -> Result<usize, Error> {
    let want = count.to_string();
    let api = ctx.api::<PartialObjectMeta<Node>>();
    let mut patched = 0;
    let mut first_error = None;
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        let current = node.metadata.labels.as_ref().and_then(|l| l.get(label_key));
        if current == Some(&want) {
            continue;
        }
        // Only the one label, as a merge patch: it cannot clobber concurrent changes to the node.
        let patch = Patch::Merge(json!({"metadata": {"labels": {label_key: want}}}));
        match api.patch(name, &patch) {
            Ok(_) => patched += 1,
            // Deleted since the cache saw it: nothing to label.
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                wcm_sdk::warn!(ctx, "labelling node {name} failed: {e}");
                first_error.get_or_insert(Error::from(e).context(format!("labelling node {name}")));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(patched),
    }
}

wcm_sdk::export_plugin!(PodCounter);

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use wcm_sdk::testing::{MockHost, Verb};
    use wcm_sdk::{ApiError, ObjectKey, PatchType};

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    fn pod(namespace: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                uid: Some(format!("uid-{namespace}-{name}")),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    const CP: (&str, &str) = ("node-role.kubernetes.io/control-plane", "");
    const MASTER: (&str, &str) = ("node-role.kubernetes.io/master", "");

    /// A cluster with the given nodes and `pods` pods spread over three namespaces.
    fn cluster(nodes: &[Node], pods: usize) -> MockHost {
        let host = MockHost::for_reconciler::<PodCounter>();
        for n in nodes {
            host.seed(n);
        }
        for i in 0..pods {
            host.seed(&pod(
                ["default", "kube-system", "web"][i % 3],
                &format!("p{i}"),
            ));
        }
        host
    }

    fn aggregate() -> ObjectKey {
        ObjectKey::cluster(AGGREGATE_KEY)
    }

    #[test]
    fn description_is_valid() {
        let d = PodCounter::describe();
        assert_eq!(d.validate(), Ok(()));
        assert_eq!(d.resync_seconds, Some(10));
        assert!(
            d.primary
                .as_ref()
                .is_some_and(|w| w.metadata_only && w.kind.kind == "Node")
        );
        assert_eq!(d.secondaries[0].mapping, Mapping::fixed_key("pod-count"));
    }

    #[test]
    fn labels_the_control_plane_node_with_the_count() {
        let host = cluster(&[node("cp", &[CP])], 5);
        assert_eq!(host.run::<PodCounter>(aggregate()), Ok(Action::done()));

        let patches = host.patches();
        assert_eq!(patches.len(), 1, "{patches:?}");
        assert_eq!(patches[0].key, ObjectKey::cluster("cp"));
        assert_eq!(patches[0].patch_type, PatchType::Merge);
        assert_eq!(
            patches[0].body,
            json!({"metadata": {"labels": {"hopegi/pod-count": "5"}}})
        );
        assert_eq!(patches[0].error, None);
        // Counted from the cache: the only API call is the patch.
        assert_eq!(host.calls().len(), 1);
        let stored: Node = host.object(None, "cp").expect("node");
        assert_eq!(
            stored.metadata.labels.unwrap_or_default()["hopegi/pod-count"],
            "5"
        );
    }

    #[test]
    fn node_keys_count_too_but_record_no_events() {
        let host = cluster(&[node("cp", &[CP])], 2);
        host.run::<PodCounter>(ObjectKey::cluster("cp"))
            .expect("reconciled");
        assert_eq!(
            host.patches()[0].body["metadata"]["labels"]["hopegi/pod-count"],
            "2"
        );
        assert!(host.events().is_empty());
    }

    #[test]
    fn a_worker_node_key_costs_no_count_and_no_call() {
        let host = cluster(&[node("cp", &[CP]), node("w1", &[])], 5);
        host.run::<PodCounter>(ObjectKey::cluster("w1"))
            .expect("reconciled");
        assert!(host.calls().is_empty(), "{:?}", host.calls());
        assert!(host.patches().is_empty());
        // A control-plane node key labels that node only.
        let host = cluster(&[node("cp", &[CP]), node("cp2", &[CP])], 5);
        host.run::<PodCounter>(ObjectKey::cluster("cp"))
            .expect("reconciled");
        let patched: Vec<_> = host.patches().iter().map(|p| p.key.name.clone()).collect();
        assert_eq!(patched, vec!["cp".to_string()]);
    }

    #[test]
    fn no_patch_when_the_label_is_current() {
        let host = cluster(&[node("cp", &[CP, ("hopegi/pod-count", "4")])], 4);
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        host.run::<PodCounter>(ObjectKey::cluster("cp"))
            .expect("reconciled");
        assert!(host.calls().is_empty(), "{:?}", host.calls());
    }

    #[test]
    fn converges_after_the_cache_catches_up() {
        let host = cluster(&[node("cp", &[CP])], 3);
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        host.sync_cache().clear_records();
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        assert!(host.patches().is_empty());
    }

    #[test]
    fn worker_nodes_are_never_labelled() {
        let host = cluster(
            &[
                node("cp", &[CP]),
                node("w1", &[("node-role.kubernetes.io/worker", "")]),
                node("w2", &[]),
            ],
            3,
        );
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        host.run::<PodCounter>(ObjectKey::cluster("w1"))
            .expect("reconciled");
        let patched: Vec<String> = host.patches().into_iter().map(|p| p.key.name).collect();
        // The worker's own key touches nothing (it used to recount and patch cp again).
        assert_eq!(patched, ["cp"]);
    }

    #[test]
    fn no_control_plane_no_patch() {
        let host = cluster(&[node("w1", &[])], 3);
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        assert!(host.patches().is_empty());
        assert_eq!(host.events().len(), 3);
    }

    #[test]
    fn legacy_master_label_counts_as_control_plane() {
        let host = cluster(&[node("old", &[MASTER]), node("both", &[CP, MASTER])], 1);
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        let mut patched: Vec<String> = host.patches().into_iter().map(|p| p.key.name).collect();
        patched.sort();
        assert_eq!(patched, ["both", "old"], "each node once");
    }

    #[test]
    fn records_an_event_on_every_counted_pod() {
        let host = cluster(&[node("cp", &[CP])], 4);
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        let events = host.events();
        assert_eq!(events.len(), 4);
        for e in &events {
            assert_eq!(e.event_type, EventType::Normal);
            assert_eq!(e.reason, "SuccessCalculatePod");
            assert_eq!(e.action, "Count");
            assert_eq!(e.note, "pod count is 4");
            assert_eq!(
                (
                    e.regarding.kind.group.as_str(),
                    e.regarding.kind.version.as_str(),
                    e.regarding.kind.kind.as_str()
                ),
                ("", "v1", "Pod")
            );
            let ns = e.regarding.key.namespace.clone().expect("namespaced");
            assert_eq!(
                e.regarding.uid,
                Some(format!("uid-{ns}-{}", e.regarding.key.name))
            );
        }
        let mut names: Vec<String> = events
            .iter()
            .map(|e| e.regarding.key.name.clone())
            .collect();
        names.sort();
        assert_eq!(names, ["p0", "p1", "p2", "p3"]);
    }

    #[test]
    fn events_without_uid_when_the_cache_has_none() {
        let host = MockHost::for_reconciler::<PodCounter>();
        // In the cache only, without a uid (the API server always gives one).
        host.seed_cache(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "ns"}}));
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        assert_eq!(host.events()[0].regarding.uid, None);
    }

    #[test]
    fn custom_label_key_from_config() {
        let host = cluster(&[node("cp", &[CP, ("hopegi/pod-count", "2")])], 2);
        host.set_config("label-key", "example.com/pods");
        host.run::<PodCounter>(aggregate()).expect("reconciled");
        let patches = host.patches();
        assert_eq!(patches.len(), 1);
        assert_eq!(
            patches[0].body,
            json!({"metadata": {"labels": {"example.com/pods": "2"}}})
        );
    }

    #[test]
    fn empty_label_key_is_terminal() {
        let host = cluster(&[node("cp", &[CP])], 1);
        host.set_config("label-key", "");
        let err = host.run::<PodCounter>(aggregate()).expect_err("refused");
        assert!(err.is_terminal());
    }

    #[test]
    fn api_failures_are_retried_and_other_nodes_still_labelled() {
        let host = cluster(&[node("a", &[CP]), node("b", &[CP])], 1);
        host.fail_next(
            Verb::Patch,
            ApiError::new(503, "ServiceUnavailable", "apiserver restarting"),
        );
        let err = host.run::<PodCounter>(aggregate()).expect_err("failed");
        assert!(!err.is_terminal());
        assert!(err.message().contains("labelling node a"), "{err}");
        assert_eq!(host.patches().len(), 2);
        // The count was made: its event is recorded even though a patch failed.
        assert_eq!(host.events().len(), 1);
        assert!(
            host.object::<Node>(None, "b")
                .and_then(|n| n.metadata.labels)
                .is_some_and(|l| l["hopegi/pod-count"] == "1")
        );
    }

    #[test]
    fn a_node_deleted_meanwhile_is_skipped() {
        let host = MockHost::for_reconciler::<PodCounter>();
        host.seed_cache(&node("gone", &[CP]));
        assert_eq!(host.run::<PodCounter>(aggregate()), Ok(Action::done()));
        assert!(
            host.patches()[0]
                .error
                .as_ref()
                .is_some_and(ApiError::is_not_found)
        );
    }
}
