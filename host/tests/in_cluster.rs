//! The host as the Deployment (`manifests/host.yaml`) runs it, against the real API server.
//!
//! As the cluster admin, the test applies what `kubectl apply -k manifests/` would, and the RBAC
//! `rbac --host-service-account wcm-system/wasm-controller-manager` generates for the plugins it
//! runs. It then builds a container from the Deployment's own spec: a private mount namespace and a
//! root of its own (the image: `/usr/local/bin/wasm-controller-manager`, the plugins in `/plugins`),
//! read-only, with the ServiceAccount token from the TokenRequest API at the standard path, the
//! `emptyDir` volumes, the container's args and env, `runAsUser`/`runAsGroup`, no capabilities and
//! no privilege escalation; no kubeconfig, so the host takes the in-cluster configuration; and,
//! where this machine has a writable cgroup-v1 memory controller, a memory cgroup with the
//! container's `resources.limits.memory`, in which it runs the shipped plugins plus two that parse
//! typed Pods (the heaviest compiles measured) with no OOM kill.
//!
//! What the API server saw (its audit log) proves the rest: pod-counter labels a control-plane Node
//! and records events, the network plugin reads its Secret and creates its network in the real
//! Neutron, each as its own identity requested by the host's ServiceAccount; and the one call
//! outside the grant (a third plugin's ConfigMap patch, declared but not granted) is refused 403
//! there. Needs root (mount namespace, chroot, setpriv); skipped otherwise.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::*;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use testenv::{AuditEvent, OpenStack};
use wasm_controller_manager::loading::rbac;

/// The image's ENTRYPOINT (Dockerfile); the Deployment gives only args.
const ENTRYPOINT: &str = "/usr/local/bin/wasm-controller-manager";
/// The image's PATH and the runtime user's home (distroless `nonroot`), as the runtime sets them.
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const IMAGE_HOME: &str = "/home/nonroot";
/// The Pod's name, for `metadata.name` field references.
const POD_NAME: &str = "wasm-controller-manager-in-cluster-test";
/// Where the kubelet mounts the ServiceAccount token (kube-rs's in-cluster config reads it here).
const SA_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The third plugin: the well-behaved test plugin, granted all it declares except `patch`.
const UNGRANTED: &str = "no-patch";
/// Two plugins that parse every Pod into the k8s-openapi `Pod` (`typed-pod-noop`).
const TYPED: [&str; 2] = ["typed-a", "typed-b"];

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Every object of the kustomization's `resources`, as `kubectl apply -k manifests/` sends them.
fn kustomization_objects() -> Result<Vec<Value>> {
    use serde::Deserialize;
    let dir = testenv::manifests_dir();
    let text = std::fs::read_to_string(dir.join("kustomization.yaml"))?;
    let k: Value = serde_yaml_ng::from_str(&text)?;
    let mut out = Vec::new();
    for r in k["resources"]
        .as_array()
        .context("kustomization.yaml has no resources")?
    {
        let path = dir.join(r.as_str().context("a resource that is not a path")?);
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc)?;
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// How the Deployment runs the host, read from its spec. What the test cannot emulate is refused
/// here, so a change to the Deployment fails loudly instead of being silently ignored.
#[derive(Debug)]
struct PodSpec {
    namespace: String,
    service_account: String,
    uid: u32,
    gid: u32,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Mount paths of `emptyDir` volumes.
    empty_dirs: Vec<String>,
    /// `httpGet` probes: path and container port.
    probes: Vec<(String, u16)>,
    grace: Duration,
    /// `resources.limits.memory`, bytes: the test puts the container in a memory cgroup of that
    /// limit, as the kubelet does.
    memory_limit: Option<u64>,
}

/// A Kubernetes memory quantity in bytes: plain, or with a binary (Ki, Mi, Gi) or decimal (k, M,
/// G) suffix.
fn memory_bytes(q: &str) -> Result<u64> {
    let (n, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ]
    .iter()
    .find_map(|(suffix, m)| q.strip_suffix(suffix).map(|n| (n, *m)))
    .unwrap_or((q, 1));
    let n: u64 = n
        .parse()
        .with_context(|| format!("memory quantity {q:?}"))?;
    n.checked_mul(mult)
        .with_context(|| format!("memory quantity {q:?}"))
}

fn str_at<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str()
        .with_context(|| format!("the Deployment has no {what}"))
}

