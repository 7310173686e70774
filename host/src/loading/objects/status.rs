//! The status of Plugin objects, as `kubectl get plugins` shows it. Replicas do not fight over it:
//! each replica applies (server-side apply) only its own entry of `status.replicas` under a field
//! manager of its own; the object-wide fields (conditions, digest, contract, declares, leader) are
//! applied by the replica that leads the plugin, or, while no replica leads it (waiting, refused),
//! by every replica under one shared field manager with the same values (server-side apply of
//! equal values by two managers is no conflict).

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::{ObjectSource, ObjectState, resource, spec};
use crate::loading::plugins::{FileStatus, PluginManager};

/// Field manager of the object-wide status fields.
const SHARED_MANAGER: &str = "wcm-plugin-status";
/// At most one status write per object per this long, per replica.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Each replica rewrites its entry this often even when nothing changed (its `lastSeen`).
const REFRESH: Duration = Duration::from_secs(300);
/// An entry not rewritten for this long belongs to a replica that is gone: it is removed.
const GONE_AFTER: Duration = Duration::from_secs(900);

/// The condition list and the replica entry one replica computes for one object.
fn conditions(
    state: &ObjectState,
    file: Option<&FileStatus>,
) -> (Vec<Value>, &'static str, String) {
    let generation = state.generation;
    let cond = |t: &str, ok: Option<bool>, reason: &str, message: &str| {
        json!({
            "type": t,
            "status": match ok { Some(true) => "True", Some(false) => "False", None => "Unknown" },
            "reason": reason,
            "message": crate::contract::validate::log_text(message, 1024),
            "observedGeneration": generation,
        })
    };
    let mut out = Vec::new();
    let spec_error = match &state.spec {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    };
    let current = state.loaded_generation == Some(generation);
    let pulled = match (&spec_error, &state.fetch_error, current) {
        (Some(e), _, _) => cond("Pulled", Some(false), "InvalidSpec", e),
        (None, Some(e), _) => cond("Pulled", Some(false), e.reason, &e.message),
        (None, None, true) => cond(
            "Pulled",
            Some(true),
            if state.cached { "FromCache" } else { "Pulled" },
            &state
                .loadable
                .as_ref()
                .map(|l| format!("sha256:{} from {}", l.sha256, l.source))
                .unwrap_or_default(),
        ),
        (None, None, false) => cond("Pulled", None, "Pulling", "fetching the component"),
    };
    out.push(pulled);
    let verified = match (&state.fetch_error, current) {
        (Some(e), _) if e.reason.starts_with("Signature") => {
            cond("Verified", Some(false), e.reason, &e.message)
        }
        (None, true) if state.verified_by.is_some() || state.operator_verified => {
            let mut by = Vec::new();
            if state.operator_verified {
                by.push("--plugin-verify-key".to_string());
            }
            if let Some(i) = state.verified_by {
                by.push(format!("verify.publicKeys[{i}]"));
            }
            cond(
                "Verified",
                Some(true),
                "Verified",
                &format!("cosign signatures by {}", by.join(" and ")),
            )
        }
        (None, true) => cond(
            "Verified",
            None,
            "NotRequested",
            "no signature verification requested (the digest pins the bytes)",
        ),
        _ => cond("Verified", None, "Verifying", "checking the signature"),
    };
    out.push(verified);
    let (granted, ready, state_word, reason) = match file {
        Some(FileStatus::Running {
            update_refused: None,
            ..
        }) => (
            cond("Granted", Some(true), "Granted", ""),
            cond("Ready", Some(true), "Running", "running"),
            "running",
            String::new(),
        ),
        Some(FileStatus::Running {
            update_refused: Some(e),
            ..
        }) => (
            cond("Granted", Some(true), "Granted", ""),
            cond("Ready", Some(false), "UpdateRefused", e),
            "running",
            e.clone(),
        ),
        Some(FileStatus::Disabled { .. }) => (
            cond("Granted", None, "Disabled", ""),
            cond(
                "Ready",
                Some(false),
                "Disabled",
                "enabled = false in settings",
            ),
            "disabled",
            String::new(),
        ),
        Some(FileStatus::Waiting {
            reason, message, ..
        }) => {
            let forbidden = matches!(reason, crate::loading::plugins::WaitReason::Forbidden);
            (
                if forbidden {
                    cond("Granted", Some(false), "Forbidden", message)
                } else {
                    cond("Granted", None, "Waiting", "")
                },
                cond("Ready", Some(false), &camel(reason.as_str()), message),
                "waiting",
                message.clone(),
            )
        }
        Some(FileStatus::Refused { error }) => (
            cond("Granted", None, "Refused", ""),
            cond("Ready", Some(false), "Refused", error),
            "refused",
            error.clone(),
        ),
        Some(FileStatus::Loading) => (
            cond("Granted", None, "Loading", ""),
            cond("Ready", None, "Loading", "loading"),
            "loading",
            String::new(),
        ),
        None => {
            let why = state
                .fetch_error
                .as_ref()
                .map(|e| e.message.clone())
                .or(spec_error)
                .unwrap_or_else(|| "fetching".into());
            (
                cond("Granted", None, "NotLoaded", ""),
                cond("Ready", Some(false), "NotLoaded", &why),
                "pending",
                why,
            )
        }
    };
    out.push(granted);
    out.push(ready);
    (out, state_word, reason)
}

