//! What the node test does to the running Pods and reads back: a Pod's network cut from the API
//! server, relays from the node's bridge to loopback services, docs/deploying.md's plugin slots,
//! and the audit log's account of which replica wrote as a plugin.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use testenv::AuditEvent;
use wasm_controller_manager::loading::rbac;

use crate::common::deploying::{copy_dir, write_doc_example};

/// Runs `ip ARGS` in the network namespace of process `pid` (a container's).
fn ip_in_netns(pid: u32, args: &[&str]) -> Result<()> {
    // Never the machine's own namespace (a PID reused by a process outside the Pod).
    let ns = |p: &str| std::fs::read_link(p).map(|l| l.to_string_lossy().into_owned());
    anyhow::ensure!(
        ns(&format!("/proc/{pid}/ns/net"))? != ns("/proc/self/ns/net")?,
        "process {pid} is in this machine's own network namespace, not a Pod's"
    );
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("ip")
        .args(args)
        .output()
        .context("nsenter (util-linux)")?;
    if !out.status.success() {
        bail!(
            "ip {} in the netns of {pid}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// In the Pod whose process is `pid`: the route to the `kubernetes` Service's address becomes a
/// blackhole, so the Pod cannot reach the API server (and nothing else changes for it or others).
pub fn cut_from_apiserver(pid: u32, cluster_ip: &str) -> Result<()> {
    ip_in_netns(
        pid,
        &["route", "replace", "blackhole", &format!("{cluster_ip}/32")],
    )
}

/// Puts back the route the node's CNI configuration gives every Pod (via the node's address).
pub fn restore_apiserver_route(pid: u32, cluster_ip: &str, node_ip: &str) -> Result<()> {
    ip_in_netns(
        pid,
        &[
            "route",
            "replace",
            &format!("{cluster_ip}/32"),
            "via",
            node_ip,
        ],
    )
}

/// A TCP relay on the node's bridge address to a service on loopback: the Pods reach only the
/// bridge's subnet, so this is how a Pod reaches the test's Keystone and Neutron. Stops on drop.
pub struct Relay {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(bind_ip: &str, target: SocketAddr) -> Result<Relay> {
        let listener = tokio::net::TcpListener::bind((bind_ip, 0))
            .await
            .with_context(|| format!("listen on {bind_ip} (the node's bridge)"))?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        Ok(Relay { addr, task })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `http://127.0.0.1:PORT/…` → `127.0.0.1:PORT`.
pub fn loopback_authority(url: &str) -> Result<SocketAddr> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url} is not http"))?;
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .parse()
        .with_context(|| format!("{url}: not an address"))
}

/// docs/deploying.md's `my-deploy/`, written from the page into `root`: the shipped manifests, the
/// plugins volume of four ConfigMap slots, pod-counter in slot 1 and network (with `network_toml`)
/// in slot 2, as the page says; each of `extra` goes into the slot it names (3 or 4), as an
/// operator adds a slot's files. The RBAC is what `rbac` prints for all of them (as the page runs it); the image is set to
/// `image`. Returns the rendered objects.
pub async fn documented_deployment(
    client: &kube::Client,
    root: &Path,
    network_toml: &str,
    extra: &[(u8, PathBuf)],
    image: &str,
) -> Result<Vec<Value>> {
    let deploy = root.join("my-deploy");
    copy_dir(&testenv::manifests_dir(), &deploy)?;
    std::fs::create_dir_all(deploy.join("plugins"))?;
    let mut plugins = Vec::new();
    for (name, file) in [
        ("pod_counter", "pod_counter.wasm"),
        ("network", "network.wasm"),
    ] {
        let to = deploy.join("plugins").join(file);
        std::fs::copy(crate::common::plugin(name)?, &to)?;
        plugins.push(to);
    }
    let page = std::fs::read_to_string(testenv::repo_root().join("docs/deploying.md"))?;
    write_doc_example(&page, root)?;
    // The operator's own settings: this test's Keystone and Neutron, through the relays.
    std::fs::write(deploy.join("plugins/network.toml"), network_toml)?;
    let mut slots = String::new();
    for slot in [3, 4] {
        let files: Vec<&PathBuf> = extra
            .iter()
            .filter(|(s, _)| *s == slot)
            .map(|(_, f)| f)
            .collect();
        if files.is_empty() {
            continue;
        }
        slots.push_str(&format!(
            "  - name: wcm-plugins-{slot}\n    namespace: wcm-system\n    files:\n"
        ));
        for file in files {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .context("plugin file name")?;
            let to = deploy.join("plugins").join(name);
            std::fs::copy(file, &to)?;
            slots.push_str(&format!("      - plugins/{name}\n"));
            if name.ends_with(".wasm") {
                plugins.push(to);
            }
        }
    }
    let kustomization = deploy.join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&kustomization)?;
    text.push_str(&slots);
    // The test overlay: the image name (the pull policy is set on the rendered Deployment).
    let (name, tag) = image.split_once(':').unwrap_or((image, "latest"));
    let documented =
        "    newName: registry.example.com/wasm-controller-manager\n    newTag: \"0.1.0\"\n";
    anyhow::ensure!(
        text.contains(documented),
        "docs/deploying.md's kustomization no longer sets the image as the test expects:\n{text}"
    );
    text = text.replace(
        documented,
        &format!("    newName: {name}\n    newTag: \"{tag}\"\n"),
    );
    std::fs::write(&kustomization, text)?;

    let out = crate::common::deploying::deployment_rbac(client, plugins).await?;
    std::fs::write(
        deploy.join("rbac/generated.yaml"),
        rbac::render(
            &out,
            Some(&crate::common::deploying::made_by_the_kustomization()),
        )?,
    )?;
    crate::common::deploying::yaml_documents(&testenv::kustomize(&deploy)?)
}

/// The replica an audit event's User-Agent names: `wasm-controller-manager/VERSION (IDENTITY)`.
pub fn replica_of(e: &AuditEvent) -> Option<&str> {
    let rest = e.user_agent.strip_prefix("wasm-controller-manager/")?;
    let (_, identity) = rest.rsplit_once('(')?;
    identity.strip_suffix(')')
}

fn accepted(e: &AuditEvent) -> bool {
    e.stage == "ResponseComplete" && e.response_status.as_ref().is_some_and(|s| s.code < 300)
}

/// Every write attempted as a plugin (any `wcm-plugin-*` identity of `namespace`), accepted or
/// not, that would change a stored object. Access reviews (each replica checks every plugin's
/// grant, leading or not) are `create`s that store nothing, and are left out.
pub fn plugin_writes<'a>(events: &'a [AuditEvent], namespace: &str) -> Vec<&'a AuditEvent> {
    let prefix = format!("system:serviceaccount:{namespace}:wcm-plugin-");
    events
        .iter()
        .filter(|e| e.stage == "ResponseComplete")
        .filter(|e| {
            matches!(
                e.verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        })
        .filter(|e| e.effective_user().starts_with(&prefix))
        .filter(|e| {
            !e.object_ref.as_ref().is_some_and(|o| {
                matches!(
                    o.api_group.as_str(),
                    "authorization.k8s.io" | "authentication.k8s.io"
                )
            })
        })
        .collect()
}

/// The accepted writes of the Lease, in time order: (when, by which replica).
pub fn lease_writes<'a>(
    events: &'a [AuditEvent],
    namespace: &str,
    lease: &str,
) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| accepted(e))
        .filter(|e| matches!(e.verb.as_str(), "create" | "update" | "patch"))
        .filter(|e| {
            e.object_ref.as_ref().is_some_and(|o| {
                o.resource == "leases" && o.namespace == namespace && o.name == lease
            })
        })
        .filter_map(|e| Some((e.stage_timestamp.as_str(), replica_of(e)?)))
        .collect();
    out.sort();
    out
}

