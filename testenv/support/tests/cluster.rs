//! The test cluster itself: real API calls, a CRD from manifests/, watches, the audit log.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testenv::TestEnv;

#[tokio::test(flavor = "multi_thread")]
async fn lists_creates_and_watches() -> Result<()> {
    let env = TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("basic").await?;

    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let names: Vec<_> = namespaces
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert!(
        names.contains(&"default".to_string()),
        "namespaces: {names:?}"
    );
    assert!(names.contains(&ns.name), "namespaces: {names:?}");

    let node_name = format!("node-{}", ns.name);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": node_name, "labels": {"node-role.kubernetes.io/control-plane": ""}}
    }))?;
    let created = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    assert_eq!(created.metadata.name.as_deref(), Some(node_name.as_str()));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    assert!(pod.metadata.uid.is_some());
    // No scheduler or kubelet runs here: the pod stays Pending.
    assert_eq!(
        pods.get("p1")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Pending")
    );

    // The Network CRD from manifests/ is installed and served.
    let gvk = GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network");
    let networks: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "networks"),
    );
    let net: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
        "metadata": {"name": "example-network"},
        "spec": {"cidr": "192.168.0.0/16", "gateway": "192.168.0.1"}
    }))?;
    networks.create(&PostParams::default(), &net).await?;
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
        "metadata": {"name": "no-spec"}, "spec": {"cidr": "10.0.0.0/8"}
    }))?;
    let err = networks
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("schema requires gateway");
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 422),
        "{err:?}"
    );

    // A watch sees a change made after it started.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut stream = watcher(cms.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let writer = cms.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "watched"}, "data": {"k": "v"}}))
                .expect("static json");
        let _ = writer.create(&PostParams::default(), &cm).await;
    });
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(cm) = stream.try_next().await? {
            if cm.metadata.name.as_deref() == Some("watched") {
                return Ok::<_, anyhow::Error>(cm);
            }
        }
        anyhow::bail!("watch ended")
    })
    .await
    .context("no watch event within 20 s")??;
    assert_eq!(
        seen.data.and_then(|d| d.get("k").cloned()).as_deref(),
        Some("v")
    );
    Ok(())
}

