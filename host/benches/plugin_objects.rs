//! Plugins as cluster objects, against the real test cluster and a real OCI registry (CNCF
//! distribution on loopback, TLS and basic auth), with this build's host binary in its own
//! process:
//!
//! - the time from the create of a Plugin (what `kubectl apply` does) to its first reconcile's
//!   write, as the API server has it: **cold** (a host with empty plugin and compile caches, bytes
//!   no one compiled before: pull, compile, describe, grant check, start) and **cached** (a new
//!   host process with the caches the first one filled: no download, no compile), for a Rust plugin
//!   (`well-behaved`, 0.45 MB) and the Python one (`config-reloader`, 18 MB);
//! - the RSS of one replica with 20 plugins from the registry (20 distinct components), beside the
//!   same host with none.
//!
//! Run: `scripts/build-plugins && cargo bench -p wasm-controller-manager --bench plugin_objects`
//! (needs WCM_TESTENV_BIN and WCM_TESTENV_REGISTRY_BIN, as `scripts/bench-compare` sets them; prints
//! a table; docs/benchmarks.md keeps the numbers).

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::registry::{Layout, Registry, RegistryOptions};
use wasm_controller_manager::loading::objects;

use common::{artifact, rss_mib_of};

const HASH: &str = "config-reloader.wcm.io/config-hash";

struct Host {
    child: Child,
    addr: String,
}

