//! Shared by the host's integration tests: the real compiled plugins and a manager started
//! against the test cluster.
#![allow(dead_code)]

pub mod deploying;
pub mod objects;
pub mod stamper;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::json;
use wasm_controller_manager::app::{Manager, RunConfig};
use wasm_controller_manager::cluster::discovery::Discovery;
use wasm_controller_manager::cluster::identity::IdentitySettings;
use wasm_controller_manager::cluster::services::BudgetSettings;
use wasm_controller_manager::engine::rate_limit::RateLimits;
use wasm_controller_manager::loading::plugins::FileStatus;
use wasm_controller_manager::loading::rbac;
use wasm_controller_manager::sandbox::Limits;

/// Where `scripts/build-plugins` puts the components.
pub fn artifacts_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WCM_PLUGIN_ARTIFACTS") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| testenv::repo_root().join("target"));
    target.join("wasm32-wasip2/plugin")
}

static BUILT: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Builds the plugins once per test binary (a no-op when they are fresh).
fn ensure_built() -> Result<()> {
    BUILT
        .get_or_init(|| {
            let script = testenv::repo_root().join("scripts/build-plugins");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .output()
                .map_err(|e| format!("run {}: {e}", script.display()))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{} failed:\n{}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The compiled component of a shipped plugin (`pod_counter`) or a test plugin (`well-behaved`).
pub fn plugin(name: &str) -> Result<PathBuf> {
    ensure_built()?;
    let dir = artifacts_dir();
    for candidate in [
        dir.join(format!("{name}.wasm")),
        dir.join("examples").join(format!("{name}.wasm")),
        dir.join("examples")
            .join(format!("{}.wasm", name.replace('-', "_"))),
    ] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("no component for plugin {name} in {}", dir.display())
}

/// Copies a plugin into a directory under `file_name` (atomically: write, then rename).
pub fn install(dir: &Path, name: &str, file_name: &str) -> Result<PathBuf> {
    let src = plugin(name)?;
    let dst = dir.join(file_name);
    let tmp = dir.join(format!(".{file_name}.tmp"));
    std::fs::copy(&src, &tmp).with_context(|| format!("copy {}", src.display()))?;
    std::fs::rename(&tmp, &dst)?;
    Ok(dst)
}

/// A fresh temp directory.
pub fn temp_dir(tag: &str) -> Result<PathBuf> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "wcm-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Settings that make failures show quickly in tests.
pub fn test_config(plugins_dir: &Path) -> RunConfig {
    RunConfig {
        plugin_objects: None,
        kubeconfig: None,
        plugins_dir: plugins_dir.to_path_buf(),
        compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
        // Shared by every test (many variants of the same plugins): never trimmed here.
        compile_cache_max_mb: 1 << 20,
        metrics_addr: Some("127.0.0.1:0".parse().expect("static address")),
        kube_qps: 200.0,
        kube_burst: 400,
        api_timeout: Duration::from_secs(10),
        default_workers: 2,
        limits: Limits {
            cpu_deadline: Duration::from_millis(300),
            memory: 32 << 20,
            ..Limits::default()
        },
        max_instances: 64,
        max_plugin_bytes: 16 << 20,
        rescan: Duration::from_secs(2),
        allowed_hosts: vec![],
        event_qps: 20.0,
        event_burst: 50,
        identity: IdentitySettings::default(),
        budgets: BudgetSettings {
            api_qps: 200.0,
            api_burst: 400,
            ..BudgetSettings::default()
        },
        max_workers_per_plugin: 16,
        wait_retry: Duration::from_secs(1),
        describe_timeout: Duration::from_secs(10),
        sync_timeout: Duration::from_secs(30),
        rate_limits: RateLimits {
            base_delay: Duration::from_millis(200),
            ..RateLimits::default()
        },
        leader_election: None,
        leader_mode: Default::default(),
        memory_reset: Default::default(),
        record: None,
        health_addr: None,
        controllers: Default::default(),
        shutdown_grace: Duration::from_secs(10),
    }
}

/// The host's client configuration for the shared test cluster (the admin's).
pub async fn host_config() -> Result<kube::Config> {
    let env = testenv::TestEnv::shared().await?;
    let path = env
        .kubeconfig_path()
        .context("the test cluster has no kubeconfig file")?;
    let kc = kube::config::Kubeconfig::read_from(path)?;
    Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
}

/// Starts a manager on the shared test cluster, after granting every plugin already in its
/// directory the RBAC generated from its declaration (as an operator would apply it).
pub async fn start_manager(cfg: RunConfig) -> Result<Manager> {
    grant_dir(&cfg.plugins_dir).await?;
    Manager::start(cfg, host_config().await?).await
}

/// Starts a manager without granting anything.
pub async fn start_manager_ungranted(cfg: RunConfig) -> Result<Manager> {
    Manager::start(cfg, host_config().await?).await
}

/// The RBAC `wasm-controller-manager rbac` generates for these plugin files (with their NAME.toml),
/// resolved through the test cluster's discovery.
pub async fn rbac_for(plugins: &[PathBuf]) -> Result<Vec<serde_json::Value>> {
    let env = testenv::TestEnv::shared().await?;
    let discovery = Discovery::new(env.client().await?, Duration::from_secs(10));
    let out = rbac::generate(
        &rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins: plugins.to_vec(),
            identity: IdentitySettings::default(),
            host_service_account: None,
            // The test plugins watch every namespace and act in the tests' own: the operator's
            // explicit choice (the host's fence still keeps them out of wcm-system).
            allow: wasm_controller_manager::cluster::rbac::Allowances {
                all_namespaces: wasm_controller_manager::cluster::rbac::Allow::every(),
                risky: wasm_controller_manager::cluster::rbac::Allow::every(),
            },
        },
        Some(&discovery),
    )
    .await?;
    Ok(out.objects)
}

/// Applies the generated RBAC of these plugin files.
pub async fn grant(plugins: &[PathBuf]) -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    rbac::apply(&env.client().await?, &rbac_for(plugins).await?).await
}

/// Grants every `.wasm` in `dir`.
pub async fn grant_dir(dir: &Path) -> Result<()> {
    grant_dir_in(testenv::TestEnv::shared().await?, dir).await
}

/// [`grant_dir`] in the cluster `env`.
pub async fn grant_dir_in(env: &testenv::TestEnv, dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let visible = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.starts_with('.'));
        if visible && p.extension().is_some_and(|x| x == "wasm") {
            files.push(p);
        }
    }
    // A file that is not a usable plugin has nothing to grant (the tests of bad files).
    for f in files {
        if let Ok(objects) = rbac_for(std::slice::from_ref(&f)).await {
            rbac::apply(&env.client().await?, &objects).await?;
        }
    }
    Ok(())
}

