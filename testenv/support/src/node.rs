//! A real node for the tests that need one (opt in with [`Node::start`]): a kubelet with
//! containerd, runc and the CNI bridge, plus kube-controller-manager and kube-scheduler, so that
//! Deployments become Pods that run (`testenv/node/`, docs/testenv.md). One node per machine at a
//! time; it goes away, with everything it made, when the [`Node`] is dropped or the test process
//! ends.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::TestEnv;

/// Environment variable naming a prebuilt `testenv-node` binary (skips `testenv/node/build.sh`).
pub const TESTENV_NODE_BIN: &str = "WCM_TESTENV_NODE_BIN";

/// What `testenv-node` printed once the Node was Ready.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeInfo {
    /// The Node's name.
    pub node: String,
    /// The node's working directory (logs of containerd, kubelet, ...).
    pub dir: String,
    /// containerd's socket (for `ctr --address`).
    pub containerd_socket: String,
    /// Where the kubelet writes the containers' logs (`NAMESPACE_POD_UID/CONTAINER/N.log`).
    pub pod_logs: String,
    /// The node's address on its bridge (the kubelet listens there).
    pub node_ip: String,
    /// The bridge the Pods are attached to.
    pub bridge: String,
    /// The Pods' subnet on the bridge.
    pub pod_subnet: String,
    /// The `kubernetes` Service's ClusterIP, held on the bridge and relayed to the apiserver.
    pub cluster_ip: String,
}

#[derive(Deserialize)]
struct Event {
    event: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// A running node. Dropping it stops the node and waits until everything it made is removed.
pub struct Node {
    info: NodeInfo,
    bin: PathBuf,
    child: Mutex<Option<(Child, ChildStdin)>>,
    stderr_lines: Arc<Mutex<Vec<String>>>,
}

/// Whether a node could be started here.
pub enum NodeStart {
    Ready(Box<Node>),
    /// This machine cannot run a node (not root, no cgroups, packages missing): the reason.
    Unavailable(String),
}

impl Node {
    /// Builds (cached) and starts a node against the local cluster of `env`, and waits until the
    /// Node is Ready. [`NodeStart::Unavailable`] when the machine cannot run one; an error when it
    /// could but did not start.
    pub async fn start(env: &TestEnv) -> Result<NodeStart> {
        if env.local().is_none() {
            return Ok(NodeStart::Unavailable(
                "the test node needs the local cluster (not WCM_USE_EXISTING_CLUSTER)".into(),
            ));
        }
        let kubeconfig = env
            .kubeconfig_path()
            .context("the local cluster has a kubeconfig file")?
            .to_path_buf();
        tokio::task::spawn_blocking(move || Self::start_blocking(&kubeconfig))
            .await
            .context("node start task")?
    }