/// Every plugin write attempt was made by the replica that had written the Lease last before it:
/// no two replicas reconciled at once, so no reconcile was doubled across a hand-over. (A write
/// after its replica released the Lease, before the next holder's first write, is not caught here;
/// the drain step checks the release comes after the last write.) Returns the number of writes
/// checked and the replicas that wrote.
pub fn writes_follow_the_lease(
    events: &[AuditEvent],
    namespace: &str,
    lease: &str,
) -> Result<(usize, Vec<String>)> {
    let lease_writes = lease_writes(events, namespace, lease);
    let writes = plugin_writes(events, namespace);
    let mut writers = Vec::new();
    let mut wrong = Vec::new();
    for w in &writes {
        let Some(by) = replica_of(w) else {
            wrong.push(format!(
                "{} {}: no replica in its User-Agent",
                w.verb, w.request_uri
            ));
            continue;
        };
        let holder = lease_writes
            .iter()
            .rfind(|(at, _)| *at < w.stage_timestamp.as_str())
            .map(|(_, who)| *who);
        if holder != Some(by) {
            wrong.push(format!(
                "{} {} {} by {by} at {}, when the Lease was last written by {holder:?}",
                w.verb,
                w.request_uri,
                w.effective_user(),
                w.stage_timestamp
            ));
        }
        if !writers.iter().any(|r| r == by) {
            writers.push(by.to_string());
        }
    }
    if !wrong.is_empty() {
        bail!(
            "{} of {} plugin writes came from a replica that did not hold the Lease:\n{}",
            wrong.len(),
            writes.len(),
            wrong.join("\n")
        );
    }
    Ok((writes.len(), writers))
}