fn deployment_spec(objects: &[Value]) -> Result<PodSpec> {
    let d = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "wasm-controller-manager")
        .context("no Deployment wasm-controller-manager in manifests/")?;
    let namespace = str_at(&d["metadata"]["namespace"], "namespace")?.to_string();
    let pod = &d["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().context("no containers")?;
    ensure!(containers.len() == 1, "the test runs one container");
    let c = &containers[0];
    ensure!(
        c["command"].is_null(),
        "the container sets a command; the test runs the image's ENTRYPOINT {ENTRYPOINT}"
    );
    ensure!(
        pod["automountServiceAccountToken"] != false,
        "the Pod gets no token"
    );
    let psc = &pod["securityContext"];
    let csc = &c["securityContext"];
    ensure!(psc["runAsNonRoot"] == true, "runAsNonRoot: {psc}");
    // What the mount namespace and setpriv below emulate.
    ensure!(csc["readOnlyRootFilesystem"] == true, "{csc}");
    ensure!(csc["allowPrivilegeEscalation"] == false, "{csc}");
    ensure!(csc["capabilities"]["drop"] == json!(["ALL"]), "{csc}");
    ensure!(csc["capabilities"]["add"].is_null(), "{csc}");
    let id = |v: &Value, what: &str| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .with_context(|| format!("no {what} in the Pod's securityContext"))
    };
    let args = c["args"]
        .as_array()
        .context("no container args")?
        .iter()
        .map(|a| Ok(str_at(a, "string arg")?.to_string()))
        .collect::<Result<Vec<_>>>()?;
    let mut env = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = str_at(&e["name"], "env name")?.to_string();
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.name")) => POD_NAME.to_string(),
            (None, Some("metadata.namespace")) => namespace.clone(),
            _ => {
                bail!("env {name}: the test resolves only values and the Pod's name and namespace")
            }
        };
        env.push((name, value));
    }
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let mut empty_dirs = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = str_at(&m["name"], "volume mount name")?;
        let volume = volumes
            .iter()
            .find(|v| v["name"] == name)
            .with_context(|| format!("no volume {name}"))?;
        ensure!(
            volume["emptyDir"].is_object(),
            "volume {name}: the test emulates emptyDir volumes only"
        );
        let path = str_at(&m["mountPath"], "mountPath")?;
        ensure!(
            path.starts_with('/') && !path.contains(char::is_whitespace),
            "mountPath {path:?}"
        );
        empty_dirs.push(path.to_string());
    }
    let ports = c["ports"].as_array().cloned().unwrap_or_default();
    let mut probes = Vec::new();
    for kind in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let get = &c[kind]["httpGet"];
        if c[kind].is_null() {
            continue;
        }
        let path = str_at(&get["path"], "probe path")?.to_string();
        let port = match &get["port"] {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => ports
                .iter()
                .find(|p| p["name"] == s.as_str())
                .and_then(|p| p["containerPort"].as_u64()),
            _ => None,
        }
        .and_then(|p| u16::try_from(p).ok())
        .with_context(|| format!("{kind}: not an httpGet probe on a known port"))?;
        probes.push((path, port));
    }
    let memory_limit = match c["resources"]["limits"]["memory"].as_str() {
        Some(q) => Some(memory_bytes(q)?),
        None => None,
    };
    Ok(PodSpec {
        memory_limit,
        service_account: str_at(&pod["serviceAccountName"], "serviceAccountName")?.to_string(),
        uid: id(&psc["runAsUser"], "runAsUser")?,
        gid: id(&psc["runAsGroup"], "runAsGroup")?,
        grace: Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30)),
        namespace,
        args,
        env,
        empty_dirs,
        probes,
    })
}

/// `--…-addr=HOST:PORT` args get a free loopback port each (the test shares the machine's network
/// namespace); the map says where each container port went.
fn rebind(args: &[String]) -> Result<(Vec<String>, BTreeMap<u16, SocketAddr>)> {
    let mut out = Vec::new();
    let mut moved = BTreeMap::new();
    for a in args {
        let listener = a
            .split_once('=')
            .filter(|(flag, _)| flag.starts_with("--") && flag.ends_with("-addr"))
            .and_then(|(flag, value)| Some((flag, value.parse::<SocketAddr>().ok()?)));
        match listener {
            Some((flag, old)) => {
                let new: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
                moved.insert(old.port(), new);
                out.push(format!("{flag}={new}"));
            }
            None => out.push(a.clone()),
        }
    }
    Ok((out, moved))
}

fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
}

/// Takes `patch` on ConfigMaps out of `plugin`'s generated roles; how many verbs it removed.
fn without_configmap_patch(objects: &mut [Value], plugin: &str) -> usize {
    let mut removed = 0;
    for o in objects.iter_mut() {
        let role = matches!(o["kind"].as_str(), Some("ClusterRole" | "Role"));
        if !role || o["metadata"]["labels"]["wcm.dev/plugin"] != plugin {
            continue;
        }
        for rule in o["rules"].as_array_mut().into_iter().flatten() {
            let configmaps = rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == "configmaps"));
            if let (true, Some(verbs)) = (configmaps, rule["verbs"].as_array_mut()) {
                let before = verbs.len();
                verbs.retain(|v| v != "patch");
                removed += before - verbs.len();
            }
        }
    }
    removed
}

/// A token for a ServiceAccount from the TokenRequest API, as the kubelet gets the one it
/// projects into the Pod (its default lifetime, 3607 s).
async fn issue_token(client: &kube::Client, namespace: &str, name: &str) -> Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3607}}))?;
    let issued: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for {namespace}/{name}"))?;
    issued
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .context("no token issued")
}

