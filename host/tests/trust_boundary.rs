//! The trust boundary, proven by what the API server saw (its audit log), with hostile plugins:
//! crafted namespaces, names, kinds and selectors reach nothing; a watch without a grant serves
//! nothing and waits until the operator grants it (then starts without a restart, and stops again
//! when the grant is revoked); events about objects outside the grant are refused; crafted call
//! options smuggle no parameter; every call goes out under the plugin's own identity.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use testenv::AuditEvent;
use wasm_controller_manager::loading::plugins::{FileStatus, WaitReason};

fn secret(name: &str) -> Result<Secret> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"password": "hunter2"}
    }))?)
}

fn waits_for_a_grant(s: &FileStatus) -> bool {
    matches!(
        s,
        FileStatus::Waiting {
            reason: WaitReason::Forbidden,
            ..
        }
    )
}

fn resource(e: &AuditEvent) -> &str {
    e.object_ref.as_ref().map_or("", |o| o.resource.as_str())
}

fn namespace(e: &AuditEvent) -> &str {
    e.object_ref.as_ref().map_or("", |o| o.namespace.as_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn crafted_namespaces_names_kinds_and_selectors_reach_nothing() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_namespace(&client, "wcm-pi").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "wcm-pi");
    secrets
        .create(&PostParams::default(), &secret("topsecret")?)
        .await?;
    let dir = temp_dir("path-injection")?;
    install(&dir, "path-injection", "path-injection.wasm")?;
    install(&dir, "well-behaved", "well-behaved.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    let mark = env.audit_mark()?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "wcm-pi");
    cms.create(
        &PostParams::default(),
        &cm("probe", &[("target", "topsecret")]),
    )
    .await?;
    let attacks = reported_attacks::<Vec<serde_json::Value>>(&cms, "probe").await?;
    assert_eq!(attacks.len(), 11, "{attacks:?}");
    for a in &attacks {
        let want = if a["attack"] == "undeclared kind" {
            403
        } else {
            400
        };
        assert_eq!(a["code"], want, "{a}");
    }

    // What the API server saw since the plugin started: not one request about a Secret, nothing
    // naming the target, and the plugin's own patch under its own identity.
    let events = eventually(
        "the patch of the probe in the audit log",
        Duration::from_secs(30),
        || async {
            let events = env.audit_events_since(mark)?;
            let patched = events.iter().any(|e| {
                e.verb == "patch"
                    && resource(e) == "configmaps"
                    && e.object_ref.as_ref().is_some_and(|o| o.name == "probe")
                    && e.effective_user() == plugin_user("path-injection")
            });
            Ok(patched.then_some(events))
        },
    )
    .await?;
    let secret_requests: Vec<&AuditEvent> = events
        .iter()
        // Only this test's namespace: another test of this binary reads its own Secrets.
        .filter(|e| {
            (resource(e) == "secrets" && namespace(e) == "wcm-pi")
                || e.request_uri.contains("topsecret")
        })
        .collect();
    assert!(
        secret_requests.is_empty(),
        "the API server received requests about the Secret: {secret_requests:?}"
    );
    // Every request of a plugin is its own: well-behaved's patches carry its identity.
    eventually(
        "well-behaved's patch under its own identity",
        Duration::from_secs(30),
        || async {
            let found = env
                .audit_events_since(mark)?
                .iter()
                .any(|e| e.verb == "patch" && e.effective_user() == plugin_user("well-behaved"));
            Ok(found.then_some(()))
        },
    )
    .await?;
    let by_plugins_as_host = events
        .iter()
        .any(|e| e.verb == "patch" && resource(e) == "configmaps" && e.impersonated_user.is_none());
    assert!(
        !by_plugins_as_host,
        "a plugin's patch went out under the host's identity"
    );
    let invalid = metric(
        &manager,
        "wcm_invalid_host_calls_total",
        &[("plugin", "path-injection")],
    );
    assert!(invalid >= 10.0, "invalid calls counted: {invalid}");
    let forbidden = metric(
        &manager,
        "wcm_forbidden_host_calls_total",
        &[("plugin", "path-injection"), ("resource", "undeclared")],
    );
    assert!(forbidden >= 1.0, "undeclared kind counted: {forbidden}");
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_without_a_grant_serves_nothing_and_starts_once_granted() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_namespace(&client, "wcm-sr").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "wcm-sr");
    secrets
        .create(&PostParams::default(), &secret("s1")?)
        .await?;
    let dir = temp_dir("secret-reader")?;
    let wasm = install(&dir, "secret-reader", "secret-reader.wasm")?;
    let mark = env.audit_mark()?;
    let manager = start_manager_ungranted(test_config(&dir)).await?;

    let status = wait_status_within(
        &manager,
        "secret-reader",
        "waits for its grant",
        Duration::from_secs(30),
        waits_for_a_grant,
    )
    .await?;
    let text = format!("{status:?}");
    assert!(
        text.contains("may not list secrets") && text.contains("wcm-sr"),
        "{text}"
    );
    // Several retries later: still nothing served, and the API server saw no list or watch of
    // Secrets at all (the shared informer was never started for it).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        metric(
            &manager,
            "controller_runtime_reconcile_total",
            &[("controller", "secret-reader")]
        ),
        0.0
    );
    let reads: Vec<AuditEvent> = env
        .audit_events_since(mark)?
        .into_iter()
        .filter(|e| resource(e) == "secrets" && e.verb != "create")
        .collect();
    assert!(
        reads.is_empty(),
        "Secrets were read before any grant: {reads:?}"
    );
    assert_eq!(
        metric(
            &manager,
            "wcm_plugin_waiting",
            &[("plugin", "secret-reader"), ("reason", "forbidden")]
        ),
        1.0
    );

    // The operator applies the generated RBAC: the plugin starts without a restart.
    grant(std::slice::from_ref(&wasm)).await?;
    eventually(
        "secret-reader reconciles s1 once granted",
        Duration::from_secs(30),
        || async {
            let n = metric(
                &manager,
                "controller_runtime_reconcile_total",
                &[("controller", "secret-reader"), ("result", "success")],
            );
            Ok((n >= 1.0).then_some(()))
        },
    )
    .await?;

    // While it runs, its grants are checked once per rescan (every 2 s here), not in a loop: the
    // API server sees a handful of access reviews in 6 s, not hundreds.
    let quiet = env.audit_mark()?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let reviews = env
        .audit_events_since(quiet)?
        .iter()
        .filter(|e| {
            resource(e) == "selfsubjectaccessreviews"
                && e.effective_user() == plugin_user("secret-reader")
        })
        .count();
    assert!(reviews <= 12, "{reviews} access reviews in 6 s");

    // Revoked: the plugin stops and waits again.
    let roles: Api<Role> = Api::namespaced(client.clone(), "wcm-sr");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "wcm-sr");
    bindings
        .delete("wcm-plugin:secret-reader", &DeleteParams::default())
        .await
        .context("delete the plugin's RoleBinding")?;
    roles
        .delete("wcm-plugin:secret-reader", &DeleteParams::default())
        .await?;
    wait_status_within(
        &manager,
        "secret-reader",
        "waits again after the revocation",
        Duration::from_secs(30),
        waits_for_a_grant,
    )
    .await?;
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn events_about_objects_outside_the_grant_are_refused() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_namespace(&client, "wcm-eo").await?;
    ensure_namespace(&client, "wcm-eo-other").await?;
    let dir = temp_dir("event-outside")?;
    install(&dir, "event-outside", "event-outside.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    let mark = env.audit_mark()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "wcm-eo");
    cms.create(&PostParams::default(), &cm("c1", &[])).await?;

    let user = plugin_user("event-outside");
    // The event about a ConfigMap in wcm-eo-other (a namespace where it does not act) and the one
    // about a Secret (neither watched nor declared) never leave the host.
    eventually(
        "the host refuses both events outside the grant",
        Duration::from_secs(60),
        || async {
            let refused = metric(
                &manager,
                "wcm_invalid_host_calls_total",
                &[("plugin", "event-outside"), ("call", "event")],
            );
            Ok((refused >= 2.0).then_some(()))
        },
    )
    .await?;
    let events = eventually(
        "the event inside in the audit log",
        Duration::from_secs(60),
        || async {
            let events = env.audit_events_since(mark)?;
            let writes: Vec<AuditEvent> = events
                .into_iter()
                .filter(|e| resource(e) == "events" && e.verb == "create")
                .collect();
            let inside = writes.iter().any(|e| namespace(e) == "wcm-eo");
            Ok(inside.then_some(writes))
        },
    )
    .await?;
    // One event created where the plugin may write (about its own ConfigMap; repeats become a
    // series, written by patch), and nothing anywhere else.
    let inside = events.iter().filter(|e| namespace(e) == "wcm-eo").count();
    assert_eq!(inside, 1, "{events:?}");
    for e in &events {
        assert_eq!(e.effective_user(), user, "{e:?}");
        match namespace(e) {
            "wcm-eo" => assert_eq!(e.code(), Some(201), "{e:?}"),
            other => panic!("an event was written to {other}: {e:?}"),
        }
    }
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn files_that_are_not_plugins_in_the_directory_are_refused_and_the_rest_runs() -> Result<()> {
    use std::os::unix::fs::{PermissionsExt, symlink};

    let dir = temp_dir("hostile-files")?;
    let outside = temp_dir("hostile-files-outside")?;
    let cache = temp_dir("hostile-files-cache")?;
    std::fs::write(dir.join("good.toml"), "name = \"files-good\"\n")?;
    install(&dir, "well-behaved", "good.wasm")?;
    // A link out of the directory, a FIFO, /dev/zero as a plugin and as a NAME.toml.
    install(&outside, "well-behaved", "escape.wasm")?;
    symlink(outside.join("escape.wasm"), dir.join("escape.wasm"))?;
    let fifo = std::process::Command::new("mkfifo")
        .arg(dir.join("fifo.wasm"))
        .status()?;
    anyhow::ensure!(fifo.success(), "mkfifo failed");
    symlink("/dev/zero", dir.join("devzero.wasm"))?;
    install(&dir, "well-behaved", "zero.wasm")?;
    symlink("/dev/zero", dir.join("zero.toml"))?;

    let mut cfg = test_config(&dir);
    cfg.compile_cache = Some(cache.clone());
    let manager = start_manager(cfg.clone()).await?;
    let status = manager.plugins.status().await;
    let refused = |stem: &str| match status.get(stem) {
        Some(FileStatus::Refused { error }) => error.clone(),
        other => format!("not refused: {other:?}"),
    };
    assert!(
        refused("escape").contains("outside the plugins directory"),
        "{}",
        refused("escape")
    );
    assert!(refused("fifo").contains("FIFO"), "{}", refused("fifo"));
    // /dev/zero is refused before anything is read from it (reading would never end).
    assert!(
        refused("devzero").contains("/dev/zero, outside the plugins directory"),
        "{}",
        refused("devzero")
    );
    assert!(
        refused("zero").contains("zero.toml") && refused("zero").contains("/dev/zero"),
        "{}",
        refused("zero")
    );
    assert!(
        matches!(status.get("good"), Some(FileStatus::Running { .. })),
        "{status:?}"
    );
    manager.stop().await;

    // A compile-cache file the host did not write (here: made writable by everyone, as a planted
    // file would be) is not loaded: the plugin is compiled again, runs, and the entry is rewritten.
    let entries: Vec<_> = std::fs::read_dir(&cache)?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    anyhow::ensure!(
        !entries.is_empty(),
        "nothing was cached in {}",
        cache.display()
    );
    for e in &entries {
        std::fs::set_permissions(e, std::fs::Permissions::from_mode(0o666))?;
    }
    let manager = start_manager(cfg).await?;
    let status = manager.plugins.status().await;
    assert!(
        matches!(status.get("good"), Some(FileStatus::Running { .. })),
        "{status:?}"
    );
    for e in &entries {
        let mode = std::fs::metadata(e)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} was not rewritten", e.display());
    }
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_needs_only_the_rbac_it_generates_for_its_plugins() -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_namespace(&client, "wcm-system").await?;
    ensure_namespace(&client, "wcm-host-rbac").await?;
    let dir = temp_dir("host-rbac")?;
    std::fs::write(
        dir.join("wb.toml"),
        "name = \"host-rbac-wb\"\nnamespaces = [\"wcm-host-rbac\"]\n",
    )?;
    let wasm = install(&dir, "well-behaved", "wb.wasm")?;
    // What `wasm-controller-manager rbac --host-service-account wcm-system/wcm-test-host` prints:
    // the plugin's grant and the host's own (list/watch of what it watches, impersonation).
    let discovery = wasm_controller_manager::cluster::discovery::Discovery::new(
        client.clone(),
        Duration::from_secs(10),
    );
    let out = wasm_controller_manager::loading::rbac::generate(
        &wasm_controller_manager::loading::rbac::RbacRequest {
            compile_cache: Some(std::env::temp_dir().join("wcm-test-compile-cache")),
            plugins: vec![wasm],
            identity: Default::default(),
            host_service_account: Some(("wcm-system".into(), "wcm-test-host".into())),
            allow: Default::default(),
        },
        Some(&discovery),
    )
    .await?;
    // First without the host's own list/watch: the plugin waits, saying so, instead of starting
    // informers whose caches could never fill.
    let (watch, rest): (Vec<_>, Vec<_>) = out.objects.iter().cloned().partition(|o| {
        o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("wcm-host:watch:"))
    });
    assert!(
        !watch.is_empty(),
        "no host watch grant in {:?}",
        out.objects
    );
    wasm_controller_manager::loading::rbac::apply(&client, &rest).await?;
    let host = service_account_config(&client, "wcm-system", "wcm-test-host").await?;
    let manager = wasm_controller_manager::app::Manager::start(test_config(&dir), host).await?;
    let status = wait_status_within(
        &manager,
        "wb",
        "waits for the host's own grant",
        Duration::from_secs(30),
        |s| format!("{s:?}").contains("the host's own identity may not"),
    )
    .await?;
    assert!(format!("{status:?}").contains("configmaps"), "{status:?}");
    wasm_controller_manager::loading::rbac::apply(&client, &watch).await?;
    let mark = env.audit_mark()?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "wcm-host-rbac");
    cms.create(&PostParams::default(), &cm("c1", &[("value", "least")]))
        .await?;
    eventually(
        "the plugin reconciles with the host under its generated RBAC",
        Duration::from_secs(60),
        || async {
            let c = cms.get("c1").await?;
            Ok(c.metadata
                .annotations
                .and_then(|a| a.get("wcm.test/reconciled").cloned())
                .filter(|v| v == "least")
                .map(|_| ()))
        },
    )
    .await?;
    // The API server saw the host's ServiceAccount acting as the plugin, and nothing refused.
    // The writer's audit line follows its change in etcd by a moment: read until it is there.
    let is_patch = |e: &AuditEvent| {
        e.verb == "patch"
            && namespace(e) == "wcm-host-rbac"
            && e.object_ref.as_ref().is_some_and(|o| o.name == "c1")
    };
    let events = eventually(
        "the patch of c1 in the audit log",
        Duration::from_secs(10),
        || async {
            let events = env.audit_events_since(mark)?;
            Ok(events.iter().any(is_patch).then_some(events))
        },
    )
    .await?;
    let host_user = "system:serviceaccount:wcm-system:wcm-test-host";
    let patch = events
        .iter()
        .find(|e| is_patch(e))
        .context("no patch of c1 in the audit log")?;
    assert_eq!(patch.user.username, host_user, "{patch:?}");
    assert_eq!(patch.effective_user(), plugin_user("host-rbac-wb"));
    let refused: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.user.username == host_user && e.code() == Some(403))
        .collect();
    assert!(refused.is_empty(), "the host was refused: {refused:?}");
    manager.stop().await;
    Ok(())
}

