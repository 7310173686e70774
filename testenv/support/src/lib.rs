//! Test support: a real kube-apiserver backed by real etcd, one per test binary.
//!
//! [`TestEnv::shared`] starts the cluster the first time a test asks for it (building the `testenv`
//! Go program through `testenv/build.sh` if its cached binary is missing), installs the CRDs from
//! `manifests/crds/`, and hands every test the same cluster. Each test takes its own namespace with
//! [`TestEnv::namespace`]. The cluster goes away with the test process: `testenv` exits when its
//! stdin closes.
//!
//! Set `WCM_USE_EXISTING_CLUSTER=1` to run the same tests against the cluster of your own
//! `KUBECONFIG` instead; tests that need to stop the apiserver are then skipped with a message.
//!
//! The local cluster keeps the apiserver's audit log ([`audit`]): tests read what the apiserver
//! itself saw with [`TestEnv::audit_events`] and [`TestEnv::audit_events_since`].
//!
//! [`OpenStack`] runs real Keystone + Neutron API servers on loopback for the network plugin's
//! tests ([`openstack`]).
//!
//! [`Registry`] runs a real OCI registry (CNCF distribution) on loopback, with TLS and basic auth
//! on demand, and pushes wasm components to it ([`registry`]).
//!
//! [`Collector`] runs a real OpenTelemetry Collector (OTLP receiver, file exporter) on loopback
//! and reads back the spans it received ([`otelcol`]).
//!
//! [`kustomize()`] renders a kustomization as `kubectl kustomize` does, without kubectl.

pub mod audit;
mod control;
pub mod crds;
pub mod kustomize;
mod namespace;
pub mod node;
pub mod openstack;
pub mod openstack_api;
pub mod otelcol;
pub mod proxy;
pub mod registry;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use audit::{AuditEvent, AuditMark};
pub use control::ReadyInfo;
pub use kustomize::kustomize;
pub use namespace::TestNamespace;
pub use node::{ImageFile, ImageSpec, Node, NodeStart};
pub use openstack::{OpenStack, OpenStackInfo, RequestRecord};
pub use otelcol::{Collector, CollectorOptions, SpanRecord, SpanStatus};
pub use proxy::CuttableProxy;
pub use registry::{Registry, RegistryOptions};

use control::Control;

/// Environment variable that selects an existing cluster (from `KUBECONFIG`) instead of a local one.
pub const USE_EXISTING_CLUSTER: &str = "WCM_USE_EXISTING_CLUSTER";
/// Environment variable naming a prebuilt `testenv` binary (skips `testenv/build.sh`).
pub const TESTENV_BIN: &str = "WCM_TESTENV_BIN";

/// One cluster shared by the tests of a test binary.
pub struct TestEnv {
    kubeconfig: Kubeconfig,
    kubeconfig_path: Option<PathBuf>,
    /// Present when this process started the cluster and may stop and start its apiserver.
    control: Option<Control>,
}

static SHARED: tokio::sync::OnceCell<TestEnv> = tokio::sync::OnceCell::const_new();

