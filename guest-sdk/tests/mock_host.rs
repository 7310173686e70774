//! The SDK's typed layer against MockHost: what a plugin author relies on in unit tests.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use wcm_sdk::testing::{MockHost, Verb};
use wcm_sdk::{
    Action, ApiError, ApiResource, Context, Description, DynamicObject, Error, EventType,
    FinalizerEvent, GroupVersionKind, KindRef, Level, Mapping, ObjectKey, ObjectRef,
    PartialObjectMeta, Patch, PatchType, Permission, Reconciler, Request, Watch, finalizer,
};

fn cm(ns: &str, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Reconciles ConfigMaps; may read Pods from the cache (metadata only) and patch ConfigMaps.
struct Plugin;

impl Reconciler for Plugin {
    fn describe() -> Description {
        Description::new("plugin", "1.0.0")
            .primary(Watch::of::<ConfigMap>().namespace("watched"))
            .secondary(
                Watch::of::<Pod>().metadata_only().label_selector("app=web"),
                Mapping::ControllerOwner,
            )
            .permission(Permission::of::<ConfigMap>(&[
                "get", "list", "create", "update", "patch", "delete",
            ]))
            .permission(Permission::of::<ConfigMap>(&["patch"]).status())
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

#[test]
fn undeclared_calls_are_forbidden() {
    let host = MockHost::for_reconciler::<Plugin>();
    host.seed(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let ctx = host.context();
    let err = ctx.api::<Node>().get("n1").expect_err("not declared");
    assert_eq!((err.code, err.reason.as_str()), (403, "NotDeclared"));
    assert!(err.message.contains("nodes"), "{err}");
    assert!(Error::from(err.clone()).is_terminal());
    // Declared: reaches the store (and is 404 there).
    let err = ctx
        .api_namespaced::<ConfigMap>("watched")
        .get("nope")
        .expect_err("absent");
    assert!(err.is_not_found());
    assert!(!Error::from(err).is_terminal());
    assert_eq!(host.calls().len(), 2);
    assert_eq!(host.calls()[0].verb, Verb::Get);
    assert!(
        host.calls()[0]
            .error
            .as_ref()
            .is_some_and(ApiError::is_forbidden)
    );
}

/// Patches ConfigMaps and Namespaces; watches ConfigMaps of one namespace only.
struct OneNamespace;

impl Reconciler for OneNamespace {
    fn describe() -> Description {
        Description::new("one-namespace", "1.0.0")
            .primary(Watch::of::<ConfigMap>().namespace("team"))
            .permission(Permission::of::<ConfigMap>(&["get", "list", "patch"]))
            .permission(Permission::new("", "namespaces", &["patch"]))
    }

    fn reconcile(_: &Context, _: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

#[test]
fn calls_outside_the_namespaces_where_it_acts_are_refused_as_by_the_host() {
    let label = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    let out_of_scope = |r: Result<ConfigMap, ApiError>| {
        let err = r.expect_err("out of scope");
        assert_eq!(
            (err.code, err.reason.as_str()),
            (403, "OutOfScope"),
            "{err}"
        );
        assert!(Error::from(err).is_terminal());
    };
    // Where it watches, never wcm-system (where the host and the plugins' identities live).
    let host = MockHost::for_reconciler::<OneNamespace>();
    for ns in ["team", "other", "wcm-system"] {
        host.seed(&cm(ns, "c"));
    }
    let ctx = host.context();
    assert!(
        ctx.api_namespaced::<ConfigMap>("team")
            .patch("c", &label)
            .is_ok()
    );
    out_of_scope(ctx.api_namespaced::<ConfigMap>("other").patch("c", &label));
    out_of_scope(ctx.api_namespaced::<ConfigMap>("wcm-system").get("c"));
    let across = ctx
        .api::<ConfigMap>()
        .list(None)
        .expect_err("all namespaces");
    assert_eq!(across.reason, "OutOfScope", "{across}");
    let ns_patch = ctx
        .api::<k8s_openapi::api::core::v1::Namespace>()
        .patch("wcm-system", &label)
        .expect_err("the protected namespace's own object");
    assert_eq!(ns_patch.reason, "OutOfScope");
    // A plugin watching every namespace acts in all but wcm-system.
    let host = MockHost::for_reconciler::<Plugin>();
    for ns in ["team", "wcm-system"] {
        host.seed(&cm(ns, "c"));
    }
    let ctx = host.context();
    assert!(
        ctx.api_namespaced::<ConfigMap>("team")
            .patch("c", &label)
            .is_ok()
    );
    out_of_scope(
        ctx.api_namespaced::<ConfigMap>("wcm-system")
            .patch("c", &label),
    );
    // The operator names the namespaces (NAME.toml `namespaces`): those, wcm-system included.
    host.acting_in(&["wcm-system"]);
    assert!(
        ctx.api_namespaced::<ConfigMap>("wcm-system")
            .patch("c", &label)
            .is_ok()
    );
    out_of_scope(ctx.api_namespaced::<ConfigMap>("team").patch("c", &label));
}

#[test]
fn create_replace_conflicts_and_status() {
    let host = MockHost::for_reconciler::<Plugin>();
    let ctx = host.context();
    let api = ctx.api_namespaced::<ConfigMap>("watched");
    let created = api.create(&cm("watched", "a")).expect("created");
    let rv = created
        .metadata
        .resource_version
        .clone()
        .expect("resourceVersion");
    assert!(created.metadata.uid.is_some());
    assert!(
        api.create(&cm("watched", "a"))
            .expect_err("exists")
            .is_already_exists()
    );

    let mut stale = created.clone();
    stale.data = Some([("k".to_string(), "v".to_string())].into());
    let replaced = api.replace("a", &stale).expect("replaced");
    assert_ne!(replaced.metadata.resource_version, Some(rv));
    // `stale` still carries the old resourceVersion.
    let err = api.replace("a", &stale).expect_err("conflict");
    assert!(err.is_conflict() && !Error::from(err).is_terminal());

    // A merge patch with a stale resourceVersion conflicts too (optimistic locking).
    let patch = Patch::Merge(json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "y"}}));
    assert!(api.patch("a", &patch).expect_err("conflict").is_conflict());

    // Status patches keep only status.
    api.patch_status(
        "a",
        &Patch::Merge(json!({"status": {"ok": true}, "data": {"ignored": "1"}})),
    )
    .expect("status");
    let stored = host
        .object_value(
            &KindRef::of::<ConfigMap>(),
            &ObjectKey::namespaced("watched", "a"),
        )
        .expect("stored");
    assert_eq!(stored["status"]["ok"], true);
    assert!(stored["data"].get("ignored").is_none());

    let listed = api.list(None).expect("list");
    assert_eq!(listed.len(), 1);
    api.delete("a").expect("deleted");
    assert!(api.get_opt("a").expect("get").is_none());
}

#[test]
fn json_patch_and_apply() {
    let host = MockHost::new();
    host.seed(&cm("ns", "a"));
    let ctx = host.context();
    let api = ctx.api_namespaced::<ConfigMap>("ns");
    api.patch(
        "a",
        &Patch::Json(json!([{"op": "add", "path": "/data", "value": {"k": "v"}}])),
    )
    .expect("json patch");
    let err = api
        .patch(
            "a",
            &Patch::Json(json!([{"op": "test", "path": "/data/k", "value": "other"}])),
        )
        .expect_err("test fails");
    // As the SDK reads the API server's 422 for a JSON patch that does not apply: a conflict.
    assert!(err.is_conflict() && err.is_retryable(), "{err}");
    assert!(!Error::from(err).is_terminal());
    // A real validation error stays terminal.
    let invalid = ApiError::new(
        422,
        "Invalid",
        "ConfigMap \"a\" is invalid: metadata.labels: ...",
    );
    assert!(!invalid.is_retryable());
    // Apply creates what is absent.
    let applied = api
        .patch(
            "b",
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"}})),
        )
        .expect("applied");
    assert_eq!(applied.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(
        host.patches()
            .iter()
            .map(|p| p.patch_type)
            .collect::<Vec<_>>(),
        [PatchType::Json, PatchType::Json, PatchType::Apply]
    );
}

#[test]
fn cache_follows_the_declared_watches() {
    let host = MockHost::for_reconciler::<Plugin>();
    host.seed(&cm("watched", "in"));
    host.seed(&cm("other", "out"));
    host.seed(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "x", "labels": {"app": "web"}}, "spec": {"containers": []}}));
    host.seed(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db", "namespace": "x", "labels": {"app": "db"}}}));
    host.seed(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let ctx = host.context();

    assert_eq!(
        ctx.cache::<ConfigMap>().keys(None, None).expect("keys"),
        [ObjectKey::namespaced("watched", "in")]
    );
    let pods = ctx.cache::<Pod>().list(None, None).expect("pods");
    assert_eq!(pods.len(), 1, "the label selector of the watch applies");
    assert!(pods[0].spec.is_none(), "metadata-only watch: no spec");
    let raw = ctx
        .host()
        .cache_get(&KindRef::of::<Pod>(), &ObjectKey::namespaced("x", "web"))
        .expect("cached");
    assert!(raw.contains("PartialObjectMetadata"), "{raw}");
    let metas = ctx
        .cache::<PartialObjectMeta<Pod>>()
        .list(Some("x"), Some("app in (web,db)"))
        .expect("metas");
    assert_eq!(metas[0].metadata.name.as_deref(), Some("web"));
    assert_eq!(ctx.cache::<Pod>().count(Some("elsewhere"), None), Ok(0));

    let err = ctx
        .cache::<Node>()
        .keys(None, None)
        .expect_err("not watched");
    assert!(
        !err.is_terminal() && err.message().contains("not watched"),
        "{err}"
    );
    assert!(
        ctx.cache::<Node>()
            .get(&ObjectKey::cluster("n1"))
            .expect("no error")
            .is_none()
    );
    assert!(
        ctx.cache::<ConfigMap>().keys(None, Some("a in b")).is_err(),
        "bad selector"
    );
}

#[test]
fn run_hands_over_the_cached_primary_object() {
    struct Echo;
    impl Reconciler for Echo {
        fn describe() -> Description {
            Description::new("echo", "1").primary(Watch::of::<ConfigMap>())
        }
        fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
            match req.object::<ConfigMap>()? {
                Some(cm) => {
                    wcm_sdk::info!(ctx, "got {}", req.key; "uid" => cm.metadata.uid.unwrap_or_default(), "attempt" => req.attempt);
                    Ok(Action::requeue(Duration::from_millis(1500)))
                }
                None => {
                    wcm_sdk::warn!(ctx, "gone");
                    Ok(Action::done())
                }
            }
        }
    }
    let host = MockHost::for_reconciler::<Echo>();
    host.seed_cache(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n", "uid": "u"}}));
    assert_eq!(
        host.run::<Echo>(ObjectKey::namespaced("n", "c")),
        Ok(Action::requeue(Duration::from_millis(1500)))
    );
    assert_eq!(
        host.run::<Echo>(ObjectKey::namespaced("n", "gone")),
        Ok(Action::done())
    );
    let logs = host.logs();
    assert_eq!(
        (
            logs[0].level,
            logs[0].message.as_str(),
            logs[0].field("uid")
        ),
        (Level::Info, "got n/c", Some("u"))
    );
    assert_eq!(logs[0].field("attempt"), Some("0"));
    assert_eq!(
        (logs[1].level, logs[1].message.as_str()),
        (Level::Warn, "gone")
    );
}

#[test]
fn config_secrets_and_events() {
    let host = MockHost::new();
    host.set_config("interval", "30")
        .set_config("bad", "x")
        .set_secret("token", "s3cr3t");
    let ctx = host.context();
    assert_eq!(ctx.config_parse::<u64>("interval"), Ok(Some(30)));
    assert_eq!(ctx.config_parse::<u64>("unset"), Ok(None));
    assert!(
        ctx.config_parse::<u64>("bad")
            .expect_err("not a number")
            .is_terminal()
    );
    assert_eq!(ctx.secret("token").as_deref(), Some("s3cr3t"));

    let mut obj = cm("ns", "c");
    obj.metadata.uid = Some("u1".into());
    ctx.recorder().publish(
        &ObjectRef::from_obj(&obj),
        EventType::Warning,
        "Broken",
        "Check",
        "it broke",
    );
    let e = &host.events()[0];
    assert_eq!(e.regarding.kind, KindRef::of::<ConfigMap>());
    assert_eq!(
        (e.regarding.key.clone(), e.regarding.uid.as_deref()),
        (ObjectKey::namespaced("ns", "c"), Some("u1"))
    );
    assert_eq!(
        (
            e.event_type,
            e.reason.as_str(),
            e.action.as_str(),
            e.note.as_str()
        ),
        (EventType::Warning, "Broken", "Check", "it broke")
    );
}

#[test]
fn dynamic_objects_through_the_api() {
    let net = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
    let host = MockHost::new();
    let ctx = host.context();
    let api = ctx.api_namespaced_with::<DynamicObject>("default", &net);
    let created = api
        .create(&DynamicObject::new("office", &net).data(json!({"spec": {"cidr": "10.0.0.0/24"}})))
        .expect("created");
    assert_eq!(
        created.types.map(|t| (t.api_version, t.kind)),
        Some((net.api_version.clone(), net.kind.clone()))
    );
    assert_eq!(created.data["spec"]["cidr"], "10.0.0.0/24");
    let got = api.get("office").expect("get");
    assert_eq!(got.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        host.calls()[0].body.as_ref().map(|b| b["kind"].clone()),
        Some(json!("Network"))
    );
}

#[test]
fn injected_failures_are_structured() {
    let host = MockHost::new();
    host.seed(&cm("ns", "c"));
    host.fail_next(Verb::Get, ApiError::new(0, "Timeout", "no answer"));
    let api = host.context().api_namespaced::<ConfigMap>("ns");
    let err = api.get("c").expect_err("injected");
    assert_eq!(err.reason, "Timeout");
    assert!(!Error::from(err).is_terminal());
    assert!(api.get("c").is_ok(), "only once");
}

#[test]
fn finalizer_lifecycle() {
    const NAME: &str = "example.com/cleanup";
    let host = MockHost::new();
    host.seed(&cm("ns", "c"));
    let ctx = host.context();
    let api = ctx.api::<ConfigMap>();
    let key = ObjectKey::namespaced("ns", "c");
    let mut seen = Vec::new();
    let mut step = |host: &MockHost| {
        let obj: ConfigMap = host.object(Some("ns"), "c").expect("exists");
        finalizer(&api, NAME, obj, |event| {
            seen.push(match event {
                FinalizerEvent::Apply(_) => "apply",
                FinalizerEvent::Cleanup(_) => "cleanup",
            });
            Ok(Action::done())
        })
    };

    // First reconcile: the finalizer is added (JSON patch), then Apply runs.
    assert_eq!(step(&host), Ok(Action::done()));
    let stored: ConfigMap = host.object(Some("ns"), "c").expect("exists");
    assert_eq!(stored.metadata.finalizers, Some(vec![NAME.to_string()]));
    assert_eq!(host.patches()[0].patch_type, PatchType::Json);
    assert_eq!(host.patches()[0].key, key);
    // Second: nothing to add.
    step(&host).expect("apply");
    assert_eq!(host.patches().len(), 1);
    // Deleted: cleanup runs, the finalizer goes, and with it the object.
    ctx.api_namespaced::<ConfigMap>("ns")
        .delete("c")
        .expect("delete");
    step(&host).expect("cleanup");
    assert_eq!(seen, ["apply", "apply", "cleanup"]);
    assert!(
        host.object::<ConfigMap>(Some("ns"), "c").is_none(),
        "gone after the last finalizer"
    );
}

/// Writes its own status, and a label when the ConfigMap asks for one; its watch ignores status
/// changes.
struct StatusWriter;

impl Reconciler for StatusWriter {
    fn describe() -> Description {
        Description::new("status-writer", "1.0.0")
            .primary(Watch::of::<ConfigMap>().ignore_status_changes())
            .permission(Permission::of::<ConfigMap>(&["patch"]))
            .permission(Permission::of::<ConfigMap>(&["patch"]).status())
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let api = ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default());
        api.patch_status(req.name(), &Patch::Merge(json!({"status": {"seen": true}})))?;
        if cm.data.is_some_and(|d| d.contains_key("label-me")) {
            api.patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
            )?;
        }
        Ok(Action::done())
    }
}

#[test]
fn wakes_itself_applies_the_watch_change_filter_as_the_host_does() {
    let host = MockHost::for_reconciler::<StatusWriter>();
    host.seed(&cm("a", "quiet"));
    let mut loud = cm("a", "loud");
    loud.data = Some([("label-me".to_string(), "1".to_string())].into());
    host.seed(&loud);
    let quiet = ObjectKey::new(Some("a"), "quiet");
    let loud = ObjectKey::new(Some("a"), "loud");
    assert!(!host.wakes_itself(&quiet), "nothing written yet");

    host.run::<StatusWriter>(quiet.clone()).expect("reconcile");
    host.run::<StatusWriter>(loud.clone()).expect("reconcile");
    // Its own status write does not wake it (ignore-status); a label change would, and loop.
    assert!(!host.wakes_itself(&quiet));
    assert!(host.wakes_itself(&loud));
    assert!(
        !Watch::of::<ConfigMap>()
            .ignore_status_changes()
            .changes
            .wakes(
                &json!({"spec": 1, "status": 1}),
                &json!({"spec": 1, "status": 2})
            )
    );
}

/// Logs through the `log` facade, as a library it calls would.
struct FacadeLogger;

impl Reconciler for FacadeLogger {
    fn describe() -> Description {
        Description::new("facade-logger", "1.0.0").primary(Watch::of::<ConfigMap>())
    }

    fn reconcile(_ctx: &Context, req: Request) -> Result<Action, Error> {
        log::info!("looked at {}", req.key);
        log::debug!("below the default level: never reaches the host");
        Ok(Action::done())
    }
}

#[test]
fn log_facade_lines_reach_the_host() {
    let host = MockHost::for_reconciler::<FacadeLogger>();
    host.run::<FacadeLogger>(ObjectKey::namespaced("web", "app"))
        .expect("reconciled");
    let logs = host.logs();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(logs[0].level, Level::Info);
    assert_eq!(logs[0].message, "looked at web/app");
    assert_eq!(logs[0].field("target"), Some("mock_host"));
    // Outside a reconcile, nothing is routed to this host.
    log::info!("not in a reconcile");
    assert_eq!(host.logs().len(), 1);
}

#[test]
fn status_conditions_and_owner_references() {
    use wcm_sdk::Resource;
    use wcm_sdk::conditions;
    let mut owner = cm("web", "app");
    owner.metadata.uid = Some("u-1".into());
    owner.metadata.generation = Some(4);
    // kube-core's Resource: the owner reference a child should carry.
    let reference = owner.controller_owner_ref(&()).expect("has a name and uid");
    assert_eq!(
        (
            reference.kind.as_str(),
            reference.name.as_str(),
            reference.uid.as_str(),
            reference.controller
        ),
        ("ConfigMap", "app", "u-1", Some(true))
    );
    let mut list = Vec::new();
    let generation = conditions::observed_generation(&owner);
    assert!(conditions::set(
        &mut list,
        conditions::new("Ready", true, "Synced", "", generation)
    ));
    assert_eq!(list[0].observed_generation, Some(4));
    assert!(conditions::is_true(&list, "Ready"));
}

/// A client of an outside API, as a plugin would hold one; tests put a fake in its place.
trait Inventory {
    fn owner_of(&self, name: &str) -> Option<String>;
}

struct RealInventory;

impl Inventory for RealInventory {
    fn owner_of(&self, _name: &str) -> Option<String> {
        None
    }
}

struct FakeInventory;

impl Inventory for FakeInventory {
    fn owner_of(&self, name: &str) -> Option<String> {
        Some(format!("team-of-{name}"))
    }
}

struct UsesInventory;

impl Reconciler for UsesInventory {
    fn describe() -> Description {
        Description::new("uses-inventory", "1.0.0").primary(Watch::of::<ConfigMap>())
    }

    fn setup(ctx: &mut Context) -> Result<(), Error> {
        ctx.insert::<Box<dyn Inventory>>(Box::new(RealInventory));
        Ok(())
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let inventory = ctx.require::<Box<dyn Inventory>>()?;
        match inventory.owner_of(req.name()) {
            Some(owner) => {
                let obj = ObjectRef::new(KindRef::of::<ConfigMap>(), req.key.clone());
                ctx.recorder()
                    .event(&obj, "Owned")
                    .action("Assign")
                    .note(owner)
                    .publish();
                Ok(Action::done())
            }
            None => Err(Error::retryable("no owner yet")),
        }
    }
}

#[test]
fn an_injected_fake_replaces_what_setup_put_in() {
    let host = MockHost::for_reconciler::<UsesInventory>();
    let key = ObjectKey::namespaced("web", "app");
    // What setup put in: the real client (which knows no owner here).
    let err = host
        .run::<UsesInventory>(key.clone())
        .expect_err("no owner");
    assert!(!err.is_terminal());
    host.inject::<Box<dyn Inventory>>(Box::new(FakeInventory));
    host.run::<UsesInventory>(key).expect("reconciled");
    let events = host.events();
    assert_eq!(
        (events[0].reason.as_str(), events[0].note.as_str()),
        ("Owned", "team-of-app")
    );
    // A plugin that put nothing in gets a terminal error naming the type.
    let ctx = host.context();
    let Err(err) = ctx.require::<Box<dyn Inventory>>() else {
        panic!("nothing was put in this context");
    };
    assert!(
        err.is_terminal() && err.message().contains("Inventory"),
        "{err}"
    );
}

#[test]
fn generation_and_the_status_subresource_behave_as_on_the_api_server() {
    let net = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let host = MockHost::new();
    let ctx = host.context();
    let api = ctx.api_namespaced_with::<DynamicObject>("default", &net);
    // A create sets generation 1 and drops the status (the status subresource owns it).
    let created = api
        .create(
            &DynamicObject::new("w", &net)
                .data(json!({"spec": {"size": 1}, "status": {"ready": true}})),
        )
        .expect("created");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.data.get("status").is_none(), "{:?}", created.data);

    // A metadata change keeps the generation; a spec change bumps it.
    let labelled = api
        .patch(
            "w",
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .expect("patched");
    assert_eq!(labelled.metadata.generation, Some(1));
    let resized = api
        .patch("w", &Patch::Merge(json!({"spec": {"size": 2}})))
        .expect("patched");
    assert_eq!(resized.metadata.generation, Some(2));

    // The status goes only through /status, and /status changes nothing else.
    let ignored = api
        .patch("w", &Patch::Merge(json!({"status": {"ready": true}})))
        .expect("patched");
    assert!(ignored.data.get("status").is_none(), "{:?}", ignored.data);
    assert_eq!(ignored.metadata.generation, Some(2));
    let status = api
        .patch_status(
            "w",
            &Patch::Merge(json!({"spec": {"size": 9}, "status": {"ready": true}})),
        )
        .expect("patched");
    assert_eq!(status.data["status"]["ready"], true);
    assert_eq!(status.data["spec"]["size"], 2);
    assert_eq!(status.metadata.generation, Some(2));
    // A replace keeps the stored status too.
    let mut replaced = status.clone();
    replaced.data["status"] = json!({"ready": false});
    replaced.data["spec"] = json!({"size": 3});
    let replaced = api.replace("w", &replaced).expect("replaced");
    assert_eq!(replaced.data["status"]["ready"], true);
    assert_eq!(replaced.metadata.generation, Some(3));
}

#[test]
fn list_pages_field_selectors_dry_runs_and_preconditions() {
    use wcm_sdk::{DeleteParams, ListParams, PatchParams};
    let host = MockHost::new();
    for name in ["a", "b", "c"] {
        let mut c = cm("ns", name);
        c.data = Some(
            [(
                "tier".to_string(),
                if name == "b" { "db" } else { "web" }.to_string(),
            )]
            .into(),
        );
        host.seed(&c);
    }
    let api = host.context().api_namespaced::<ConfigMap>("ns");
    // A field selector the API server supports, and pages of one.
    let not_b = api
        .list_with(&ListParams::default().fields("metadata.name!=b"))
        .expect("listed");
    let names: Vec<_> = not_b
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(names, ["a", "c"]);
    // ... and refused, as there, on a field it does not support, or a limit out of bounds.
    assert_eq!(
        api.list_with(&ListParams::default().fields("data.tier=web"))
            .expect_err("unsupported field")
            .code,
        400
    );
    assert!(api.list_with(&ListParams::default().limit(0)).is_err());
    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(1);
    loop {
        let page = api.list_with(&params).expect("page");
        assert!(page.items.len() <= 1);
        seen.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        match page.continue_token {
            Some(t) => params = params.continue_token(&t),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c"]);
    assert_eq!(
        host.calls()[0].field_selector.as_deref(),
        Some("metadata.name!=b")
    );

    // A dry run is answered with the change and stores nothing.
    let answered = api
        .patch_with(
            "a",
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .expect("dry run");
    assert!(
        answered
            .metadata
            .labels
            .is_some_and(|l| l.contains_key("x"))
    );
    assert!(api.get("a").expect("get").metadata.labels.is_none());
    // Force is for server-side apply only (400 from the host too).
    let err = api
        .patch_with(
            "a",
            &PatchParams::default().force(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .expect_err("force on a merge patch");
    assert_eq!(err.code, 400);
    // A field-manager suffix of 1-60 lowercase letters, digits and '-' (`wcm:NAME:SUFFIX` stays
    // within the API server's 128), as the host has it.
    let merge = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    let suffixed = |s: &str| PatchParams::default().field_manager_suffix(s).dry_run();
    api.patch_with("a", &suffixed(&"s".repeat(60)), &merge)
        .expect("60 characters");
    for bad in ["s".repeat(61), "a:b".into(), "Admin".into()] {
        let err = api
            .patch_with("a", &suffixed(&bad), &merge)
            .expect_err("refused suffix");
        assert_eq!(err.code, 400, "{bad}");
    }

    // A delete whose precondition does not hold is a conflict, and deletes nothing.
    let err = api
        .delete_with(
            "a",
            &DeleteParams::default().precondition_uid("someone-else"),
        )
        .expect_err("precondition");
    assert!(err.is_conflict(), "{err}");
    api.delete_with("a", &DeleteParams::default().dry_run())
        .expect("dry-run delete");
    assert!(api.get_opt("a").expect("get").is_some());
    api.delete("a").expect("deleted");
    assert!(api.get_opt("a").expect("get").is_none());
}

#[test]
fn a_retry_delay_travels_with_the_error() {
    let e = Error::retryable("rate limited").retry_after(Duration::from_secs(30));
    assert_eq!(e.retry_after_delay(), Some(Duration::from_secs(30)));
    // A terminal error is never retried, whatever it asks.
    let t = Error::terminal("bad spec").retry_after(Duration::from_secs(30));
    assert_eq!(t.retry_after_delay(), None);
}

/// Annotates each ConfigMap with the number of Pods it controls; a ConfigMap with data `broken`
/// is a terminal error, one with `flaky` fails twice before it works.
struct PodTally;

impl Reconciler for PodTally {
    fn describe() -> Description {
        Description::new("pod-tally", "1.0.0")
            .primary(Watch::of::<ConfigMap>())
            .secondary(Watch::of::<Pod>().metadata_only(), Mapping::ControllerOwner)
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let data = cm.data.clone().unwrap_or_default();
        if data.contains_key("broken") {
            return Err(Error::terminal("broken on purpose"));
        }
        if data.contains_key("flaky") && req.attempt < 2 {
            return Err(Error::retryable("not yet"));
        }
        let uid = cm.metadata.uid.clone().unwrap_or_default();
        let owned = ctx
            .cache::<PartialObjectMeta<Pod>>()
            .list(req.namespace(), None)?
            .into_iter()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            })
            .count()
            .to_string();
        let current = cm.metadata.annotations.as_ref().and_then(|a| a.get("pods"));
        if current != Some(&owned) {
            ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
                .patch(
                    req.name(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"pods": owned}}})),
                )?;
        }
        Ok(Action::done())
    }
}