/// The query parameters of an audit event's request URI, decoded.
fn query(e: &AuditEvent) -> Vec<(String, String)> {
    let q = e.request_uri.split_once('?').map_or("", |(_, q)| q);
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn crafted_call_options_smuggle_nothing_past_the_host() -> Result<()> {
    const NS: &str = "wcm-oi";
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    ensure_namespace(&client, NS).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(&PostParams::default(), &cm("victim", &[]))
        .await?;
    let dir = temp_dir("option-injection")?;
    install(&dir, "option-injection", "option-injection.wasm")?;
    let manager = start_manager(test_config(&dir)).await?;
    let mark = env.audit_mark()?;
    cms.create(
        &PostParams::default(),
        &cm("probe", &[("target", "victim")]),
    )
    .await?;
    let attacks = reported_attacks::<Vec<serde_json::Value>>(&cms, "probe").await?;
    let seen: BTreeMap<String, i64> = attacks
        .iter()
        .map(|a| {
            (
                a["attack"].as_str().unwrap_or_default().to_string(),
                a["code"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    // Refused by the host (400), except where the value is printable text that stays inside its
    // own parameter: the selector and the continue token reach the API server, which refuses
    // them itself (checked below), and the precondition travels in the body, where it stays a
    // precondition and fails (409).
    let want: BTreeMap<String, i64> = [
        ("field selector smuggling a label selector", 400),
        ("field selector with a newline", 400),
        ("continue token smuggling a watch", 400),
        ("limit 0", 400),
        ("limit 100000", 400),
        ("field manager suffix naming another manager", 400),
        ("field manager suffix with capitals", 400),
        ("force on a merge patch", 400),
        ("precondition uid smuggling a dry run", 400),
        ("precondition resourceVersion breaking out of the body", 409),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(seen, want, "{attacks:?}");

    // What the API server saw from the plugin, once its patch of the probe is in.
    let user = plugin_user("option-injection");
    let events = eventually(
        "the patch of the probe in the audit log",
        Duration::from_secs(30),
        || async {
            let events: Vec<AuditEvent> = env
                .audit_events_since(mark)?
                .into_iter()
                .filter(|e| e.effective_user() == user)
                .collect();
            let patched = events.iter().any(|e| {
                e.verb == "patch" && e.object_ref.as_ref().is_some_and(|o| o.name == "probe")
            });
            Ok(patched.then_some(events))
        },
    )
    .await?;
    // The probe may be reconciled more than once (another test's plugin annotating it wakes it
    // again before its report lands), so requests are judged by their distinct URIs, not counted.
    let calls = |verb: &str| -> Vec<&AuditEvent> {
        events
            .iter()
            .filter(|e| e.verb == verb && resource(e) == "configmaps" && namespace(e) == NS)
            .collect()
    };
    // The two lists the host let through, each with its value inside its own parameter: no
    // labelSelector, watch or resourceVersion parameter of the plugin's making.
    let lists = calls("list");
    let distinct: BTreeSet<&str> = lists.iter().map(|e| e.request_uri.as_str()).collect();
    assert_eq!(
        distinct.len(),
        2,
        "lists that reached the API server: {lists:?}"
    );
    for e in &lists {
        let smuggled: Vec<(String, String)> = query(e)
            .into_iter()
            .filter(|(k, _)| k != "fieldSelector" && k != "continue")
            .collect();
        assert!(
            smuggled.is_empty(),
            "a list carried parameters the plugin smuggled: {smuggled:?} in {}",
            e.request_uri
        );
    }
    let selector = lists
        .iter()
        .flat_map(|e| query(e))
        .find(|(k, _)| k == "fieldSelector")
        .map(|(_, v)| v);
    assert_eq!(
        selector.as_deref(),
        Some("metadata.name=x&labelSelector=app%3Dy"),
        "the field selector as the API server received it"
    );
    let token = lists
        .iter()
        .flat_map(|e| query(e))
        .find(|(k, _)| k == "continue")
        .map(|(_, v)| v);
    assert_eq!(token.as_deref(), Some("x&watch=true&resourceVersion=0"));
    assert!(
        lists.iter().all(|e| e.code() == Some(400)),
        "the API server itself refuses both: {lists:?}"
    );
    // No patch but the plugin's own annotation of the probe, and none under another field manager.
    let patches = calls("patch");
    assert!(
        patches
            .iter()
            .all(|e| e.object_ref.as_ref().is_some_and(|o| o.name == "probe")),
        "a crafted patch reached the API server: {patches:?}"
    );
    // Its own field manager is unmistakably the plugin's: `wcm:` and its name.
    for e in &patches {
        for (k, v) in query(e) {
            assert!(
                k != "force" && (k != "fieldManager" || v == "wcm:option-injection"),
                "patch with {k}={v}: {}",
                e.request_uri
            );
        }
    }
    assert!(
        patches.iter().any(|e| query(e)
            .iter()
            .any(|(k, v)| k == "fieldManager" && v == "wcm:option-injection")),
        "no patch under the plugin's own field manager: {patches:?}"
    );
    // One delete reached the API server, refused by its precondition (the body kept it whole),
    // and nothing was deleted or dry-run by a smuggled parameter.
    let deletes = calls("delete");
    assert!(
        !deletes.is_empty(),
        "the delete with a precondition never arrived"
    );
    for e in &deletes {
        assert_eq!(e.code(), Some(409), "{e:?}");
        assert!(query(e).is_empty(), "{}", e.request_uri);
    }
    let victim = cms.get("victim").await?;
    assert!(
        victim
            .metadata
            .labels
            .is_none_or(|l| !l.contains_key("touched")),
        "a crafted patch changed the victim"
    );
    // Besides ConfigMaps, only the host's own access reviews made as the plugin.
    let elsewhere: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| resource(e) != "configmaps" && resource(e) != "selfsubjectaccessreviews")
        .collect();
    assert!(
        elsewhere.is_empty(),
        "the plugin reached another resource: {elsewhere:?}"
    );
    let invalid = metric(
        &manager,
        "wcm_invalid_host_calls_total",
        &[("plugin", "option-injection")],
    );
    // Seven a run (at least one run).
    assert!(invalid >= 7.0, "invalid calls counted: {invalid}");
    manager.stop().await;
    Ok(())
}