impl TestEnv {
    /// The cluster of this test binary, started on first use.
    pub async fn shared() -> Result<&'static TestEnv> {
        SHARED.get_or_try_init(Self::start).await
    }

    /// A cluster of the caller's own (not shared), started with extra `testenv` flags, e.g.
    /// `--sharded-list-and-watch=false`. Stopped when dropped. Needs the local cluster (not
    /// `WCM_USE_EXISTING_CLUSTER`).
    pub async fn start_own(extra_args: &[&str]) -> Result<TestEnv> {
        anyhow::ensure!(
            !existing_cluster_requested(),
            "a cluster of its own needs the local testenv, not WCM_USE_EXISTING_CLUSTER"
        );
        Self::start_local(extra_args).await
    }

    /// The local cluster, started with `extra_args`, its CRDs installed.
    async fn start_local(extra_args: &[&str]) -> Result<TestEnv> {
        let bin = testenv_binary()?;
        let args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let control = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Control::spawn(&bin, &args)
        })
        .await
        .context("testenv start task failed")??;
        let path = PathBuf::from(&control.info().kubeconfig);
        let kubeconfig = Kubeconfig::read_from(&path)
            .with_context(|| format!("read the testenv kubeconfig {}", path.display()))?;
        let env = TestEnv {
            kubeconfig,
            kubeconfig_path: Some(path),
            control: Some(control),
        };
        let client = env.client().await?;
        crds::install_all(&client, &manifests_dir().join("crds")).await?;
        Ok(env)
    }

    async fn start() -> Result<TestEnv> {
        if !existing_cluster_requested() {
            return Self::start_local(&[]).await;
        }
        let kubeconfig = Kubeconfig::read().context(
            "WCM_USE_EXISTING_CLUSTER is set but no kubeconfig could be read (KUBECONFIG or ~/.kube/config)",
        )?;
        let env = TestEnv {
            kubeconfig,
            kubeconfig_path: std::env::var_os("KUBECONFIG").map(PathBuf::from),
            control: None,
        };
        let client = env.client().await?;
        crds::install_all(&client, &manifests_dir().join("crds")).await?;
        Ok(env)
    }

    /// A new client for this cluster. Make one per test: a client is bound to the tokio runtime
    /// that created it, and every `#[tokio::test]` has its own runtime.
    pub async fn client(&self) -> Result<Client> {
        Client::try_from(self.config().await?).context("build a kube client")
    }

    /// The admin client configuration, to derive other clients from (e.g. one that impersonates
    /// a ServiceAccount through `auth_info.impersonate`).
    pub async fn config(&self) -> Result<kube::Config> {
        kube::Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .context("build a client config from the kubeconfig")
    }

    /// The kubeconfig in use, when it is a file (always for the local cluster).
    pub fn kubeconfig_path(&self) -> Option<&Path> {
        self.kubeconfig_path.as_deref()
    }

    /// What `testenv` reported when the local cluster became ready; `None` for an existing cluster.
    pub fn local(&self) -> Option<ReadyInfo> {
        self.control.as_ref().map(|c| c.info())
    }

    /// Whether this process owns the apiserver, and so may stop and start it.
    pub fn can_restart_apiserver(&self) -> bool {
        self.control.is_some()
    }

    /// Kills the apiserver (SIGKILL, as a crash would); etcd keeps its data.
    pub async fn stop_apiserver(&self) -> Result<()> {
        let control = self.owned_control()?;
        let c = control.clone();
        tokio::task::spawn_blocking(move || c.command("stop", "stopped")).await??;
        Ok(())
    }

    /// Starts the apiserver again on the same port and waits until it is ready.
    pub async fn start_apiserver(&self) -> Result<()> {
        let c = self.owned_control()?.clone();
        tokio::task::spawn_blocking(move || c.command("start", "ready")).await??;
        Ok(())
    }

    /// Compacts etcd's history up to its current revision (as the apiserver's periodic compaction
    /// would): a watch resumed from an older resourceVersion then gets 410 Gone once the
    /// apiserver's watch cache does not hold it either (after a restart of the apiserver).
    pub async fn compact_etcd(&self) -> Result<()> {
        let c = self.owned_control()?.clone();
        tokio::task::spawn_blocking(move || c.command("compact", "compacted")).await??;
        Ok(())
    }

    fn owned_control(&self) -> Result<&Control> {
        self.control.as_ref().context(
            "this cluster is not owned by the tests (WCM_USE_EXISTING_CLUSTER): its apiserver cannot be stopped",
        )
    }

    /// A fresh namespace with its `default` ServiceAccount (no controller-manager creates it here).
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create(&self.client().await?, prefix).await
    }

    /// Whether the cluster keeps an audit log for the tests: the local one does, an existing
    /// cluster does not. (A stale testenv binary without one fails loudly instead of skipping.)
    pub fn has_audit_log(&self) -> bool {
        self.control.is_some()
    }

    /// Every event in the apiserver's audit log so far. Lines that do not parse are skipped.
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>> {
        audit::read_since(&self.audit_log_path()?, AuditMark::START)
    }

    /// The current end of the audit log, for [`TestEnv::audit_events_since`].
    pub fn audit_mark(&self) -> Result<AuditMark> {
        audit::mark(&self.audit_log_path()?)
    }

    /// The audit events written after `mark`. The apiserver writes a request's event before it
    /// completes the response, so every request whose response was read is in the result.
    pub fn audit_events_since(&self, mark: AuditMark) -> Result<Vec<AuditEvent>> {
        audit::read_since(&self.audit_log_path()?, mark)
    }

    fn audit_log_path(&self) -> Result<PathBuf> {
        let control = self.control.as_ref().context(
            "the audit log is only available on the local cluster (testenv), not with WCM_USE_EXISTING_CLUSTER",
        )?;
        let path = control.info().audit_log;
        anyhow::ensure!(
            !path.is_empty(),
            "this testenv binary writes no audit log; rebuild it with testenv/build.sh (or unset {TESTENV_BIN})"
        );
        Ok(PathBuf::from(path))
    }

    /// A numeric sample from the apiserver's own `/metrics`, summed over the series whose labels
    /// contain every `key="value"` pair given. Used to count watches and requests.
    pub async fn apiserver_metric(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let text = self
            .client()
            .await?
            .request_text(http::Request::get("/metrics").body(Vec::new())?)
            .await
            .context("GET /metrics from the apiserver")?;
        Ok(sum_metric(&text, name, labels))
    }
}

/// Sums the samples of metric `name` whose label set contains all of `labels`.
pub fn sum_metric(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            if !all {
                return None;
            }
            value.parse::<f64>().ok()
        })
        .sum()
}

fn existing_cluster_requested() -> bool {
    matches!(
        std::env::var(USE_EXISTING_CLUSTER).as_deref(),
        Ok("1") | Ok("true")
    )
}

/// The repository root: the nearest ancestor of the running package's directory that holds
/// `testenv/build.sh`. Found at run time (cargo sets `CARGO_MANIFEST_DIR` for tests and benches),
/// because a path compiled in goes stale when two clones share one target directory.
pub fn repo_root() -> PathBuf {
    let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .and_then(|dir| {
            dir.ancestors()
                .find(|d| d.join("testenv/build.sh").is_file())
                .map(Path::to_path_buf)
        })
        .unwrap_or(compiled_in)
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// `manifests/` of this repository.
pub fn manifests_dir() -> PathBuf {
    repo_root().join("manifests")
}

/// The `testenv` binary: `WCM_TESTENV_BIN`, or the cached build from `testenv/build.sh`.
pub fn testenv_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(TESTENV_BIN) {
        let bin = PathBuf::from(bin);
        anyhow::ensure!(
            bin.is_file(),
            "{TESTENV_BIN}={} is not a file",
            bin.display()
        );
        return Ok(bin);
    }
    run_build_script("testenv/build.sh")
}

/// Runs a build script of this repository (its messages go to stderr) and returns the one path it
/// prints.
pub(crate) fn run_build_script(relative: &str) -> Result<PathBuf> {
    let script = repo_root().join(relative);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}); see the message above",
        script.display(),
        out.status
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    anyhow::ensure!(!path.is_empty(), "{} printed no path", script.display());
    Ok(PathBuf::from(path))
}
