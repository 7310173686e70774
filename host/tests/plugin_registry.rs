//! Plugins delivered as Plugin objects from a real OCI registry (CNCF distribution on loopback,
//! `testenv/registry/`, with TLS from its own CA and basic auth), served by two host processes in
//! per-plugin leader mode, judged by what the API server and the registry's own request log saw:
//! a Plugin pinned by digest starts in both replicas and is led by one; `kubectl get plugins`
//! (the API server's Table) shows it Ready with its leader; a new digest swaps the version in
//! both without a restart and without losing a reconcile; deleting the Plugin stops it in both;
//! the network plugin delivered this way makes a Network Ready in the real Neutron, and the Python
//! plugin (18 MB) delivered this way reconciles.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use common::objects::{HostProcess, install_crd, per_plugin_election};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::OpenStack;
use testenv::registry::{Layout, Registry, RegistryOptions};
use wasm_controller_manager::loading::objects;

const PULL_SECRET: &str = "regcred";
const IDENTITY_NS: &str = "wcm-system";

fn plugin_object(name: &str, reference: &str, settings: Option<Value>) -> Result<DynamicObject> {
    let mut o = json!({
        "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
        "metadata": {"name": name},
        "spec": {"source": {"oci": reference}, "pullSecret": PULL_SECRET},
    });
    if let Some(s) = settings {
        o["spec"]["settings"] = s;
    }
    Ok(serde_json::from_value(o)?)
}

/// The pull Secret, in the namespace the hosts read pull Secrets from.
async fn pull_secret(client: &kube::Client, registry: &Registry) -> Result<()> {
    ensure_namespace(client, IDENTITY_NS).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), IDENTITY_NS);
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": PULL_SECRET, "annotations": {"wcm.dev/plugins": "*"}},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": registry.dockerconfigjson()},
    }))?;
    secrets
        .patch(
            PULL_SECRET,
            &PatchParams::apply("plugin-registry-test").force(),
            &Patch::Apply(&s),
        )
        .await?;
    Ok(())
}

/// The rows of `kubectl get plugins`: what the API server's Table rendering of the CRD's printer
/// columns gives, by column name.
async fn kubectl_get_plugins(client: &kube::Client) -> Result<Vec<(String, Value)>> {
    let request = http::Request::get("/apis/wcm.dev/v1alpha1/plugins")
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())?;
    let table: Value = client.request(request).await?;
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .context("columnDefinitions")?
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let mut out = Vec::new();
    for row in table["rows"].as_array().context("rows")? {
        let cells = row["cells"].as_array().context("cells")?;
        let by_name: serde_json::Map<String, Value> =
            columns.iter().cloned().zip(cells.iter().cloned()).collect();
        let name = by_name
            .get("Name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        out.push((name, Value::Object(by_name)));
    }
    Ok(out)
}