/// The audit log records what the apiserver saw: verb, object, status, and the impersonated user.
#[tokio::test(flavor = "multi_thread")]
async fn audit_log_records_requests_and_impersonation() -> Result<()> {
    let env = TestEnv::shared().await?;
    if !env.has_audit_log() {
        eprintln!("skipped: the audit log is only available on the local cluster");
        return Ok(());
    }
    let client = env.client().await?;
    let ns = env.namespace("audit").await?;
    let sa_user = format!("system:serviceaccount:{}:default", ns.name);

    // The ServiceAccount may read ConfigMaps in its namespace, and nothing else.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "read-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    }))?;
    Api::<Role>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "read-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns.name}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &binding)
        .await?;
    let mut config = env.config().await?;
    config.auth_info.impersonate = Some(sa_user.clone());
    let as_sa = kube::Client::try_from(config)?;

    let mark = env.audit_mark()?;
    let admin_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let err = admin_cms
        .get("absent-admin")
        .await
        .expect_err("no such ConfigMap");
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 404),
        "{err:?}"
    );

    // RBAC reads bindings from a watch cache: allow the new binding a moment to take effect.
    let sa_cms: Api<ConfigMap> = Api::namespaced(as_sa.clone(), &ns.name);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match sa_cms.get("absent-sa").await {
            Err(kube::Error::Api(e)) if e.code == 404 => break,
            Err(kube::Error::Api(e)) if e.code == 403 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => anyhow::bail!("impersonated GET: want 404, got {other:?}"),
        }
    }
    let err = Api::<Secret>::namespaced(as_sa, &ns.name)
        .get("absent-secret")
        .await
        .expect_err("the ServiceAccount may not read Secrets");
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 403),
        "{err:?}"
    );
    // /metrics is excluded by the policy.
    env.apiserver_metric("apiserver_request_total", &[]).await?;

    // Read right after the responses: the blocking backend wrote each event before its response ended.
    let events = env.audit_events_since(mark)?;
    let about = |resource: &str, name: &str| {
        events
            .iter()
            .filter(|e| {
                e.object_ref.as_ref().is_some_and(|o| {
                    o.resource == resource && o.namespace == ns.name && o.name == name
                })
            })
            .collect::<Vec<_>>()
    };

    let admin = about("configmaps", "absent-admin");
    assert_eq!(admin.len(), 1, "events: {admin:#?}");
    let e = admin[0];
    assert_eq!(
        (e.verb.as_str(), e.code(), e.stage.as_str()),
        ("get", Some(404), "ResponseComplete")
    );
    assert_eq!(e.user.username, "admin");
    assert!(e.impersonated_user.is_none(), "{e:#?}");
    assert_eq!(e.effective_user(), "admin");

    let sa = about("configmaps", "absent-sa");
    let found = sa.iter().find(|e| e.code() == Some(404));
    let e = found.with_context(|| format!("no 404 event for the impersonated GET: {sa:#?}"))?;
    assert_eq!(e.verb, "get");
    assert_eq!(
        e.user.username, "admin",
        "the impersonator is recorded as the user"
    );
    assert_eq!(e.effective_user(), sa_user);
    let imp = e.impersonated_user.as_ref().context("impersonatedUser")?;
    assert!(
        imp.groups.iter().any(|g| g == "system:serviceaccounts"),
        "{imp:?}"
    );
    assert_eq!(
        e.annotations
            .get("authorization.k8s.io/decision")
            .map(String::as_str),
        Some("allow")
    );

    let secret = about("secrets", "absent-secret");
    assert_eq!(secret.len(), 1, "events: {secret:#?}");
    let e = secret[0];
    assert_eq!((e.verb.as_str(), e.code()), ("get", Some(403)));
    assert_eq!(e.effective_user(), sa_user);
    assert_eq!(
        e.annotations
            .get("authorization.k8s.io/decision")
            .map(String::as_str),
        Some("forbid")
    );

    // The policy: Metadata only (no bodies), no RequestReceived stage, no /metrics.
    for e in &events {
        assert_eq!(e.level, "Metadata", "{e:#?}");
        assert_ne!(e.stage, "RequestReceived", "{e:#?}");
        assert!(!e.request_uri.starts_with("/metrics"), "{e:#?}");
    }

    // A later mark leaves these events out; the whole log has them.
    let later = env.audit_events_since(env.audit_mark()?)?;
    assert!(
        later
            .iter()
            .all(|e| e.object_ref.as_ref().is_none_or(|o| o.namespace != ns.name)),
        "events after the later mark: {later:#?}"
    );
    let all = env.audit_events()?;
    assert!(all.len() >= events.len());
    assert!(
        all.iter()
            .any(|e| e.request_uri.ends_with("/configmaps/absent-admin"))
    );
    Ok(())
}

/// The SDK reads the API server's 422 for a JSON patch that does not apply (a failed `test`) by its
/// message, and a real validation error must not read the same: both pinned on the real server.
#[tokio::test(flavor = "multi_thread")]
async fn a_json_patch_that_does_not_apply_is_told_apart_from_an_invalid_object() -> Result<()> {
    use kube::api::{Patch, PatchParams};
    let env = TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("jsonpatch").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "t"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let answer = |r: kube::Result<ConfigMap>| match r {
        Err(kube::Error::Api(s)) => Ok((s.code, s.message)),
        other => Err(anyhow::anyhow!("expected an API error, got {other:?}")),
    };
    let test_failed = json_patch::Patch(serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
    ]))?);
    let (code, message) = answer(
        cms.patch(
            "t",
            &PatchParams::default(),
            &Patch::Json::<()>(test_failed),
        )
        .await,
    )?;
    assert_eq!(code, 422);
    assert!(
        message.starts_with(wcm_sdk::ApiError::PATCH_NOT_APPLIED),
        "{message}"
    );
    let invalid = json_patch::Patch(serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b c"}},
    ]))?);
    let (code, message) = answer(
        cms.patch("t", &PatchParams::default(), &Patch::Json::<()>(invalid))
            .await,
    )?;
    assert_eq!(code, 422);
    assert!(
        !message.starts_with(wcm_sdk::ApiError::PATCH_NOT_APPLIED),
        "{message}"
    );
    Ok(())
}