#[test]
fn run_controller_drives_the_plugin_as_the_host_does() {
    let host = MockHost::for_reconciler::<PodTally>();
    let with = |name: &str, uid: &str, data: &[(&str, &str)]| {
        let mut c = cm("ns", name);
        c.metadata.uid = Some(uid.into());
        c.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        host.seed(&c);
    };
    with("a", "u-a", &[]);
    with("b", "u-b", &[("broken", "1")]);
    with("c", "u-c", &[("flaky", "1")]);

    let run = host.run_controller::<PodTally>(50);
    assert!(!run.hit_limit && run.gave_up.is_empty(), "{run:?}");
    let annotation = |name: &str| {
        host.object::<ConfigMap>(Some("ns"), name)
            .and_then(|c| c.metadata.annotations)
            .and_then(|a| a.get("pods").cloned())
    };
    assert_eq!(annotation("a").as_deref(), Some("0"));
    // The flaky key was retried with its attempts counted, and then worked.
    let attempts: Vec<u32> = run
        .steps
        .iter()
        .filter(|s| s.key.name == "c")
        .map(|s| s.attempt)
        .collect();
    assert_eq!(&attempts[..3], &[0, 1, 2], "{run:?}");
    assert_eq!(annotation("c").as_deref(), Some("0"));
    // The terminal error was not retried, and left the host's Warning event.
    assert_eq!(run.keys().iter().filter(|k| k.name == "b").count(), 1);
    let failed: Vec<_> = host
        .events()
        .into_iter()
        .filter(|e| e.reason == "ReconcileFailed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].regarding.uid.as_deref(), Some("u-b"));
    assert_eq!(failed[0].event_type, EventType::Warning);

    // A Pod controlled by "a" appears at the API server: its event maps to "a" through the
    // controller owner reference, and "a" is counted again.
    host.seed_api(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "ns", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "u-a", "controller": true}
        ]},
    }));
    host.run_controller::<PodTally>(50);
    assert_eq!(annotation("a").as_deref(), Some("1"));
}