/// Writes the status of every Plugin object when this replica's view of it changes, until the
/// task is dropped.
pub async fn run(source: Arc<ObjectSource>, plugins: Arc<PluginManager>, replica: String) {
    let api: Api<DynamicObject> = Api::all_with(source.client.clone(), &resource());
    let replica_manager = manager_of(&replica);
    // What was last written per object, and when: rewritten every REFRESH even if unchanged, so
    // the entry's `lastSeen` tells the others this replica is alive.
    let mut written: std::collections::BTreeMap<String, (Value, std::time::Instant)> =
        Default::default();
    // The last write error per object: said once, not at every retry.
    let mut failing: std::collections::BTreeMap<String, String> = Default::default();
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = source.state_changed.notified() => {}
            _ = tick.tick() => {}
        }
        tokio::time::sleep(MIN_INTERVAL).await;
        let files = plugins.status().await;
        let leaders = plugins.leaders().await;
        let declared = plugins.declared().await;
        let states = source.states();
        written.retain(|name, _| states.contains_key(name));
        failing.retain(|name, _| states.contains_key(name));
        for (name, state) in states {
            let key = spec::key_of(&name);
            let file = files.get(&key);
            let (conds, word, reason) = conditions(&state, file);
            let (leading, leader) = match leaders.get(&key) {
                Some((leading, leader)) => (*leading, leader.clone()),
                // No election for it: this replica runs it when it runs.
                None => {
                    let running = matches!(file, Some(FileStatus::Running { .. }));
                    (running, running.then(|| replica.clone()))
                }
            };
            let digest = state
                .loadable
                .as_ref()
                .map(|l| format!("sha256:{}", l.sha256));
            // What runs (or is being tried) declares, as `inspect` shows it; the grant it misses
            // while it waits for one.
            let declares = declared.get(&key).cloned();
            let contract = declares
                .as_ref()
                .and_then(|d| d["contract"].as_str().map(str::to_string));
            let declares = declares.map(|mut d| {
                if let Some(m) = d.as_object_mut() {
                    m.remove("contract");
                }
                d
            });
            let missing_grant = match file {
                Some(FileStatus::Waiting {
                    reason: crate::loading::plugins::WaitReason::Forbidden,
                    message,
                    ..
                }) => Some(crate::contract::validate::log_text(message, 1024)),
                _ => None,
            };
            let mine = json!({
                "apiVersion": format!("{}/{}", spec::GROUP, spec::VERSION),
                "kind": spec::KIND,
                "metadata": {"name": name},
                "status": {"replicas": [{
                    "name": replica,
                    "state": word,
                    "reason": crate::contract::validate::log_text(&reason, 1024),
                    "digest": digest,
                    "leading": leading,
                    "observedGeneration": state.generation,
                }]},
            });
            let whole = json!({
                "apiVersion": format!("{}/{}", spec::GROUP, spec::VERSION),
                "kind": spec::KIND,
                "metadata": {"name": name},
                "status": {
                    "observedGeneration": state.generation,
                    "source": state.loadable.as_ref().map(|l| l.source.clone()),
                    "digest": digest,
                    "contract": contract,
                    "declares": declares,
                    "missingRule": missing_grant,
                    "leader": leader,
                    "conditions": conds,
                },
            });
            let (mine, whole) = (without_nulls(mine), without_nulls(whole));
            // The object-wide fields: by the leader, or by everyone while nobody leads.
            let write_whole = leading || leader.is_none();
            let snapshot = json!([mine, write_whole.then_some(&whole)]);
            if written
                .get(&name)
                .is_some_and(|(w, at)| *w == snapshot && at.elapsed() < REFRESH)
            {
                continue;
            }
            let mut mine = mine;
            mine["status"]["replicas"][0]["lastSeen"] =
                k8s_openapi::jiff::Timestamp::now().to_string().into();
            let mut ok = true;
            let mut report =
                |e: kube::Error, failing: &mut std::collections::BTreeMap<String, String>| {
                    ok = false;
                    let text = e.to_string();
                    if failing.get(&name) != Some(&text) {
                        tracing::warn!(plugin_object = %name, "writing the Plugin's status failed: {text}");
                        failing.insert(name.clone(), text);
                    }
                };
            let params = PatchParams::apply(&replica_manager).force();
            let after_mine = match api.patch_status(&name, &params, &Patch::Apply(&mine)).await {
                Ok(o) => Some(o),
                Err(e) => {
                    report(e, &mut failing);
                    None
                }
            };
            // A replica that neither leads nor knows a leader writes the object-wide fields only
            // while no other replica's fresh entry says it leads: one that cannot run the plugin
            // (a fetch failed here alone) does not overwrite the leader's view.
            let other_leads = after_mine
                .as_ref()
                .is_some_and(|o| someone_else_leads(o, &replica));
            if write_whole && (leading || !other_leads) {
                match api
                    .patch_status(
                        &name,
                        &PatchParams::apply(SHARED_MANAGER).force(),
                        &Patch::Apply(&whole),
                    )
                    .await
                {
                    Ok(o) => prune_gone_replicas(&api, &name, &o, &replica).await,
                    Err(e) => report(e, &mut failing),
                }
            }
            if ok {
                failing.remove(&name);
                written.insert(name, (snapshot, std::time::Instant::now()));
            }
        }
    }
}

