//! The `shard-stamper` plugin in host processes, and what the API server saw of it (the sharding
//! tests, `sharded_plugin.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::objects::{HostProcess, per_plugin_election};
use super::{install, temp_dir};

/// The plugin's name in every replica.
pub const PLUGIN: &str = "stamper";

/// The plugin's NAME.toml for one replica: sharded into `shards` ranges, with `extra` settings
/// (lines before `[config]`) and `config` lines.
pub fn settings(replica: &str, ns: &str, shards: usize, extra: &str, config: &str) -> String {
    format!(
        "name = \"{PLUGIN}\"\nnamespaces = [\"{ns}\"]\nshards = {shards}\napi_qps = 0\n{extra}\n\
         [config]\nreplica = \"{replica}\"\n{config}\n"
    )
}

/// A replica's plugins directory: the same component, and `settings` (which name the replica).
pub fn plugin_dir(replica: &str, settings: &str) -> Result<PathBuf> {
    let dir = temp_dir(&format!("shards-{replica}"))?;
    install(&dir, "shard-stamper", &format!("{PLUGIN}.wasm"))?;
    write_settings(&dir, settings)?;
    Ok(dir)
}

/// Replaces the plugin's NAME.toml in `dir` (atomically: write, then rename).
pub fn write_settings(dir: &Path, settings: &str) -> Result<()> {
    let tmp = dir.join(format!(".{PLUGIN}.toml.tmp"));
    std::fs::write(&tmp, settings)?;
    std::fs::rename(&tmp, dir.join(format!("{PLUGIN}.toml")))?;
    Ok(())
}

/// A host process named `replica` in per-plugin election mode, its log in `logs`.
pub fn start_in(
    dir: &Path,
    replica: &str,
    lease_ns: &str,
    kubeconfig: &Path,
    logs: &Path,
) -> Result<HostProcess> {
    HostProcess::start(
        kubeconfig,
        dir,
        replica,
        &logs.join(format!("{replica}.log")),
        &per_plugin_election(lease_ns),
    )
}

/// The name of range `k`'s Lease in a layout of `shards` ranges by UID.
pub fn range_lease(k: usize, shards: usize) -> String {
    format!("wasm-controller-manager-plugin-{PLUGIN}-shard-uid-{k}-of-{shards}")
}

/// The range Leases' holders by index (the `replica` prefix of each holder identity; "" for a
/// Lease nobody holds or that does not exist).
pub async fn range_owners(leases: &Api<Lease>, shards: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for k in 0..shards {
        let holder = leases
            .get_opt(&range_lease(k, shards))
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        out.push(holder.split('_').next().unwrap_or_default().to_string());
    }
    Ok(out)
}

/// How many range Leases each replica holds.
pub async fn range_holders(leases: &Api<Lease>, shards: usize) -> Result<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for replica in range_owners(leases, shards).await? {
        *out.entry(replica).or_default() += 1;
    }
    Ok(out)
}

/// Sets every ConfigMap's `data.value` to `value`.
pub async fn bump(cms: &Api<ConfigMap>, names: &[String], value: &str) -> Result<()> {
    futures::stream::iter(names.iter().map(Ok::<_, anyhow::Error>))
        .try_for_each_concurrent(16, |n| async move {
            cms.patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"value": value}})),
            )
            .await?;
            Ok(())
        })
        .await
}

/// Who stamped each ConfigMap with `value` (its `wcm.test/by`), when all `n` of them are.
pub async fn stamped(cms: &Api<ConfigMap>, n: usize, value: &str) -> Result<Option<Vec<String>>> {
    // A list of every object, at most about once a second for 30,000 of them.
    tokio::time::sleep(Duration::from_millis(n as u64 / 30)).await;
    let list = cms.list(&ListParams::default()).await?;
    let by: Vec<String> = list
        .items
        .iter()
        .filter_map(|cm| {
            let a = cm.metadata.annotations.as_ref()?;
            (a.get("wcm.test/stamped")? == value)
                .then(|| a.get("wcm.test/by").cloned().unwrap_or_default())
        })
        .collect();
    Ok((by.len() == n).then_some(by))
}

/// Each call of an object: the replica, and when the API server received and completed it.
pub type Calls = BTreeMap<String, Vec<(String, String, String)>>;

/// The plugin's own ConfigMap requests of verb `verb` (made as its identity) that the audit log
/// saw since `mark`: by object, each call's replica (from the User-Agent, which names the host's
/// Pod) and its `[received, completed]` times.
pub fn plugin_calls_since(
    env: &testenv::TestEnv,
    mark: testenv::AuditMark,
    ns: &str,
    replicas: &[&str],
    verb: &str,
) -> Result<Calls> {
    let mut out = Calls::new();
    for e in env.audit_events_since(mark)? {
        let Some(o) = &e.object_ref else { continue };
        if e.verb != verb
            || e.stage != "ResponseComplete"
            || o.resource != "configmaps"
            || o.namespace != ns
            || !e
                .effective_user()
                .ends_with(&format!("wcm-plugin-{PLUGIN}"))
        {
            continue;
        }
        let replica = replicas
            .iter()
            .find(|r| e.user_agent.contains(&format!("({r}_")))
            .map(|r| r.to_string())
            .with_context(|| format!("a {verb} with User-Agent {:?}", e.user_agent))?;
        out.entry(o.name.clone()).or_default().push((
            replica,
            e.request_received_timestamp.clone(),
            e.stage_timestamp.clone(),
        ));
    }
    Ok(out)
}