/// Bumps a counter on every run: it wakes itself for ever.
struct Restless;

impl Reconciler for Restless {
    fn describe() -> Description {
        Description::new("restless", "1.0.0")
            .primary(Watch::of::<ConfigMap>())
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        let runs: u32 = cm
            .metadata
            .annotations
            .and_then(|a| a.get("runs").and_then(|r| r.parse().ok()))
            .unwrap_or(0);
        let patch = json!({"metadata": {"annotations": {"runs": (runs + 1).to_string()}}});
        ctx.api_namespaced::<ConfigMap>("ns")
            .patch(req.name(), &Patch::Merge(patch))?;
        Ok(Action::done())
    }
}

#[test]
fn run_controller_stops_a_plugin_that_wakes_itself() {
    let host = MockHost::for_reconciler::<Restless>();
    host.seed(&cm("ns", "a"));
    let run = host.run_controller::<Restless>(10);
    assert!(run.hit_limit, "{run:?}");
    assert_eq!(run.steps.len(), 10);
}

#[test]
fn errors_keep_their_source() {
    use std::error::Error as _;
    // Still Send and Sync: `anyhow` and `Box<dyn Error + Send + Sync>` take it.
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Error>();
    let api = ApiError::new(409, "Conflict", "the object changed");
    let e = Error::from(api.clone());
    let source = e.source().expect("the API error is the source");
    assert_eq!(source.to_string(), api.to_string());
    let parse = "x".parse::<u32>().expect_err("not a number");
    let e = Error::terminal("configuration replicas").with_source(parse.clone());
    assert_eq!(e.source().map(|s| s.to_string()), Some(parse.to_string()));
    assert_eq!(e.message(), "configuration replicas");
}