/// Polls `f` until it returns Some, or fails after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A metric's value summed over series whose labels include all of `labels`.
pub fn metric(m: &Manager, name: &str, labels: &[(&str, &str)]) -> f64 {
    testenv::sum_metric(&m.metrics.encode(), name, labels)
}

/// `wcm.test/reconciled` annotations (set by the well-behaved test plugin) by ConfigMap name.
pub async fn reconciled_annotations(
    cms: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
) -> Result<std::collections::BTreeMap<String, String>> {
    let list = cms.list(&kube::api::ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|c| {
            Some((
                c.metadata.name.clone()?,
                c.metadata
                    .annotations
                    .as_ref()?
                    .get("wcm.test/reconciled")?
                    .clone(),
            ))
        })
        .collect())
}

/// Creates ConfigMap `name` with `value` and waits until the well-behaved plugin has reconciled
/// it (its `wcm.test/reconciled` annotation holds the value).
pub async fn create_and_wait_reconciled(
    cms: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: &str,
    value: &str,
) -> Result<()> {
    cms.create(&PostParams::default(), &cm(name, &[("value", value)]))
        .await?;
    eventually(
        &format!("ConfigMap {name} reconciled"),
        Duration::from_secs(30),
        || async {
            Ok(reconciled_annotations(cms)
                .await?
                .get(name)
                .is_some_and(|v| v == value)
                .then_some(()))
        },
    )
    .await
}

/// One file's state in the manager's plugins directory.
pub async fn status_of(m: &Manager, stem: &str) -> Option<FileStatus> {
    m.plugins.status().await.get(stem).cloned()
}

/// Waits (up to a minute) until `stem.wasm`'s state satisfies `ok`.
pub async fn wait_status(
    m: &Manager,
    stem: &str,
    what: &str,
    ok: impl Fn(&FileStatus) -> bool,
) -> Result<FileStatus> {
    wait_status_within(m, stem, what, Duration::from_secs(60), ok).await
}

/// Waits up to `timeout` until `stem.wasm`'s state satisfies `ok`.
pub async fn wait_status_within(
    m: &Manager,
    stem: &str,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&FileStatus) -> bool,
) -> Result<FileStatus> {
    eventually(&format!("{stem}.wasm: {what}"), timeout, || async {
        Ok(status_of(m, stem).await.filter(|s| ok(s)))
    })
    .await
}