/// Whether another replica's entry, seen within `GONE_AFTER`, says it leads the plugin.
fn someone_else_leads(o: &DynamicObject, me: &str) -> bool {
    let now = k8s_openapi::jiff::Timestamp::now();
    o.data["status"]["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| {
            e["name"].as_str().is_some_and(|n| n != me)
                && e["leading"] == true
                && e["lastSeen"]
                    .as_str()
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .is_some_and(|t| {
                        now.duration_since(t)
                            .try_into()
                            .is_ok_and(|d: Duration| d <= GONE_AFTER)
                    })
        })
}

/// The field manager of one replica's entry in `status.replicas`.
fn manager_of(replica: &str) -> String {
    format!(
        "wcm-replica-{}",
        crate::contract::validate::log_text(replica, 100)
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            .collect::<String>()
    )
}

/// Removes the entries of replicas not seen for `GONE_AFTER` (Pods replaced by a rollout, a
/// replica that died): each by applying nothing under that replica's own field manager, which
/// takes away exactly the fields it owned.
async fn prune_gone_replicas(api: &Api<DynamicObject>, name: &str, o: &DynamicObject, me: &str) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let Some(entries) = o.data["status"]["replicas"].as_array() else {
        return;
    };
    for e in entries {
        let Some(other) = e["name"].as_str() else {
            continue;
        };
        if other == me {
            continue;
        }
        let seen = e["lastSeen"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        let gone = seen.is_none_or(|t| {
            now.duration_since(t)
                .try_into()
                .is_ok_and(|d: Duration| d > GONE_AFTER)
        });
        if !gone {
            continue;
        }
        let empty = json!({
            "apiVersion": format!("{}/{}", spec::GROUP, spec::VERSION),
            "kind": spec::KIND,
            "metadata": {"name": name},
        });
        match api
            .patch_status(
                name,
                &PatchParams::apply(&manager_of(other)).force(),
                &Patch::Apply(&empty),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(plugin_object = %name, replica = %crate::contract::validate::log_text(other, 100), "removed the status entry of a replica not seen for {GONE_AFTER:?}")
            }
            Err(e) => {
                tracing::debug!(plugin_object = %name, "removing a gone replica's status entry: {e}")
            }
        }
    }
}

/// `name_taken` → `NameTaken`: a condition reason as Kubernetes writes them.
fn camel(word: &str) -> String {
    word.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// `v` without its null members (an absent field, for server-side apply: the schema refuses null).
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}