/// A typed controller: the object arrives as a ConfigMap.
struct TypedCounter;

impl wcm_sdk::Controller for TypedCounter {
    type Primary = ConfigMap;

    fn describe() -> Description {
        Description::new("typed-counter", "1.0.0")
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, cm: Option<ConfigMap>, req: Request) -> Result<Action, Error> {
        let Some(cm) = cm else {
            return Ok(Action::done());
        };
        let keys = cm.data.unwrap_or_default().len().to_string();
        ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
            .patch(
                req.name(),
                &Patch::Merge(json!({"metadata": {"annotations": {"keys": keys}}})),
            )?;
        Ok(Action::done())
    }
}

/// Says it reconciles ConfigMaps but watches Pods.
struct Mismatched;

impl wcm_sdk::Controller for Mismatched {
    type Primary = ConfigMap;

    fn describe() -> Description {
        Description::new("mismatched", "1.0.0")
    }

    fn watch() -> Watch {
        Watch::of::<Pod>()
    }

    fn reconcile(_ctx: &Context, _cm: Option<ConfigMap>, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

#[test]
fn a_typed_controller_gets_its_primary_type() {
    use wcm_sdk::Typed;
    let host = MockHost::for_reconciler::<Typed<TypedCounter>>();
    let mut c = cm("ns", "app");
    c.data = Some([("a".to_string(), "1".to_string())].into());
    host.seed(&c);
    host.run::<Typed<TypedCounter>>(ObjectKey::namespaced("ns", "app"))
        .expect("reconciled");
    assert_eq!(
        host.patches()[0].body,
        json!({"metadata": {"annotations": {"keys": "1"}}})
    );
    let described = <Typed<TypedCounter> as Reconciler>::describe();
    assert_eq!(described.primary, Some(Watch::of::<ConfigMap>()));
    let mismatch = std::panic::catch_unwind(<Typed<Mismatched> as Reconciler>::describe);
    assert!(
        mismatch.is_err(),
        "a primary watch of another kind is refused"
    );
}

/// Counts Pods into one aggregate key, and notes which Nodes own Pods (a cluster-scoped primary).
struct NodeOwners;

impl Reconciler for NodeOwners {
    fn describe() -> Description {
        Description::new("node-owners", "1.0.0")
            .primary(Watch::of::<Node>())
            .secondary(Watch::of::<Pod>(), Mapping::AnyOwner)
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

#[test]
fn run_controller_maps_as_the_host_does() {
    let host = MockHost::for_reconciler::<NodeOwners>();
    for name in ["n1", "n2", "n3"] {
        host.seed(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}));
    }
    let pod = |owner: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mirror", "namespace": "kube-system",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": owner}]}})
    };
    // At start cached secondaries map too (to n1, already listed); a Node is cluster-scoped, so
    // the key has no namespace.
    host.seed(&pod("n1"));
    let run = host.run_controller::<NodeOwners>(20);
    let nodes = |names: &[&str]| {
        names
            .iter()
            .map(|n| ObjectKey::cluster(n))
            .collect::<Vec<_>>()
    };
    assert_eq!(run.keys(), nodes(&["n1", "n2", "n3"]), "{run:?}");
    // The owner moves from n1 to n2: the old owner is woken again too (n2 is still queued).
    host.seed_api(&pod("n2"));
    let run = host.run_controller::<NodeOwners>(20);
    assert_eq!(run.keys(), nodes(&["n1", "n2", "n3", "n1"]), "{run:?}");
}