async fn lease_holder(leases: &Api<Lease>, plugin: &str) -> Result<String> {
    Ok(leases
        .get_opt(&format!("wasm-controller-manager-plugin-{plugin}"))
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}

/// Waits until both hosts run `file` with the component `sha256`.
async fn running_in_both(
    hosts: &[&HostProcess],
    file: &str,
    sha256: &str,
    what: &str,
) -> Result<()> {
    eventually(what, Duration::from_secs(240), || async {
        for h in hosts {
            let Some(e) = h.debug_entry(file).await? else {
                return Ok(None);
            };
            if e["state"] != "running" || e["sha256"] != sha256 {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// The settings of `network.toml` as `testenv` writes them for this OpenStack, as a Plugin's
/// `spec.settings`.
fn network_settings(dir: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(dir.join("network.toml"))?;
    let table: toml::Table = toml::from_str(&text)?;
    Ok(serde_json::to_value(table)?)
}

/// Runs `wasm-controller-manager push ARGS` as the registry's user (password on stdin, unless
/// `password` says another); returns stdout, stderr and success.
fn push_cli(
    registry: &Registry,
    ca: &Path,
    args: &[String],
    password: Option<&str>,
) -> Result<(String, String, bool)> {
    use std::io::Write as _;
    let creds = registry.credentials().context("auth")?;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("push")
        .args(args)
        .args([
            "--username",
            &creds.username,
            "--password-stdin",
            "--registry-ca",
        ])
        .arg(ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(format!("{}\n", password.unwrap_or(&creds.password)).as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    ))
}

/// `push` refuses a core module, a file over its cap and a wrong password, each with a clear
/// error, and nothing is stored (the registry's own log).
#[tokio::test(flavor = "multi_thread")]
async fn push_refuses_what_is_not_a_plugin_and_stores_nothing() -> Result<()> {
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    let work = temp_dir("push-refusals")?;
    let ca = work.join("ca.pem");
    std::fs::write(&ca, registry.ca_pem().context("ca")?)?;
    let core = work.join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0")?;
    let target = format!("{}/plugins/refused:1", registry.host());
    let wb = plugin("well-behaved")?.display().to_string();
    let mark = registry.request_mark()?;
    let (_, err, ok) = push_cli(
        &registry,
        &ca,
        &[core.display().to_string(), target.clone()],
        None,
    )?;
    assert!(!ok && err.contains("core WebAssembly module"), "{err}");
    let (_, err, ok) = push_cli(
        &registry,
        &ca,
        &[
            wb.clone(),
            target.clone(),
            "--max-plugin-bytes".into(),
            "1000".into(),
        ],
        None,
    )?;
    assert!(!ok && err.contains("more than --max-plugin-bytes"), "{err}");
    assert_eq!(
        registry.requests_since(mark)?,
        Vec::new(),
        "nothing asked of the registry"
    );
    let (_, err, ok) = push_cli(&registry, &ca, &[wb.clone(), target.clone()], Some("wrong"))?;
    assert!(!ok && err.contains("Unauthorized"), "{err}");
    let seen = registry.requests_since(mark)?;
    assert!(
        !seen.is_empty() && seen.iter().all(|r| r.status == 401),
        "every request refused: {seen:#?}"
    );
    // The right password: pushed, and the printed Plugin names it.
    let (out, err, ok) = push_cli(
        &registry,
        &ca,
        &[
            wb,
            target.clone(),
            "--plugin-name".into(),
            "refused-then-pushed".into(),
        ],
        None,
    )?;
    assert!(ok, "{err}");
    assert!(
        out.contains("kind: Plugin") && out.contains(&format!("oci: {target}@sha256:")),
        "{out}"
    );
    let manifest_put = registry
        .requests_since(mark)?
        .into_iter()
        .find(|r| r.method == "PUT" && r.path.ends_with("/manifests/1"))
        .context("the manifest was put")?;
    assert_eq!(manifest_put.status, 201, "{manifest_put:?}");
    Ok(())
}

fn sha_of(path: &Path) -> Result<String> {
    Ok(wasm_controller_manager::sandbox::sha256_hex(
        &std::fs::read(path)?,
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_pull_lead_swap_and_stop_plugins_from_a_registry() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    install_crd(&client).await?;
    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await?;
    let work = temp_dir("plugin-registry")?;
    let ca = work.join("registry-ca.pem");
    std::fs::write(&ca, registry.ca_pem().context("a TLS registry has a CA")?)?;
    pull_secret(&client, &registry).await?;
    let os = OpenStack::start().await?;

    // The artifacts: well-behaved in the CNCF layout, a second version of it (a custom section
    // appended) in the older wasm-to-oci layout, the network plugin, the Python plugin.
    let wb = plugin("well-behaved")?;
    let mut wb2_bytes = std::fs::read(&wb)?;
    wb2_bytes.extend_from_slice(&[0, 8, 4, b'w', b'c', b'm', b'2', 1, 2, 3]);
    let wb2 = work.join("well-behaved-2.wasm");
    std::fs::write(&wb2, &wb2_bytes)?;
    let wb_ref = registry
        .push_with(
            &wb,
            "plugins/well-behaved",
            "1",
            Layout::Cncf,
            &Default::default(),
        )
        .await?
        .reference;
    let wb2_ref = registry
        .push_with(
            &wb2,
            "plugins/well-behaved",
            "2",
            Layout::WasmToOci,
            &Default::default(),
        )
        .await?
        .reference;
    // The network plugin pushed as an author would, with `wasm-controller-manager push`.
    let (out, err, ok) = push_cli(
        &registry,
        &ca,
        &[
            plugin("network")?.display().to_string(),
            format!("{}/plugins/network:1.0", registry.host()),
        ],
        None,
    )?;
    assert!(ok, "push failed: {err}");
    let net_ref = out.trim().to_string();
    assert!(
        net_ref.starts_with(&format!("{}/plugins/network:1.0@sha256:", registry.host())),
        "{net_ref}"
    );
    let py = plugin("config_reloader")?;
    let py_ref = registry
        .push_with(
            &py,
            "plugins/config-reloader",
            "1",
            Layout::Cncf,
            &Default::default(),
        )
        .await?
        .reference;

    // Grants, as `rbac` prints them for each plugin (the network plugin's with its settings: the
    // Secret it reads).
    let ns = env.namespace("plugin-registry").await?;
    let grants = temp_dir("plugin-registry-grants")?;
    install(&grants, "well-behaved", "well-behaved.wasm")?;
    install(&grants, "config_reloader", "config-reloader.wasm")?;
    os.configure_network_plugin(&client, &ns.name, &grants, "")
        .await?;
    install(&grants, "network", "network.wasm")?;
    grant_dir(&grants).await?;
    let net_settings = network_settings(&grants)?;
    let object_hosts: Vec<String> = net_settings["allowed_hosts"]
        .as_array()
        .context("allowed_hosts")?
        .iter()
        .filter_map(|h| h.as_str().map(str::to_string))
        .collect();

    // Two replicas, per-plugin leader election, no plugin in their directories.
    let lease_ns = env.namespace("plugin-registry-leases").await?;
    let logs = temp_dir("plugin-registry-logs")?;
    let start = |name: &str| -> Result<HostProcess> {
        let dir = work.join(format!("{name}-plugins"));
        std::fs::create_dir_all(&dir)?;
        let mut args = per_plugin_election(&lease_ns.name);
        args.extend(
            [
                "--plugin-objects",
                "--plugin-registry",
                registry.host(),
                "--plugin-registry-ca",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.push(ca.display().to_string());
        args.push("--plugin-cache".into());
        args.push(work.join(format!("{name}-cache")).display().to_string());
        // Compiled components are shared with the other tests (by content).
        args.extend([
            "--compile-cache-max-mb".to_string(),
            (1u64 << 20).to_string(),
        ]);
        args.push("--compile-cache".into());
        args.push(
            std::env::temp_dir()
                .join("wcm-test-compile-cache")
                .display()
                .to_string(),
        );
        for h in &object_hosts {
            args.push("--plugin-object-host".into());
            args.push(h.clone());
        }
        // Neutron answers in tens of milliseconds; a slow request is not the guest's CPU.
        args.extend(["--cpu-deadline-ms".to_string(), "1000".to_string()]);
        HostProcess::start(
            &kubeconfig,
            &dir,
            name,
            &logs.join(format!("{name}.log")),
            &args,
        )
    };
    let mut first = start("first")?;
    let mut second = start("second")?;
    let plugins: Api<DynamicObject> = Api::all_with(client.clone(), &objects::resource());
    for name in ["well-behaved", "network", "config-reloader"] {
        let _ = plugins.delete(name, &DeleteParams::default()).await;
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_ns.name);

    // 1. A Plugin pinned by digest: pulled once by each replica, running in both, led by one.
    let mark = registry.request_mark()?;
    plugins
        .create(
            &PostParams::default(),
            &plugin_object("well-behaved", &wb_ref, None)?,
        )
        .await?;
    let wb_sha = sha_of(&wb)?;
    running_in_both(
        &[&first, &second],
        "Plugin/well-behaved",
        &wb_sha,
        "well-behaved from the registry running in both replicas",
    )
    .await?;
    let holder = eventually("a leader", Duration::from_secs(30), || async {
        let h = lease_holder(&leases, "well-behaved").await?;
        Ok((!h.is_empty()).then_some(h))
    })
    .await?;
    let pulled = registry.requests_since(mark)?;
    let layer_gets: Vec<_> = pulled
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/blobs/") && r.status == 200)
        .collect();
    assert_eq!(
        layer_gets.len(),
        2,
        "one layer pull per replica, with credentials: {pulled:#?}"
    );
    assert!(
        layer_gets.iter().all(|r| !r.user.is_empty()),
        "{layer_gets:#?}"
    );

    // It reconciles (in the leading replica only: per-plugin election).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    create_and_wait_reconciled(&cms, "first", "1").await?;

    // `kubectl get plugins`: Ready, and the leader the Lease names.
    let row = eventually(
        "kubectl get plugins: Ready with its leader",
        Duration::from_secs(30),
        || async {
            let rows = kubectl_get_plugins(&client).await?;
            Ok(rows
                .into_iter()
                .find(|(n, r)| {
                    n == "well-behaved" && r["Ready"] == "True" && r["Leader"] == holder.as_str()
                })
                .map(|(_, r)| r))
        },
    )
    .await?;
    println!("kubectl get plugins: {row}");
    assert!(
        row["Source"]
            .as_str()
            .is_some_and(|s| s.ends_with(wb_ref.rsplit('@').next().unwrap_or("-"))),
        "{row}"
    );
    // Each replica's entry in the status, from the API server.
    let o = plugins.get("well-behaved").await?;
    let replicas = o.data["status"]["replicas"]
        .as_array()
        .context("status.replicas")?;
    assert_eq!(replicas.len(), 2, "{replicas:#?}");
    assert_eq!(
        replicas
            .iter()
            .filter(|r| r["leading"] == true && r["state"] == "running")
            .count(),
        1,
        "{replicas:#?}"
    );
    assert!(
        o.data["status"]["declares"]["permissions"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "declares: {}",
        o.data["status"]["declares"]
    );

    // The entry of a replica gone long ago (a Pod replaced by a rollout), written under its own
    // field manager as it would have: removed by the replica that writes the object's status.
    plugins
        .patch_status(
            "well-behaved",
            &PatchParams::apply("wcm-replica-gone_0").force(),
            &Patch::Apply(json!({
                "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
                "status": {"replicas": [{"name": "gone_0", "state": "running",
                    "lastSeen": "2026-01-01T00:00:00Z"}]},
            })),
        )
        .await?;

    // 2. A new digest: swapped in both replicas without a restart, and every ConfigMap created
    // meanwhile is reconciled.
    let swap = {
        let cms = cms.clone();
        tokio::spawn(async move {
            for i in 0..20 {
                cms.create(
                    &PostParams::default(),
                    &cm(&format!("during-{i}"), &[("value", "d")]),
                )
                .await?;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    plugins
        .patch(
            "well-behaved",
            &PatchParams::apply("plugin-registry-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
                "spec": {"source": {"oci": wb2_ref}, "pullSecret": PULL_SECRET},
            })),
        )
        .await?;
    let wb2_sha = sha_of(&wb2)?;
    running_in_both(
        &[&first, &second],
        "Plugin/well-behaved",
        &wb2_sha,
        "the new digest (wasm-to-oci layout) running in both replicas",
    )
    .await?;
    swap.await??;
    eventually(
        "every ConfigMap created during the swap reconciled",
        Duration::from_secs(60),
        || async {
            let done = reconciled_annotations(&cms).await?;
            Ok((0..20)
                .all(|i| done.get(&format!("during-{i}")).is_some_and(|v| v == "d"))
                .then_some(()))
        },
    )
    .await?;
    assert!(first.alive() && second.alive(), "no replica restarted");
    let names = eventually(
        "the gone replica's entry removed, the live ones kept",
        Duration::from_secs(30),
        || async {
            let o = plugins.get("well-behaved").await?;
            let names: Vec<String> = o.data["status"]["replicas"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["name"].as_str().map(str::to_string))
                .collect();
            Ok((names.len() == 2 && !names.iter().any(|n| n == "gone_0")).then_some(names))
        },
    )
    .await?;
    println!("status.replicas after the swap: {names:?}");

    // 3. The network plugin from the registry: a Network Ready in the real Neutron.
    plugins
        .create(
            &PostParams::default(),
            &plugin_object("network", &net_ref, Some(net_settings.clone()))?,
        )
        .await?;
    let networks: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "samplecrd.k8s.io",
            "v1",
            "Network",
        )),
    );
    let created = networks
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
                "metadata": {"name": "from-registry"},
                "spec": {"cidr": "10.77.0.0/24", "gateway": "10.77.0.1"},
            }))?,
        )
        .await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let net = eventually("the Network Ready", Duration::from_secs(240), || async {
        let n = networks.get("from-registry").await?;
        let ready = n.data["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        Ok(ready.then_some(n))
    })
    .await?;
    let token = os.user_token()?;
    let in_neutron = os.neutron_get(&token, &format!("networks?tags=k8s-uid-{uid}"))?;
    let found = in_neutron["networks"].as_array().context("networks")?;
    assert_eq!(found.len(), 1, "{in_neutron}");
    assert_eq!(net.data["status"]["networkId"], found[0]["id"]);

    // 4. The Python plugin (18 MB) from the registry: it sets the hash of the ConfigMaps a
    // Deployment uses on its Pod template.
    let py_cm = json!({"metadata": {"name": "web-config",
        "labels": {"config-reloader.wcm.io/deployment": "web"}}, "data": {"value": "1"}});
    cms.create(&PostParams::default(), &serde_json::from_value(py_cm)?)
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web", "labels": {"config-reloader.wcm.io/enabled": "true"}},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "nginx",
                            "envFrom": [{"configMapRef": {"name": "web-config"}}]}]},
                    }
                }
            }))?,
        )
        .await?;
    plugins
        .create(
            &PostParams::default(),
            &plugin_object("config-reloader", &py_ref, None)?,
        )
        .await?;
    running_in_both(
        &[&first, &second],
        "Plugin/config-reloader",
        &sha_of(&py)?,
        "the Python plugin from the registry running in both replicas",
    )
    .await?;
    eventually(
        "the Python plugin set the config hash",
        Duration::from_secs(60),
        || async {
            let d = deployments.get("web").await?;
            Ok(d.spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.annotations)
                .and_then(|a| a.get("config-reloader.wcm.io/config-hash").cloned()))
        },
    )
    .await?;

    // 5. Deleted: stopped in both replicas.
    plugins
        .delete("well-behaved", &DeleteParams::default())
        .await?;
    eventually(
        "stopped in both replicas",
        Duration::from_secs(30),
        || async {
            Ok((first.debug_entry("Plugin/well-behaved").await?.is_none()
                && second.debug_entry("Plugin/well-behaved").await?.is_none())
            .then_some(()))
        },
    )
    .await?;
    // The Network goes while its plugin still runs (its finalizer is the plugin's).
    networks
        .delete("from-registry", &DeleteParams::default())
        .await?;
    eventually("the Network deleted", Duration::from_secs(60), || async {
        Ok(networks
            .get_opt("from-registry")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    for name in ["network", "config-reloader"] {
        plugins.delete(name, &DeleteParams::default()).await?;
    }
    assert!(first.alive() && second.alive(), "no replica restarted");
    drop((first, second));
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