    fn start_blocking(kubeconfig: &Path) -> Result<NodeStart> {
        let bin = node_binary()?;
        let mut child = Command::new(&bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--stdin-control")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let stdin = child.stdin.take().context("testenv-node stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("testenv-node stdout")?);
        let stderr = child.stderr.take().context("testenv-node stderr")?;
        let stderr_lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = stderr_lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
        let mut line = String::new();
        let n = stdout
            .read_line(&mut line)
            .context("read testenv-node's ready line")?;
        if n == 0 {
            let status = child.wait().ok();
            std::thread::sleep(std::time::Duration::from_millis(100));
            let said = stderr_lines
                .lock()
                .map(|v| v.join("\n"))
                .unwrap_or_default();
            bail!("testenv-node exited before the node was ready ({status:?}):\n{said}");
        }
        let event: Event = serde_json::from_str(line.trim())
            .with_context(|| format!("testenv-node printed an unexpected line: {line}"))?;
        match event.event.as_str() {
            "ready" => {}
            "unavailable" => {
                let _ = child.wait();
                return Ok(NodeStart::Unavailable(event.reason.unwrap_or_default()));
            }
            _ => {
                let _ = child.wait();
                bail!(
                    "testenv-node could not start the node: {}",
                    event.error.unwrap_or(event.event)
                );
            }
        }
        let info: NodeInfo = serde_json::from_str(line.trim())?;
        // Keep reading stdout, so that later lines (an error event) never block the node.
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                eprintln!("testenv-node: {line}");
            }
        });
        Ok(NodeStart::Ready(Box::new(Node {
            info,
            bin,
            child: Mutex::new(Some((child, stdin))),
            stderr_lines,
        })))
    }

    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.info.node
    }

    /// Writes `spec` as an OCI image archive at `out` (one uncompressed layer).
    pub fn build_image(&self, spec: &ImageSpec, out: &Path) -> Result<()> {
        build_image_with(&self.bin, spec, out)
    }

    /// Loads an OCI image archive into the node's containerd, where the kubelet finds it (Pods
    /// must use `imagePullPolicy: Never` or `IfNotPresent`: no registry can be reached).
    pub fn load_image(&self, archive: &Path) -> Result<()> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.info.containerd_socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .context("run ctr images import")?;
        anyhow::ensure!(
            out.status.success(),
            "ctr images import {} failed: {}{}",
            archive.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// The log of one of the node's processes (`kubelet`, `containerd`, `kube-controller-manager`,
    /// `kube-scheduler`).
    pub fn part_log(&self, part: &str) -> Result<String> {
        let path = Path::new(&self.info.dir).join(format!("{part}.log"));
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
    }

    /// What the containers of a Pod wrote so far (all containers, all restarts), read from the
    /// kubelet's log files (the apiserver has no client certificate for the kubelet's API here).
    pub fn pod_log(&self, namespace: &str, pod: &str) -> Result<String> {
        let prefix = format!("{namespace}_{pod}_");
        let mut text = String::new();
        for entry in std::fs::read_dir(&self.info.pod_logs)? {
            let entry = entry?;
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for container in std::fs::read_dir(entry.path())? {
                let mut files: Vec<PathBuf> = std::fs::read_dir(container?.path())?
                    .filter_map(|f| f.ok().map(|f| f.path()))
                    .collect();
                files.sort();
                for f in files {
                    text.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
                }
            }
        }
        Ok(text)
    }

    /// SIGKILLs every process of a container (`containerd://ID` or `ID` from the Pod's status), as
    /// the kernel's OOM killer or a crash would: found by the container's cgroup under the node's
    /// cgroup root. Returns how many processes were killed.
    pub fn kill_container(&self, container_id: &str) -> Result<usize> {
        let mut killed = 0;
        for pid in self.container_pids(container_id)? {
            let pid = pid.to_string();
            let status = Command::new("kill").args(["-KILL", &pid]).status()?;
            if status.success() {
                killed += 1;
            }
        }
        Ok(killed)
    }

    /// The PIDs (in this machine's PID namespace) of a container's processes, found by the
    /// container's cgroup under the node's cgroup root; `container_id` as in the Pod's status.
    pub fn container_pids(&self, container_id: &str) -> Result<Vec<u32>> {
        let id = bare_container_id(container_id)?;
        let root = Path::new("/sys/fs/cgroup/pids/wcm-node");
        let dir = find_dir(root, id)?.with_context(|| format!("no cgroup for container {id}"))?;
        let procs = std::fs::read_to_string(dir.join("cgroup.procs"))?;
        Ok(procs
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }
    /// The highest memory use of a container so far, in bytes, as its memory cgroup counts it
    /// (cgroup v1 `memory.max_usage_in_bytes`: what the limit is enforced on).
    pub fn container_memory_peak(&self, container_id: &str) -> Result<u64> {
        let id = bare_container_id(container_id)?;
        let root = Path::new("/sys/fs/cgroup/memory/wcm-node");
        let dir =
            find_dir(root, id)?.with_context(|| format!("no memory cgroup for container {id}"))?;
        let text = std::fs::read_to_string(dir.join("memory.max_usage_in_bytes"))?;
        text.trim()
            .parse()
            .with_context(|| format!("memory.max_usage_in_bytes: {text:?}"))
    }

    /// Stops the node and waits until it has removed everything it made.
    pub fn stop(&self) -> Result<()> {
        let taken = self
            .child
            .lock()
            .map_err(|_| anyhow::anyhow!("node lock poisoned"))?
            .take();
        if let Some((mut child, stdin)) = taken {
            drop(stdin);
            let status = child.wait().context("wait for testenv-node")?;
            if !status.success() {
                let said = self
                    .stderr_lines
                    .lock()
                    .map(|v| v.join("\n"))
                    .unwrap_or_default();
                bail!("testenv-node stopped with {status}:\n{said}");
            }
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("stopping the test node: {e:#}");
        }
    }
}

/// The directory named `name` under `root`, searched depth first.
/// `containerd://ID` or `ID` (as in a Pod's status) → `ID`, checked to be hex.
fn bare_container_id(container_id: &str) -> Result<&str> {
    let id = container_id
        .rsplit_once("://")
        .map_or(container_id, |(_, id)| id);
    anyhow::ensure!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit()),
        "not a container id: {container_id:?}"
    );
    Ok(id)
}

fn find_dir(root: &Path, name: &str) -> Result<Option<PathBuf>> {
    // The kubelet removes Pods' cgroups at any time: a directory gone during the walk is skipped.
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            return Ok(Some(entry.path()));
        }
        if let Some(found) = find_dir(&entry.path(), name)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// A one-layer image for [`Node::build_image`] (`testenv/node/image.go`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ImageSpec {
    pub name: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: String,
    pub env: Vec<String>,
    pub working_dir: String,
    pub files: Vec<ImageFile>,
}

/// One entry of an [`ImageSpec`]'s layer: a file copied from `source`, a file with `content`, or
/// a directory (`dir`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ImageFile {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub dir: bool,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Writes `spec` as an OCI image archive with the `testenv-node` binary `bin`.
pub fn build_image_with(bin: &Path, spec: &ImageSpec, out: &Path) -> Result<()> {
    let spec_path = out.with_extension("spec.json");
    std::fs::write(&spec_path, serde_json::to_vec_pretty(spec)?)
        .with_context(|| format!("write {}", spec_path.display()))?;
    let result = Command::new(bin)
        .arg("image")
        .arg(&spec_path)
        .arg(out)
        .output()
        .context("run testenv-node image")?;
    anyhow::ensure!(
        result.status.success(),
        "testenv-node image failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(())
}

/// The `testenv-node` binary: `WCM_TESTENV_NODE_BIN`, or the cached build of
/// `testenv/node/build.sh`.
pub fn node_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(TESTENV_NODE_BIN) {
        let bin = PathBuf::from(bin);
        anyhow::ensure!(
            bin.is_file(),
            "{TESTENV_NODE_BIN}={} is not a file",
            bin.display()
        );
        return Ok(bin);
    }
    crate::run_build_script("testenv/node/build.sh")
}
