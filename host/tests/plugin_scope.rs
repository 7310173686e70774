//! Where a plugin acts, proven by what the API server saw and stored: a plugin granted
//! `apps/deployments get, list, patch` by our own `rbac` (what the shipped config-reloader
//! declares) tries to take over the host's Deployment in `wcm-system`. Named namespaces: the
//! host's fence refuses it in memory and the generated grant refuses it at the API server too;
//! every namespace (granted only with `--all-namespaces`): the fence alone keeps it out of the
//! protected namespace. Either way the Deployment is unchanged and its own namespace's is not.

mod common;

use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasm_controller_manager::cluster::rbac::{Allow, Allowances};
use wasm_controller_manager::loading::rbac;

const HOST_NS: &str = "wcm-system";
const HOST_DEPLOYMENT: &str = "wasm-controller-manager";
const TEAM_NS: &str = "wcm-scope-team";

fn deployment(name: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "manager", "image": "wasm-controller-manager:1"}]}
            }
        }
    }))?)
}

async fn ensure_deployment(api: &Api<Deployment>, name: &str) -> Result<Deployment> {
    match api.create(&PostParams::default(), &deployment(name)?).await {
        Ok(d) => Ok(d),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(api.get(name).await?),
        Err(e) => Err(e.into()),
    }
}

/// What `rbac` prints for one plugin file, with these allowances, against the test cluster.
async fn generate(wasm: &std::path::Path, allow: &Allowances) -> Result<rbac::RbacOutput> {
    let env = testenv::TestEnv::shared().await?;
    let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
        env.client().await?,
        Duration::from_secs(10),
    );
    rbac::generate(
        &rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins: vec![wasm.to_path_buf()],
            identity: Default::default(),
            host_service_account: Some((HOST_NS.into(), "wcm-test-host".into())),
            allow: allow.clone(),
        },
        Some(&discovery),
    )
    .await
}

/// The grants of Deployments in the output: (kind, namespace) of every Role or ClusterRole
/// naming them.
fn deployment_grants(objects: &[Value]) -> Vec<(String, Option<String>)> {
    objects
        .iter()
        .filter(|o| {
            matches!(o["kind"].as_str(), Some("Role" | "ClusterRole"))
                && o["rules"].to_string().contains("\"deployments\"")
        })
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["namespace"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn probe(name: &str, target: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "data": {"target": target}}),
    )?)
}