/// Builds the container and starts the host in it. Arguments: the pod directory (`image/`, the
/// root's files; `usr/`, laid over this machine's /usr; `sa/`, the token volume's files; `root/`,
/// the mount point), uid, gid, the emptyDir paths (space-separated), the memory cgroup's directory
/// (or ""), then `env -i`'s arguments.
const CONTAINER: &str = r#"
set -eu
pod=$1 uid=$2 gid=$3 empty_dirs=$4 cgroup=$5
shift 5
# The container's memory cgroup (its limit), as the kubelet places a container in one.
if [ -n "$cgroup" ]; then echo $$ > "$cgroup/cgroup.procs"; fi
root=$pod/root
# The image: a root filesystem of its own, and /usr from this machine with the binary laid over it.
mount -t tmpfs -o mode=0755 tmpfs "$root"
cp -a "$pod/image/." "$root/"
mount -t overlay overlay -o "lowerdir=$pod/usr:/usr" "$root/usr"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=0755 tmpfs "$root/dev"
for d in null zero full random urandom; do
  touch "$root/dev/$d"
  mount --bind "/dev/$d" "$root/dev/$d"
done
# The projected token volume; the kubelet gives the token to runAsUser, mode 0600, when no
# fsGroup is set.
sa=$root/var/run/secrets/kubernetes.io/serviceaccount
mount -t tmpfs -o mode=0755 tmpfs "$sa"
cp "$pod/sa/token" "$pod/sa/ca.crt" "$pod/sa/namespace" "$sa/"
chown "$uid:$gid" "$sa/token"
chmod 0600 "$sa/token"
chmod 0644 "$sa/ca.crt" "$sa/namespace"
mount -o remount,bind,ro "$sa"
# emptyDir volumes: root-owned, mode 0777, as the kubelet makes them.
for d in $empty_dirs; do
  mount -t tmpfs -o mode=0777 tmpfs "$root$d"
done
# readOnlyRootFilesystem. `bind`: only this namespace's mount flag changes.
mount -o remount,bind,ro "$root"
# runAsUser/runAsGroup, allowPrivilegeEscalation: false, capabilities drop ALL, and only the
# environment the runtime and the Pod give.
exec chroot "$root" /usr/bin/setpriv --reuid="$uid" --regid="$gid" --clear-groups \
  --no-new-privs --inh-caps=-all --bounding-set=-all /usr/bin/env -i "$@"
"#;

/// The host process in its container. Dropping it kills its process group.
struct PodProcess {
    child: Child,
    log: PathBuf,
}

impl PodProcess {
    fn start(
        dir: &Path,
        spec: &PodSpec,
        cgroup: Option<&MemoryCgroup>,
        env: &[String],
        args: &[String],
    ) -> Result<PodProcess> {
        let log = dir.join("host.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(CONTAINER)
            .arg("sh")
            .arg(dir)
            .arg(spec.uid.to_string())
            .arg(spec.gid.to_string())
            .arg(spec.empty_dirs.join(" "))
            .arg(cgroup.map(|c| c.dir.clone()).unwrap_or_default())
            .args(env)
            .arg(ENTRYPOINT)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            // Its own group, so that nothing it starts outlives the test.
            .process_group(0)
            .spawn()
            .context("start unshare")?;
        Ok(PodProcess { child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn exited(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// `sig` to the process (`group`: and everything in its group).
    fn signal(&self, sig: i32, group: bool) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let target = if group { -pid } else { pid };
            // SAFETY: kill(2) on a child (or its group) this test started.
            unsafe { libc::kill(target, sig) };
        }
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(libc::SIGKILL, true);
        }
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- host log ---\n{}", self.log_text());
        }
    }
}

/// A memory cgroup (v1) made for the container under the test's own, with the Deployment's
/// limit; removed when the test ends.
struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    /// `None` where this machine has no writable cgroup-v1 memory controller (said on stderr).
    fn new(limit: u64) -> Option<MemoryCgroup> {
        let ours = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = ours
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()));
        let Some(path) = path else {
            eprintln!("note: no cgroup-v1 memory controller: the memory limit is not emulated");
            return None;
        };
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory{}/wcm-in-cluster-{}",
            path.trim_end_matches('/'),
            std::process::id()
        ));
        let made = std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()));
        if let Err(e) = made {
            eprintln!(
                "note: cannot make the memory cgroup {}: {e}; the memory limit is not emulated",
                dir.display()
            );
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(MemoryCgroup { dir })
    }

    fn read(&self, file: &str) -> Result<String> {
        std::fs::read_to_string(self.dir.join(file)).with_context(|| format!("read {file}"))
    }

    /// OOM kills in the cgroup (`memory.oom_control`).
    fn oom_kills(&self) -> Result<u64> {
        self.read("memory.oom_control")?
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .context("no oom_kill in memory.oom_control")?
            .trim()
            .parse()
            .context("oom_kill")
    }

    fn max_usage(&self) -> Result<u64> {
        Ok(self.read("memory.max_usage_in_bytes")?.trim().parse()?)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once the container's processes are gone (they are killed before this drops).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Removes the pod directory (its hard link to the binary too) however the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `/proc/PID/status` fields, e.g. `Uid` → `["65532", "65532", "65532", "65532"]`.
fn proc_status(pid: u32, field: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// One line of `/proc/PID/mountinfo` (mount points relative to that process's root).
#[derive(Debug, Clone)]
struct MountEntry {
    point: String,
    options: String,
    fstype: String,
    super_options: String,
}

impl MountEntry {
    /// Read-only by the mount's flag or its filesystem's (an overlay without an upper layer).
    fn read_only(&self) -> bool {
        let ro = |opts: &str| opts.split(',').any(|o| o == "ro");
        ro(&self.options) || ro(&self.super_options)
    }
}

fn mounts(pid: &str) -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let sep = f
                .iter()
                .position(|x| *x == "-")
                .with_context(|| format!("a mountinfo line without its separator: {line}"))?;
            match (f.get(4), f.get(5), f.get(sep + 1), f.get(sep + 3)) {
                (Some(point), Some(options), Some(fstype), Some(super_options)) => Ok(MountEntry {
                    point: point.to_string(),
                    options: options.to_string(),
                    fstype: fstype.to_string(),
                    super_options: super_options.to_string(),
                }),
                _ => bail!("a short mountinfo line: {line}"),
            }
        })
        .collect()
}

