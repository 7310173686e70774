//! Plugin objects in tests: the CRD of `manifests/`, their conditions, and host processes that
//! serve them.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use wasm_controller_manager::loading::objects;

use super::{eventually, http_get_at};

/// Applies the Plugin CRD of `manifests/` and waits until Plugins can be listed.
pub async fn install_crd(client: &kube::Client) -> Result<()> {
    let text =
        std::fs::read_to_string(testenv::repo_root().join("manifests/crds/plugins.wcm.dev.yaml"))?;
    let crd: Value = serde_yaml_ng::from_str(&text)?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.patch(
        "plugins.wcm.dev",
        &PatchParams::apply("plugin-objects-test").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    let plugins: Api<DynamicObject> = Api::all_with(client.clone(), &objects::resource());
    eventually("the Plugin CRD served", Duration::from_secs(30), || async {
        Ok(plugins
            .list(&Default::default())
            .await
            .is_ok()
            .then_some(()))
    })
    .await
}

/// The condition `t` of a Plugin object's status.
pub fn condition<'a>(o: &'a DynamicObject, t: &str) -> Option<&'a Value> {
    o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}

/// A free loopback port (bound, then let go).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `run`'s arguments for per-plugin leader election with Leases in `lease_ns`, timed for tests
/// (lease duration 6 s, renew deadline 4 s, retry period 0.5 s).
pub fn per_plugin_election(lease_ns: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-elect-mode",
        "per-plugin",
        "--leader-elect-resource-namespace",
        lease_ns,
        "--leader-elect-lease-duration",
        "6s",
        "--leader-elect-renew-deadline",
        "4s",
        "--leader-elect-retry-period",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A `wasm-controller-manager run` process of this build, killed when dropped.
pub struct HostProcess {
    pub child: Child,
    /// `--metrics-addr` (also /plugins and /debug/controllers).
    pub addr: SocketAddr,
}

impl HostProcess {
    /// `pod_name` goes into its identity (as POD_NAME in a Deployment); stderr goes to `log`.
    pub fn start(
        kubeconfig: &Path,
        plugins_dir: &Path,
        pod_name: &str,
        log: &Path,
        extra: &[String],
    ) -> Result<HostProcess> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let child = Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
            .env("POD_NAME", pod_name)
            .env("RUST_LOG", "wasm_controller_manager=info")
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--plugins-dir")
            .arg(plugins_dir)
            .args(["--metrics-addr", &addr.to_string()])
            .args(["--rescan-seconds", "2", "--retry-base-ms", "200"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(HostProcess { child, addr })
    }

    /// Its `/debug/controllers` entry for `file` (`Plugin/NAME` or `NAME.wasm`), if listed.
    pub async fn debug_entry(&self, file: &str) -> Result<Option<Value>> {
        let (_, body) = http_get_at(self.addr, "/debug/controllers").await?;
        let v: Value = serde_json::from_str(&body)?;
        Ok(v["plugins"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["file"] == file))
            .cloned())
    }

    /// Whether the process is still the one started (not exited).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