/// `GET path` on the manager's HTTP endpoint: the status code and body.
pub async fn http_get(m: &Manager, path: &str) -> Result<(u16, String)> {
    let addr = m
        .metrics_addr
        .context("the manager serves no HTTP endpoint")?;
    http_get_at(addr, path).await
}

/// `GET path` at `addr` over a fresh HTTP/1.0 connection: the status code and body.
pub async fn http_get_at(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP response: {head}"))?;
    Ok((code, body.to_string()))
}

/// Creates namespace `name` unless it exists.
pub async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A client configuration acting as ServiceAccount `namespace/name` (created when missing), with a
/// token the API server issues for it.
pub async fn service_account_config(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<kube::Config> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::config::{AuthInfo, Kubeconfig};

    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?;
    let issued: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await?;
    let token = issued.status.context("no token issued")?.token;
    let env = testenv::TestEnv::shared().await?;
    let mut kc = Kubeconfig::read_from(env.kubeconfig_path().context("kubeconfig")?)?;
    for a in &mut kc.auth_infos {
        a.auth_info = Some(serde_json::from_value::<AuthInfo>(
            json!({ "token": token }),
        )?);
    }
    Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
}

/// `wasm-controller-manager replay FILE PLUGIN` offline (no kubeconfig): its output, after
/// checking it succeeded.
pub fn replay_offline(file: &Path, wasm: &Path) -> Result<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
        .arg("replay")
        .arg(file)
        .arg(wasm)
        .env_remove("KUBECONFIG")
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "replay failed: {text}");
    Ok(text)
}

/// What a hostile probe plugin reports, as JSON, in the annotation `wcm.test/attacks` of
/// ConfigMap `name`: each attempt and the answer it got.
pub async fn reported_attacks<T: serde::de::DeserializeOwned>(
    cms: &Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: &str,
) -> Result<T> {
    eventually(
        &format!("the plugin reports its attempts on {name}"),
        Duration::from_secs(60),
        || async {
            let c = cms.get(name).await?;
            let Some(text) = c
                .metadata
                .annotations
                .and_then(|a| a.get("wcm.test/attacks").cloned())
            else {
                return Ok(None);
            };
            Ok(Some(serde_json::from_str(&text)?))
        },
    )
    .await
}

/// A ConfigMap named `name` with these data entries.
pub fn cm(name: &str, data: &[(&str, &str)]) -> k8s_openapi::api::core::v1::ConfigMap {
    k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

/// The first recording (in file-name order) in `dir` of key `namespace/name` whose outbound HTTP
/// created a network in Neutron (a POST to `/v2.0/networks`).
pub fn recording_creating_network(
    dir: &Path,
    namespace: &str,
    name: &str,
) -> Result<Option<PathBuf>> {
    let suffix = format!("-{namespace}_{name}.json");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d.filter_map(|e| Some(e.ok()?.path())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    files.retain(|p| p.to_string_lossy().ends_with(&suffix));
    files.sort();
    for f in files {
        let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&f)?)?;
        let creates = rec["http"].as_array().is_some_and(|h| {
            h.iter().any(|x| {
                x["args"]["method"] == "POST"
                    && x["args"]["uri"]
                        .as_str()
                        .is_some_and(|u| u.ends_with("/v2.0/networks"))
            })
        });
        if creates {
            return Ok(Some(f));
        }
    }
    Ok(None)
}

/// The deletes in `namespace` the API server's audit log saw since `mark`, as
/// `resource/name by user`.
pub fn deletes_since(
    env: &testenv::TestEnv,
    mark: testenv::AuditMark,
    namespace: &str,
) -> Result<Vec<String>> {
    Ok(env
        .audit_events_since(mark)?
        .into_iter()
        .filter(|e| e.verb == "delete" && e.stage == "ResponseComplete")
        .filter_map(|e| {
            let o = e.object_ref.as_ref()?;
            (o.namespace == namespace)
                .then(|| format!("{}/{} by {}", o.resource, o.name, e.effective_user()))
        })
        .collect())
}

/// The (manager, operation) pairs of an object's managedFields.
pub fn managers(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<(String, String)> {
    meta.managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
            )
        })
        .collect()
}

pub fn plugin_user(plugin: &str) -> String {
    format!("system:serviceaccount:wcm-system:wcm-plugin-{plugin}")
}