/// The mount `path` is on: the longest mount point that holds it, the last (topmost) of equals.
fn mount_of<'a>(mounts: &'a [MountEntry], path: &str) -> Result<&'a MountEntry> {
    let holds = |m: &&MountEntry| {
        m.point == "/"
            || path == m.point
            || path
                .strip_prefix(m.point.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    };
    let longest = mounts
        .iter()
        .filter(holds)
        .map(|m| m.point.len())
        .max()
        .with_context(|| format!("no mount holds {path}"))?;
    mounts
        .iter()
        .filter(holds)
        .rfind(|m| m.point.len() == longest)
        .with_context(|| format!("no mount holds {path}"))
}

fn resource(e: &AuditEvent) -> &str {
    e.object_ref.as_ref().map_or("", |o| o.resource.as_str())
}

fn about(e: &AuditEvent, namespace: &str, name: &str) -> bool {
    e.object_ref
        .as_ref()
        .is_some_and(|o| o.namespace == namespace && o.name == name)
}

fn summary(e: &AuditEvent) -> String {
    format!(
        "{} {} user={} as={} code={:?} decision={:?}",
        e.verb,
        e.request_uri,
        e.user.username,
        e.effective_user(),
        e.code(),
        e.annotations.get("authorization.k8s.io/decision")
    )
}