impl Host {
    fn start(kubeconfig: &Path, registry: &Registry, ca: &Path, caches: &Path, tag: &str) -> Host {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let addr = format!("127.0.0.1:{port}");
        let dir = caches.join(format!("empty-plugins-{tag}"));
        std::fs::create_dir_all(&dir).expect("plugins dir");
        let log = std::fs::File::create(caches.join(format!("{tag}.log"))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
            .args(["--log", "warn", "run", "--kubeconfig"])
            .arg(kubeconfig)
            .arg("--plugins-dir")
            .arg(&dir)
            .args(["--metrics-addr", &addr, "--rescan-seconds", "2"])
            .args(["--plugin-objects", "--plugin-registry", registry.host()])
            .arg("--plugin-registry-ca")
            .arg(ca)
            .arg("--plugin-cache")
            .arg(caches.join("plugins"))
            .arg("--compile-cache")
            .arg(caches.join("compiled"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start the host binary");
        Host { child, addr }
    }

    fn running(&self) -> usize {
        let Some(mut s) = std::net::TcpStream::connect(&self.addr).ok() else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(s, "GET /plugins HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.lines()
            .filter(|l| l.starts_with("Plugin/") && l.split('\t').nth(1) == Some("running"))
            .count()
    }

    fn stop(mut self) {
        common::terminate(&mut self.child);
    }
}

/// `bytes` with a custom section holding `stamp` appended: the same component, bytes no one
/// compiled before.
fn stamped(bytes: &[u8], stamp: &str) -> Vec<u8> {
    let name = b"wcm-bench";
    let len = 1 + name.len() + stamp.len();
    assert!(len < 128, "one-byte section size");
    let mut out = bytes.to_vec();
    out.extend_from_slice(&[0, len as u8, name.len() as u8]);
    out.extend_from_slice(name);
    out.extend_from_slice(stamp.as_bytes());
    out
}

fn plugin_object(name: &str, reference: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "wcm.dev/v1alpha1", "kind": "Plugin",
        "metadata": {"name": name},
        "spec": {"source": {"oci": reference}, "pullSecret": "bench-regcred"},
    }))
    .expect("static object")
}

/// Polls every 20 ms until `f` gives a value; panics after `timeout`.
async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn annotation(cms: &Api<ConfigMap>, name: &str) -> Option<String> {
    cms.get(name)
        .await
        .ok()?
        .metadata
        .annotations?
        .get("wcm.test/reconciled")
        .cloned()
}

async fn template_hash(deployments: &Api<Deployment>) -> Option<String> {
    deployments
        .get("web")
        .await
        .ok()?
        .spec?
        .template
        .metadata?
        .annotations?
        .get(HASH)
        .cloned()
}

/// Creates the Plugin and waits for the Rust plugin's write on `probe` with `value`.
async fn time_rust(
    plugins: &Api<DynamicObject>,
    cms: &Api<ConfigMap>,
    name: &str,
    reference: &str,
    value: &str,
) -> Duration {
    let start = Instant::now();
    plugins
        .create(&PostParams::default(), &plugin_object(name, reference))
        .await
        .expect("create the Plugin");
    poll(
        "the Rust plugin's first write",
        Duration::from_secs(300),
        || async { (annotation(cms, "probe").await.as_deref() == Some(value)).then_some(()) },
    )
    .await;
    start.elapsed()
}

/// Creates the Plugin and waits for the Python plugin to set a hash other than `old`.
async fn time_python(
    plugins: &Api<DynamicObject>,
    deployments: &Api<Deployment>,
    name: &str,
    reference: &str,
    old: Option<String>,
) -> Duration {
    let start = Instant::now();
    plugins
        .create(&PostParams::default(), &plugin_object(name, reference))
        .await
        .expect("create the Plugin");
    poll(
        "the Python plugin's first write",
        Duration::from_secs(600),
        || async {
            let h = template_hash(deployments).await;
            (h.is_some() && h != old).then_some(())
        },
    )
    .await;
    start.elapsed()
}

async fn delete_and_wait(plugins: &Api<DynamicObject>, names: &[String]) {
    for n in names {
        let _ = plugins.delete(n, &DeleteParams::default()).await;
    }
    poll("the Plugins deleted", Duration::from_secs(60), || async {
        let mut all = true;
        for n in names {
            all &= plugins.get_opt(n).await.ok()?.is_none();
        }
        all.then_some(())
    })
    .await;
}

/// Grants plugin `source` under each of `names` (an instance name per NAME.toml), as an operator
/// applies what `rbac` prints.
async fn grant(env: &testenv::TestEnv, source: &str, names: &[String]) {
    let dir = std::env::temp_dir().join(format!("wcm-bench-objects-grant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("grant dir");
    for n in names {
        std::fs::copy(artifact(source), dir.join(format!("{n}.wasm"))).expect("copy");
        std::fs::write(dir.join(format!("{n}.toml")), format!("name = \"{n}\"\n")).expect("toml");
    }
    common::granted(env, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn run() {
    let env = testenv::TestEnv::shared().await.expect("test cluster");
    let client = env.client().await.expect("client");
    let kubeconfig = env.kubeconfig_path().expect("kubeconfig").to_path_buf();
    // The Plugin CRD of manifests/.
    let crd: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(testenv::repo_root().join("manifests/crds/plugins.wcm.dev.yaml"))
            .expect("crd"),
    )
    .expect("crd yaml");
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone())
        .patch("plugins.wcm.dev", &PatchParams::apply("bench").force(), &Patch::Apply(&crd))
        .await
        .expect("apply the CRD");
    let plugins: Api<DynamicObject> = Api::all_with(client.clone(), &objects::resource());
    poll("the Plugin CRD served", Duration::from_secs(30), || async {
        plugins.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;

    let registry = Registry::start(RegistryOptions {
        tls: true,
        auth: true,
    })
    .await
    .expect("registry");
    let work = std::env::temp_dir().join(format!("wcm-bench-objects-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let ca = work.join("ca.pem");
    std::fs::write(&ca, registry.ca_pem().expect("ca")).expect("ca file");
    let namespace: Namespace =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "wcm-system"}}))
        .expect("namespace");
    Api::<Namespace>::all(client.clone())
        .patch(
            "wcm-system",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&namespace),
        )
        .await
        .expect("wcm-system");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bench-regcred", "annotations": {"wcm.dev/plugins": "*"}},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": registry.dockerconfigjson()},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), "wcm-system")
        .patch(
            "bench-regcred",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("pull secret");

    let stamp = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let push = |name: &str, bytes: Vec<u8>, repo: String| {
        let path = work.join(format!("{name}.wasm"));
        std::fs::write(&path, bytes).expect("write");
        let registry = &registry;
        async move {
            registry
                .push_with(&path, &repo, "bench", Layout::Cncf, &Default::default())
                .await
                .expect("push")
                .reference
        }
    };
    let rust_bytes = std::fs::read(artifact("well_behaved")).expect("well-behaved");
    let py_bytes = std::fs::read(artifact("config_reloader")).expect("config_reloader");
    let rust_ref = push(
        "rust",
        stamped(&rust_bytes, &stamp),
        "bench/well-behaved".into(),
    )
    .await;
    let py_ref = push(
        "python",
        stamped(&py_bytes, &stamp),
        "bench/config-reloader".into(),
    )
    .await;
    grant(env, "well_behaved", &["bench-rust".to_string()]).await;
    grant(env, "config_reloader", &["bench-python".to_string()]).await;

    let ns = env.namespace("bench-objects").await.expect("namespace");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let cm = |name: &str, value: &str, label: bool| -> ConfigMap {
        let mut v = json!({"metadata": {"name": name}, "data": {"value": value}});
        if label {
            v["metadata"]["labels"] = json!({"config-reloader.wcm.io/deployment": "web"});
        }
        serde_json::from_value(v).expect("cm")
    };
    cms.create(&PostParams::default(), &cm("probe", "1", false))
        .await
        .expect("probe");
    cms.create(&PostParams::default(), &cm("web-config", "1", true))
        .await
        .expect("web-config");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"config-reloader.wcm.io/enabled": "true"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx",
                    "envFrom": [{"configMapRef": {"name": "web-config"}}]}]}}}
    }))
    .expect("deployment");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("deployment");

    let caches = work.join("caches");
    let names = vec!["bench-rust".to_string(), "bench-python".to_string()];
    delete_and_wait(&plugins, &names).await;

    // Cold: empty caches, bytes no one compiled.
    let host = Host::start(&kubeconfig, &registry, &ca, &caches, "cold");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rust_cold = time_rust(&plugins, &cms, "bench-rust", &rust_ref, "1").await;
    let py_cold = time_python(&plugins, &deployments, "bench-python", &py_ref, None).await;
    delete_and_wait(&plugins, &names).await;
    host.stop();

    // Cached: a new process with the caches the first filled; the objects change first, so each
    // first write is new.
    cms.patch(
        "probe",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "2"}})),
    )
    .await
    .expect("probe 2");
    let old_hash = template_hash(&deployments).await;
    cms.patch(
        "web-config",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "2"}})),
    )
    .await
    .expect("web-config 2");
    let host = Host::start(&kubeconfig, &registry, &ca, &caches, "cached");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rust_cached = time_rust(&plugins, &cms, "bench-rust", &rust_ref, "2").await;
    let py_cached = time_python(&plugins, &deployments, "bench-python", &py_ref, old_hash).await;
    delete_and_wait(&plugins, &names).await;
    host.stop();

    // RSS: the same host with none, then with 20 distinct plugins from the registry.
    let host = Host::start(&kubeconfig, &registry, &ca, &caches, "none");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_none = rss_mib_of(&host.child.id().to_string());
    host.stop();
    let twenty: Vec<String> = (0..20).map(|i| format!("bench-n{i}")).collect();
    grant(env, "well_behaved", &twenty).await;
    let mut refs = Vec::new();
    for (i, _) in twenty.iter().enumerate() {
        refs.push(
            push(
                &format!("n{i}"),
                stamped(&rust_bytes, &format!("{stamp}-{i}")),
                format!("bench/n{i}"),
            )
            .await,
        );
    }
    let host = Host::start(&kubeconfig, &registry, &ca, &caches, "twenty");
    let start = Instant::now();
    for (name, r) in twenty.iter().zip(&refs) {
        plugins
            .create(&PostParams::default(), &plugin_object(name, r))
            .await
            .expect("create");
    }
    poll("20 plugins running", Duration::from_secs(600), || async {
        (host.running() == 20).then_some(())
    })
    .await;
    let all_running = start.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_twenty = rss_mib_of(&host.child.id().to_string());
    delete_and_wait(&plugins, &twenty).await;
    host.stop();

    let secs = |d: Duration| d.as_secs_f64();
    println!("\n## Plugin objects: create of a Plugin to its first reconcile's write\n");
    println!("| plugin | cold (pull + compile) | cached (new process, warm caches) |");
    println!("|---|---|---|");
    println!(
        "| Rust `well-behaved` ({:.2} MB) | {:.2} s | {:.2} s |",
        rust_bytes.len() as f64 / 1e6,
        secs(rust_cold),
        secs(rust_cached)
    );
    println!(
        "| Python `config-reloader` ({:.1} MB) | {:.2} s | {:.2} s |",
        py_bytes.len() as f64 / 1e6,
        secs(py_cold),
        secs(py_cached)
    );
    println!("\n## One replica's RSS\n");
    println!("| plugins from the registry | RSS |");
    println!("|---|---|");
    println!("| none | {rss_none:.1} MiB |");
    println!(
        "| 20 distinct Rust components (all running {:.1} s after the creates, compiled cold) | {rss_twenty:.1} MiB |",
        secs(all_running)
    );
    let _ = std::fs::remove_dir_all(&work);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run());
}