/// Audit events of the plugin's identity on Deployments in the host's namespace since `mark`.
fn writes_on_host_deployments(
    env: &testenv::TestEnv,
    mark: testenv::AuditMark,
    plugin: &str,
) -> Result<Vec<String>> {
    let user = format!("system:serviceaccount:wcm-system:wcm-plugin-{plugin}");
    Ok(env
        .audit_events_since(mark)?
        .iter()
        .filter(|e| {
            e.effective_user() == user
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.resource == "deployments" && o.namespace == HOST_NS)
        })
        .map(|e| format!("{} {} -> {:?}", e.verb, e.request_uri, e.code()))
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_plugin_cannot_patch_the_hosts_deployment() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_namespace(&client, HOST_NS).await?;
    ensure_namespace(&client, TEAM_NS).await?;
    let host_deployments: Api<Deployment> = Api::namespaced(client.clone(), HOST_NS);
    let team_deployments: Api<Deployment> = Api::namespaced(client.clone(), TEAM_NS);
    let before = ensure_deployment(&host_deployments, HOST_DEPLOYMENT).await?;
    ensure_deployment(&team_deployments, "app").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), TEAM_NS);

    // 1. The operator names where it acts. `rbac` grants Deployments there only: no ClusterRole.
    let dir = temp_dir("scope-named")?;
    std::fs::write(
        dir.join("named.toml"),
        format!("name = \"host-patcher-named\"\nnamespaces = [\"{TEAM_NS}\"]\n"),
    )?;
    let wasm = install(&dir, "host-patcher", "named.wasm")?;
    let out = generate(&wasm, &Allowances::default()).await?;
    assert_eq!(
        deployment_grants(&out.objects),
        [("Role".to_string(), Some(TEAM_NS.to_string()))],
        "Deployments granted in {TEAM_NS} only"
    );
    rbac::apply(&client, &out.objects).await?;
    let manager = start_manager_ungranted(test_config(&dir)).await?;
    let mark = env.audit_mark()?;
    cms.create(
        &PostParams::default(),
        &probe("named-host", &format!("{HOST_NS}/{HOST_DEPLOYMENT}"))?,
    )
    .await?;
    cms.create(
        &PostParams::default(),
        &probe("named-own", &format!("{TEAM_NS}/app"))?,
    )
    .await?;
    let host = reported_attacks::<Value>(&cms, "named-host").await?;
    for call in ["patch", "get", "list-all-namespaces"] {
        assert_eq!(host[call]["code"], 403, "{call}: {host}");
        assert_eq!(host[call]["reason"], "OutOfScope", "{call}: {host}");
    }
    let own = reported_attacks::<Value>(&cms, "named-own").await?;
    assert_eq!(own["patch"]["code"], 0, "it acts where it was named: {own}");
    let app = team_deployments.get("app").await?;
    assert_eq!(
        app.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("wcm.test/pwned"))
            .map(String::as_str),
        Some("true"),
        "the honest path: its own namespace's Deployment was patched"
    );
    // The fence answered in memory: the API server never saw the plugin touch wcm-system.
    let seen = writes_on_host_deployments(env, mark, "host-patcher-named")?;
    assert!(seen.is_empty(), "requests reached the API server: {seen:?}");
    manager.stop().await;

    // The grant holds without the fence too: the plugin's own identity, straight to the API server.
    let as_plugin = kube::Client::try_from(
        service_account_config(&client, HOST_NS, "wcm-plugin-host-patcher-named").await?,
    )?;
    let direct: Api<Deployment> = Api::namespaced(as_plugin, HOST_NS);
    let mark = env.audit_mark()?;
    let refused = direct
        .patch(
            HOST_DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"wcm.test/pwned": "true"}}})),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 403),
        "the API server refuses the plugin in {HOST_NS}: {refused:?}"
    );
    let seen = writes_on_host_deployments(env, mark, "host-patcher-named")?;
    assert!(
        seen.len() == 1 && seen[0].starts_with("patch") && seen[0].ends_with("Some(403)"),
        "the audit log shows the one refused patch: {seen:?}"
    );

    // 2. A plugin acting in every namespace: `rbac` refuses to choose for the operator, and with
    // --all-namespaces (RBAC cannot leave wcm-system out) the host's fence still does.
    let dir = temp_dir("scope-all")?;
    std::fs::write(dir.join("all.toml"), "name = \"host-patcher-all\"\n")?;
    let wasm = install(&dir, "host-patcher", "all.wasm")?;
    let refusal = match generate(&wasm, &Allowances::default()).await {
        Ok(out) => anyhow::bail!("rbac printed a grant: {:?}", out.objects),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        refusal.contains("namespaces = [...]") && refusal.contains("--all-namespaces"),
        "{refusal}"
    );
    let out = generate(
        &wasm,
        &Allowances {
            all_namespaces: Allow::plugins(["host-patcher-all".to_string()]),
            risky: Allow::plugins(["host-patcher-all".to_string()]),
        },
    )
    .await?;
    assert_eq!(
        deployment_grants(&out.objects),
        [("ClusterRole".to_string(), None)]
    );
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("WARNING") && n.contains(HOST_NS)),
        "{:?}",
        out.notes
    );
    rbac::apply(&client, &out.objects).await?;
    let manager = start_manager_ungranted(test_config(&dir)).await?;
    let mark = env.audit_mark()?;
    cms.create(
        &PostParams::default(),
        &probe("all-host", &format!("{HOST_NS}/{HOST_DEPLOYMENT}"))?,
    )
    .await?;
    let host = reported_attacks::<Value>(&cms, "all-host").await?;
    assert_eq!(host["patch"]["reason"], "OutOfScope", "{host}");
    assert_eq!(host["get"]["reason"], "OutOfScope", "{host}");
    assert_eq!(
        host["list-all-namespaces"]["reason"], "OutOfScope",
        "a list across all namespaces would read {HOST_NS}: {host}"
    );
    let seen = writes_on_host_deployments(env, mark, "host-patcher-all")?;
    assert!(
        seen.is_empty(),
        "nothing of it reached the API server in {HOST_NS}: {seen:?}"
    );
    manager.stop().await;

    // What the API server stores: the host's Deployment exactly as it was.
    let after = host_deployments.get(HOST_DEPLOYMENT).await?;
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the host's Deployment was written"
    );
    let image = after
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.first().and_then(|c| c.image.clone()))
        .context("no image")?;
    assert_eq!(image, "wasm-controller-manager:1");

    // The cluster-wide grant goes again: other tests share this cluster.
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    bindings
        .delete(
            "wcm-plugin:host-patcher-all",
            &kube::api::DeleteParams::default(),
        )
        .await?;
    Ok(())
}