fn networks_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn ready(n: &DynamicObject) -> bool {
    n.data["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The pod directory: the image's files (root layout, the plugins), the binary laid over /usr, the
/// token volume's files. Returns the plugin files, for their RBAC.
async fn build_pod(
    dir: &Path,
    spec: &PodSpec,
    os: &OpenStack,
    client: &kube::Client,
    secret_ns: &str,
) -> Result<Vec<PathBuf>> {
    let image = dir.join("image");
    let plugins_dir = arg_value(&spec.args, "--plugins-dir").context("no --plugins-dir")?;
    let plugins = image.join(plugins_dir.trim_start_matches('/'));
    let mut dirs = vec![
        image.join("usr"),
        image.join("proc"),
        image.join("dev"),
        image.join("etc"),
        image.join("tmp"),
        image.join(IMAGE_HOME.trim_start_matches('/')),
        image.join(SA_MOUNT.trim_start_matches('/')),
        plugins.clone(),
        dir.join("root"),
        dir.join("sa"),
        dir.join("usr/local/bin"),
    ];
    dirs.extend(
        spec.empty_dirs
            .iter()
            .map(|d| image.join(d.trim_start_matches('/'))),
    );
    for d in &dirs {
        std::fs::create_dir_all(d)?;
    }
    // A merged-/usr layout (Debian 12, as the distroless base); /tmp as in any image.
    for link in ["bin", "lib", "lib64", "sbin"] {
        std::os::unix::fs::symlink(format!("usr/{link}"), image.join(link))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(image.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::fs::write(
        image.join("etc/passwd"),
        format!(
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{}:{}:nonroot:{IMAGE_HOME}:/sbin/nologin\n",
            spec.uid, spec.gid
        ),
    )?;
    std::fs::write(
        image.join("etc/group"),
        format!("root:x:0:\nnonroot:x:{}:\n", spec.gid),
    )?;
    std::os::unix::fs::chown(
        image.join(IMAGE_HOME.trim_start_matches('/')),
        Some(spec.uid),
        Some(spec.gid),
    )?;
    // The binary at the image's ENTRYPOINT: a hard link (it is 500 MB), a copy across filesystems.
    let bin = Path::new(env!("CARGO_BIN_EXE_wasm-controller-manager"));
    let entry = dir.join("usr/local/bin/wasm-controller-manager");
    if std::fs::hard_link(bin, &entry).is_err() {
        std::fs::copy(bin, &entry).with_context(|| format!("copy {}", bin.display()))?;
    }
    // The plugins, as the image ships pod-counter, plus the network plugin (its network.toml
    // and Secret) and the third plugin.
    os.configure_network_plugin(client, secret_ns, &plugins, "")
        .await?;
    std::fs::write(
        plugins.join(format!("{UNGRANTED}.toml")),
        format!("name = \"{UNGRANTED}\"\n"),
    )?;
    let mut files = vec![
        install(&plugins, "pod_counter", "pod_counter.wasm")?,
        install(&plugins, "network", "network.wasm")?,
        install(&plugins, "well-behaved", &format!("{UNGRANTED}.wasm"))?,
    ];
    // Two plugins that parse typed objects (the heaviest compiles measured). The second is the
    // first with a custom section appended: other bytes, so it is compiled on its own.
    let typed = std::fs::read(plugin("typed-pod-noop")?)?;
    for (i, name) in TYPED.iter().enumerate() {
        let mut bytes = typed.clone();
        if i > 0 {
            let section_name = format!("wcm-test-copy-{i}");
            bytes.push(0);
            bytes.push(u8::try_from(section_name.len() + 1)?);
            bytes.push(u8::try_from(section_name.len())?);
            bytes.extend_from_slice(section_name.as_bytes());
        }
        let path = plugins.join(format!("{name}.wasm"));
        std::fs::write(&path, bytes)?;
        std::fs::write(
            plugins.join(format!("{name}.toml")),
            format!("name = \"{name}\"\n"),
        )?;
        files.push(path);
    }
    Ok(files)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_runs_as_the_deployment_runs_it() -> Result<()> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root for a mount namespace, chroot and setpriv");
        return Ok(());
    }
    let env = testenv::TestEnv::shared().await?;
    let Some(local) = env.local() else {
        eprintln!("skipped: needs the local cluster (its CA, port and audit log)");
        return Ok(());
    };
    let started = Instant::now();
    let apiserver_port: u16 = local
        .server
        .rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {}", local.server))?;
    let client = env.client().await?;
    let os = OpenStack::start().await?;

    // 1. As the cluster admin: `kubectl apply -k manifests/` (Namespace, the host's ServiceAccount
    // and Deployment, the CRD, pod-counter's and the host's RBAC).
    let manifests = kustomization_objects()?;
    let spec = deployment_spec(&manifests)?;
    rbac::apply(&client, &manifests).await?;

    // 2. The pod: the image, its plugins and the Secret of the network plugin's credentials.
    let ns = env.namespace("in-cluster").await?;
    let dir = temp_dir("in-cluster")?;
    let _cleanup = RemoveOnDrop(dir.clone());
    let files = build_pod(&dir, &spec, &os, &client, &ns.name).await?;

    // 3. What `wasm-controller-manager rbac --host-service-account wcm-system/wasm-controller-manager
    // pod_counter.wasm network.wasm no-patch.wasm` prints, without no-patch's ConfigMap patch.
    let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
        client.clone(),
        Duration::from_secs(10),
    );
    let mut grant = rbac::generate(
        &rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins: files,
            identity: Default::default(),
            host_service_account: Some((spec.namespace.clone(), spec.service_account.clone())),
            // The test's plugins act in the test namespaces: every namespace but the protected.
            allow: wasm_controller_manager::cluster::rbac::Allowances {
                all_namespaces: wasm_controller_manager::cluster::rbac::Allow::every(),
                risky: wasm_controller_manager::cluster::rbac::Allow::every(),
            },
        },
        Some(&discovery),
    )
    .await?
    .objects;
    let removed = without_configmap_patch(&mut grant, UNGRANTED);
    ensure!(
        removed == 1,
        "expected one ConfigMap patch grant for {UNGRANTED}, removed {removed}: {grant:?}"
    );
    rbac::apply(&client, &grant).await?;

    // 4. The token volume's files: a token the API server issues, its CA, the namespace.
    let token = issue_token(&client, &spec.namespace, &spec.service_account).await?;
    std::fs::write(dir.join("sa/token"), &token)?;
    std::fs::copy(
        Path::new(&local.dir).join("pki/ca.crt"),
        dir.join("sa/ca.crt"),
    )
    .context("the API server's CA")?;
    std::fs::write(dir.join("sa/namespace"), &spec.namespace)?;

    // 5. The container: the runtime's and the Pod's environment, the Deployment's args with the
    // listeners moved to free ports.
    let (args, moved) = rebind(&spec.args)?;
    // Without --metrics-addr the host would bind the machine's 0.0.0.0:8080.
    let metrics_port = arg_value(&spec.args, "--metrics-addr")
        .context("the Deployment sets no --metrics-addr")?
        .parse::<SocketAddr>()
        .context("--metrics-addr")?
        .port();
    let metrics = *moved
        .get(&metrics_port)
        .context("--metrics-addr was not moved")?;
    let mut env_vars = vec![
        format!("PATH={IMAGE_PATH}"),
        format!("HOSTNAME={POD_NAME}"),
        format!("HOME={IMAGE_HOME}"),
        "KUBERNETES_SERVICE_HOST=127.0.0.1".to_string(),
        format!("KUBERNETES_SERVICE_PORT={apiserver_port}"),
    ];
    for (k, v) in &spec.env {
        env_vars.push(format!("{k}={v}"));
    }
    let mark = env.audit_mark()?;
    let cgroup = spec.memory_limit.and_then(MemoryCgroup::new);
    let mut host = PodProcess::start(&dir, &spec, cgroup.as_ref(), &env_vars, &args)?;
    let mut result = run_checks(
        env, &client, &os, &ns.name, &spec, &moved, metrics, &mut host, &token, mark,
    )
    .await;
    // The Deployment's memory limit held every compile and the whole run (run_checks saw the
    // host serve to the end, then stopped it): no OOM kill in its cgroup.
    if result.is_ok()
        && let (Some(cg), Some(limit)) = (&cgroup, spec.memory_limit)
    {
        result = (|| {
            let (kills, peak) = (cg.oom_kills()?, cg.max_usage()?);
            println!(
                "memory cgroup: limit {} MiB, peak usage {} MiB (the host and its compile children), OOM kills {kills}",
                limit >> 20,
                peak >> 20,
            );
            ensure!(kills == 0, "{kills} OOM kills under the Deployment's limit");
            Ok(())
        })();
    }
    if let Err(e) = &result {
        eprintln!("--- host log ---\n{}\n--- error: {e:#}", host.log_text());
    }
    result?;
    println!("in-cluster test took {:?}", started.elapsed());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_checks(
    env: &testenv::TestEnv,
    client: &kube::Client,
    os: &OpenStack,
    ns: &str,
    spec: &PodSpec,
    moved: &BTreeMap<u16, SocketAddr>,
    metrics: SocketAddr,
    host: &mut PodProcess,
    token: &str,
    mark: testenv::AuditMark,
) -> Result<()> {
    let host_user = format!(
        "system:serviceaccount:{}:{}",
        spec.namespace, spec.service_account
    );
    let by_host_as = |e: &AuditEvent, plugin: &str| {
        e.user.username == host_user && e.effective_user() == plugin_user(plugin)
    };
    let readyz = {
        let host = &mut *host;
        eventually(
            "the host ready with its five plugins running",
            Duration::from_secs(90),
            || {
                let exited = host.exited();
                async move {
                    if let Some(status) = exited? {
                        bail!("the host exited: {status}");
                    }
                    let Ok((code, body)) = http_get_at(metrics, "/readyz").await else {
                        return Ok(None);
                    };
                    let all = ["pod_counter", "network", UNGRANTED]
                        .iter()
                        .chain(TYPED.iter())
                        .all(|f| body.contains(&format!("{f}.wasm: running")));
                    Ok((code == 200 && all).then_some(body))
                }
            },
        )
        .await?
    };
    println!("/readyz: {}", readyz.trim().replace('\n', "; "));
    // The Deployment's probes, on the ports its listeners moved to.
    for (path, port) in &spec.probes {
        let addr = moved
            .get(port)
            .with_context(|| format!("no listener for the probe port {port}"))?;
        let (code, _) = http_get_at(*addr, path).await?;
        assert_eq!(code, 200, "probe {path} on {addr}");
    }

    // How the process really runs: credentials, capabilities, mounts, environment.
    let pid = host.pid();
    let uid = proc_status(pid, "Uid")?;
    let gid = proc_status(pid, "Gid")?;
    assert_eq!(
        uid,
        vec![spec.uid.to_string(); 4],
        "real/effective/saved/fs uid"
    );
    assert_eq!(
        gid,
        vec![spec.gid.to_string(); 4],
        "real/effective/saved/fs gid"
    );
    assert!(
        proc_status(pid, "Groups")?.is_empty(),
        "supplementary groups"
    );
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let v = proc_status(pid, caps)?;
        assert_eq!(v, vec!["0000000000000000".to_string()], "{caps}");
    }
    assert_eq!(proc_status(pid, "NoNewPrivs")?, vec!["1".to_string()]);
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    assert!(
        exe.ends_with(ENTRYPOINT.trim_start_matches('/')),
        "the process runs {}, not the entrypoint",
        exe.display()
    );
    let environ: Vec<String> = std::fs::read(format!("/proc/{pid}/environ"))?
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    assert!(
        !environ.iter().any(|v| v.starts_with("KUBECONFIG=")),
        "{environ:?}"
    );
    let table = mounts(&pid.to_string())?;
    let root = mount_of(&table, "/")?;
    assert!(root.read_only(), "root: {root:?}");
    let secrets = mount_of(&table, SA_MOUNT)?;
    assert!(
        secrets.point == SA_MOUNT && secrets.read_only() && secrets.fstype == "tmpfs",
        "token volume: {secrets:?}"
    );
    // Writable: the emptyDirs, and /proc and /dev as in any container; nothing else.
    let writable: Vec<&MountEntry> = table.iter().filter(|m| !m.read_only()).collect();
    for m in &writable {
        let allowed = spec.empty_dirs.contains(&m.point)
            || m.point == "/proc"
            || m.point == "/dev"
            || m.point.starts_with("/dev/");
        assert!(allowed, "writable mount {m:?}");
    }
    for d in &spec.empty_dirs {
        let m = mount_of(&table, d)?;
        assert!(m.point == *d && !m.read_only(), "emptyDir {d}: {m:?}");
    }
    // The token the process reads at the standard path is the one the API server issued.
    let mounted = std::fs::read_to_string(format!("/proc/{pid}/root{SA_MOUNT}/token"))
        .context("read the token the process sees")?;
    assert_eq!(mounted, token, "the token at {SA_MOUNT}");
    // The machine's own root stayed writable: the read-only flags are the namespace's alone.
    let ours = mounts("self")?;
    let our_root = mount_of(&ours, "/")?;
    assert!(!our_root.read_only(), "the test's own root: {our_root:?}");
    println!(
        "process {pid}: Uid {} Gid {} caps 0 NoNewPrivs 1; / {} {}; {} {} {}; writable: {:?}",
        uid.join(" "),
        gid.join(" "),
        root.fstype,
        root.options,
        secrets.point,
        secrets.fstype,
        secrets.options,
        writable
            .iter()
            .map(|m| m.point.as_str())
            .collect::<Vec<_>>()
    );

    // It leads on the Deployment's Lease, in its own namespace.
    eventually("the host leads", Duration::from_secs(30), || async {
        let (_, body) = http_get_at(metrics, "/metrics").await?;
        let leading = testenv::sum_metric(
            &body,
            "leader_election_master_status",
            &[("name", "wasm-controller-manager")],
        );
        Ok((leading == 1.0).then_some(()))
    })
    .await?;
    let lease = Api::<Lease>::namespaced(client.clone(), &spec.namespace)
        .get("wasm-controller-manager")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.starts_with(POD_NAME), "Lease holder {holder}");

    // 6. Work for the three plugins: a control-plane Node and pods (pod-counter), a Network (the
    // network plugin), a ConfigMap (no-patch).
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = format!("in-cluster-cp-{}", std::process::id());
    let node: Node = serde_json::from_value(json!({"metadata": {
        "name": node_name,
        "labels": {"node-role.kubernetes.io/control-plane": ""},
    }}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in ["p0", "p1"] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
        }))?;
        pods.create(&PostParams::default(), &p).await?;
    }
    let networks = networks_api(client, ns);
    let created = networks
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
                "metadata": {"name": "in-cluster"},
                "spec": {"cidr": "10.77.0.0/24", "gateway": "10.77.0.1"},
            }))?,
        )
        .await?;
    let net_uid = created.metadata.uid.clone().context("the Network's uid")?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "refused"}, "data": {"value": "v"}}))?;
    cms.create(&PostParams::default(), &cm).await?;

    // pod-counter: the label is the cluster's pod count.
    let total = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len();
    assert!(total >= 2, "{total} pods");
    let label = eventually(
        "the control-plane Node labelled with the pod count",
        Duration::from_secs(60),
        || async {
            let n = nodes.get(&node_name).await?;
            let v = n
                .metadata
                .labels
                .and_then(|l| l.get("hopegi/pod-count").cloned());
            Ok(v.filter(|v| *v == total.to_string()))
        },
    )
    .await?;

    // network: Ready, and its network is in Neutron.
    let net = eventually("the Network Ready", Duration::from_secs(60), || async {
        let n = networks.get("in-cluster").await?;
        Ok(ready(&n).then_some(n))
    })
    .await?;
    let os_token = os.user_token()?;
    let tagged = os.neutron_get(&os_token, &format!("networks?tags=k8s-uid-{net_uid}"))?;
    let tagged = tagged["networks"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        tagged.len(),
        1,
        "Neutron networks tagged for it: {tagged:?}"
    );
    assert_eq!(net.data["status"]["networkId"], tagged[0]["id"]);

    // 7. The API server's view.
    let events = eventually(
        "the audit log: pod-counter's events and no-patch's refused patch",
        Duration::from_secs(60),
        || async {
            let events = env.audit_events_since(mark)?;
            let event_written = events.iter().any(|e| {
                e.verb == "create"
                    && resource(e) == "events"
                    && e.object_ref.as_ref().is_some_and(|o| o.namespace == ns)
                    && by_host_as(e, "pod-counter")
                    && e.code() == Some(201)
            });
            let refused = events
                .iter()
                .any(|e| e.verb == "patch" && about(e, ns, "refused") && e.code() == Some(403));
            Ok((event_written && refused).then_some(events))
        },
    )
    .await?;
    let by_host: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.user.username == host_user)
        .collect();
    // Its own requests (not impersonated): the Lease, the shared informers.
    let own: Vec<&AuditEvent> = by_host
        .iter()
        .copied()
        .filter(|e| e.impersonated_user.is_none())
        .collect();
    assert!(
        own.iter()
            .any(|e| resource(e) == "leases" && matches!(e.code(), Some(200 | 201))),
        "no Lease write by {host_user}"
    );
    assert!(
        own.iter()
            .any(|e| e.verb == "watch" && resource(e) == "networks"),
        "no watch of networks by {host_user}"
    );
    let find = |what: &str, f: &dyn Fn(&AuditEvent) -> bool| -> Result<&AuditEvent> {
        events
            .iter()
            .find(|e| f(e))
            .with_context(|| format!("no {what} in the audit log"))
    };
    let node_patch = find("patch of the Node", &|e| {
        e.verb == "patch" && resource(e) == "nodes" && about(e, "", &node_name)
    })?;
    assert!(
        by_host_as(node_patch, "pod-counter") && node_patch.code() == Some(200),
        "{}",
        summary(node_patch)
    );
    let status_write = find("status write of the Network", &|e| {
        e.verb == "patch"
            && about(e, ns, "in-cluster")
            && e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "networks" && o.subresource == "status")
    })?;
    assert!(
        by_host_as(status_write, "network") && status_write.code() == Some(200),
        "{}",
        summary(status_write)
    );
    let secret_read = find("read of the OpenStack Secret", &|e| {
        e.verb == "get" && resource(e) == "secrets" && about(e, ns, "openstack")
    })?;
    assert!(
        by_host_as(secret_read, "network") && secret_read.code() == Some(200),
        "{}",
        summary(secret_read)
    );
    let refused = find("refused patch", &|e| {
        e.verb == "patch" && about(e, ns, "refused") && e.code() == Some(403)
    })?;
    assert!(by_host_as(refused, UNGRANTED), "{}", summary(refused));
    assert_eq!(
        refused
            .annotations
            .get("authorization.k8s.io/decision")
            .map(String::as_str),
        Some("forbid"),
        "{}",
        summary(refused)
    );
    // The only refusals the host's ServiceAccount met are no-patch's ConfigMap patches (of every
    // ConfigMap, kube-system's too): the shipped plugins and the host itself work within the RBAC.
    let other_refusals: Vec<String> = by_host
        .iter()
        .filter(|e| e.code() == Some(403))
        .filter(|e| !(by_host_as(e, UNGRANTED) && e.verb == "patch" && resource(e) == "configmaps"))
        .map(|e| summary(e))
        .collect();
    assert!(other_refusals.is_empty(), "refused: {other_refusals:#?}");
    println!(
        "audit: {} requests by {host_user} ({} its own, none refused); node patch: {}; refused: {}",
        by_host.len(),
        own.len(),
        summary(node_patch),
        summary(refused)
    );
    println!(
        "Node labelled hopegi/pod-count={label}; Network Ready with Neutron network {}",
        tagged[0]["id"]
    );

    // The host's log says where its configuration came from.
    let log = host.log_text();
    assert!(
        log.contains("using the in-cluster configuration"),
        "the log does not say the in-cluster config was used"
    );
    // The compile cache in the emptyDir is used, not refused (it must be the host's own).
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("compile cache directory refused"))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");

    // 8. Clean up while the host runs (the network plugin's finalizer empties Neutron), then
    // SIGTERM, as the kubelet stops a container.
    networks
        .delete("in-cluster", &DeleteParams::default())
        .await?;
    eventually("the Network gone", Duration::from_secs(60), || async {
        Ok(networks
            .get_opt("in-cluster")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let left = os.neutron_get(&os_token, &format!("networks?tags=k8s-uid-{net_uid}"))?;
    assert_eq!(left["networks"], json!([]), "left in Neutron");
    nodes.delete(&node_name, &DeleteParams::default()).await?;
    cms.delete("refused", &DeleteParams::default()).await?;
    for name in ["p0", "p1"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    let stopping = Instant::now();
    host.signal(libc::SIGTERM, false);
    let status = eventually(
        "the host exits on SIGTERM within the grace period",
        spec.grace,
        || {
            let exited = host.exited();
            async move { exited }
        },
    )
    .await?;
    assert!(status.success(), "exit on SIGTERM: {status}");
    println!("SIGTERM: exited {status} after {:?}", stopping.elapsed());
    Ok(())
}
