//! The network plugin against the real OpenStack Neutron API server and Keystone (installed from
//! PyPI, on loopback, SQLite), and the real kube-apiserver. Neutron's state is read back from
//! Neutron's own API, and what reached Neutron is counted from its own request log.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use testenv::OpenStack;
use testenv::openstack_api::http;
use wasm_controller_manager::app::Manager;

fn networks_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn network(name: &str, cidr: &str, gateway: &str) -> Value {
    json!({
        "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
        "metadata": {"name": name},
        "spec": {"cidr": cidr, "gateway": gateway},
    })
}

fn tagged(os: &OpenStack, token: &str, uid: &str) -> Result<Vec<Value>> {
    let body = os.neutron_get(token, &format!("networks?tags=k8s-uid-{uid}"))?;
    Ok(body["networks"].as_array().cloned().unwrap_or_default())
}

fn subnets(os: &OpenStack, token: &str, network_id: &str) -> Result<Vec<Value>> {
    let body = os.neutron_get(token, &format!("subnets?network_id={network_id}"))?;
    Ok(body["subnets"].as_array().cloned().unwrap_or_default())
}

/// The reasons of the events about the object `name`.
async fn event_reasons(
    events: &Api<k8s_openapi::api::events::v1::Event>,
    name: &str,
) -> Result<Vec<String>> {
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect())
}

fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn condition_is(obj: &DynamicObject, type_: &str, status: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == status)
}

/// Waits until the Network satisfies `ok`.
async fn wait_network(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let last = std::sync::Mutex::new(None);
    let result = eventually(what, timeout, || async {
        let n = api.get(name).await?;
        let done = ok(&n);
        *last.lock().expect("not poisoned") = Some(n.clone());
        Ok(done.then_some(n))
    })
    .await;
    result.with_context(|| {
        let last = last.lock().expect("not poisoned").take();
        format!(
            "last seen: metadata {:?}, status {}",
            last.as_ref().map(|n| &n.metadata),
            last.as_ref()
                .map_or(Value::Null, |n| n.data["status"].clone())
        )
    })
}

fn is_ready_for(n: &DynamicObject) -> bool {
    condition_is(n, "Ready", "True")
        && n.data["status"]["observedGeneration"] == json!(n.metadata.generation)
}

/// The plugin's directory: network.wasm and its NAME.toml pointing at this OpenStack, with its
/// credentials in a Secret of `ns`.
async fn install_network(
    dir: &Path,
    os: &OpenStack,
    ns: &str,
    client: &kube::Client,
) -> Result<()> {
    os.configure_network_plugin(client, ns, dir, "").await?;
    install(dir, "network", "network.wasm")?;
    Ok(())
}

/// The tokens Keystone issued so far, but for those of Neutron's own service user (keystoneauth
/// asks for them with `nocatalog`; the plugin and the test never do).
fn token_requests(os: &OpenStack) -> Result<usize> {
    Ok(os
        .keystone_requests()?
        .iter()
        .filter(|r| {
            r.method == "POST" && r.path.ends_with("/auth/tokens") && !r.query.contains("nocatalog")
        })
        .count())
}

fn network_config(dir: &Path) -> wasm_controller_manager::app::RunConfig {
    let mut cfg = test_config(dir);
    // Neutron answers in tens of milliseconds; a slow request is not the guest's CPU.
    cfg.limits.cpu_deadline = Duration::from_secs(1);
    // Retries reach a recovered Neutron within seconds.
    cfg.rate_limits.max_delay = Duration::from_secs(3);
    cfg
}

/// Create, change the gateway, change the CIDR, delete: Neutron matches each time; an invalid
/// spec never reaches Neutron; the plugin's own status writes do not wake it; one token serves
/// every reconcile of a worker.
/// One test, the scenarios in turn: each runs a manager of its own, and a manager's network plugin
/// reconciles every Network in the cluster (two at once would both act on each other's objects).
#[tokio::test(flavor = "multi_thread")]
async fn the_network_plugin_against_real_neutron_and_keystone() -> Result<()> {
    let os = OpenStack::start().await?;
    networks_follow_their_spec_in_neutron(&os).await?;
    restarts_and_outages_converge_without_duplicates(&os).await?;
    rotated_credentials_are_picked_up_without_a_restart(&os).await?;
    a_host_killed_mid_burst_leaves_no_duplicates(&os).await?;
    a_reconcile_recorded_against_neutron_replays_offline(&os).await
}

/// The reconcile that created a network, recorded against the real Neutron and Keystone (HTTP
/// included), replays offline to the same calls and result; no credential is in the file.
async fn a_reconcile_recorded_against_neutron_replays_offline(os: &OpenStack) -> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("net-replay").await?;
    let dir = temp_dir("network-replay")?;
    install_network(&dir, os, &ns.name, &client).await?;
    // A fresh instance per call, so each recording holds all the plugin used (its token too).
    let toml = dir.join("network.toml");
    let settings = std::fs::read_to_string(&toml)?;
    anyhow::ensure!(settings.contains("isolation = \"worker\""), "{settings}");
    std::fs::write(
        &toml,
        settings.replace("isolation = \"worker\"", "isolation = \"call\""),
    )?;
    let records = temp_dir("network-records")?;
    let mut cfg = network_config(&dir);
    cfg.record = Some((
        records.clone(),
        wasm_controller_manager::sandbox::tape::RecordWhat::All,
    ));
    let manager = start_manager(cfg).await?;
    let api = networks_api(&client, &ns.name);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(network("teal", "10.60.0.0/24", "10.60.0.1"))?,
    )
    .await?;
    wait_network(
        &api,
        "teal",
        "teal Ready",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    manager.stop().await;

    // The recording whose HTTP created the network in Neutron (written off the async threads
    // after its reconcile: waited for, not read once).
    let file = eventually(
        "a recording of the reconcile that created the network",
        Duration::from_secs(30),
        || async { recording_creating_network(&records.join("network"), &ns.name, "teal") },
    )
    .await?;
    let raw = std::fs::read_to_string(&file)?;
    let info = os.info();
    assert!(
        !raw.contains(&info.application_credential_secret),
        "a credential reached the recording"
    );
    let text = replay_offline(&file, &dir.join("network.wasm"))?;
    assert!(text.contains("http.request"), "{text}");
    assert!(text.contains("same calls and result as recorded"), "{text}");
    Ok(())
}

async fn networks_follow_their_spec_in_neutron(os: &OpenStack) -> Result<()> {
    let info = os.info().clone();
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("net").await?;
    let dir = temp_dir("network")?;
    // One worker: its instance (in the plugin's own slot of the pool) serves every reconcile, so
    // the tokens can be told from one per reconcile.
    os.configure_network_plugin(&client, &ns.name, &dir, "workers = 1\n")
        .await?;
    install(&dir, "network", "network.wasm")?;
    let tokens_before = token_requests(os)?;
    let manager = start_manager(network_config(&dir)).await?;
    let token = os.user_token()?;
    let api = networks_api(&client, &ns.name);

    // Create.
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(network("blue", "10.20.0.0/24", "10.20.0.1"))?,
        )
        .await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let n = wait_network(
        &api,
        "blue",
        "blue Ready",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    let nets = tagged(os, &token, &uid)?;
    assert_eq!(nets.len(), 1, "{nets:?}");
    let net_id = nets[0]["id"].as_str().context("id")?.to_string();
    assert_eq!(n.data["status"]["networkId"], json!(net_id));
    assert_eq!(nets[0]["name"], json!(format!("{}/blue", ns.name)));
    let subs = subnets(os, &token, &net_id)?;
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0]["cidr"], "10.20.0.0/24");
    assert_eq!(subs[0]["gateway_ip"], "10.20.0.1");
    assert_eq!(n.data["status"]["subnetId"], subs[0]["id"]);
    assert!(
        n.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == "samplecrd.k8s.io/neutron"))
    );

    // Steady state: the status write did not wake the plugin again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let filtered = metric(
        &manager,
        "wcm_changes_filtered_total",
        &[("controller", "network")],
    );
    assert!(
        filtered >= 1.0,
        "its status writes were not filtered: {filtered}"
    );
    let writes_before = os
        .neutron_requests()?
        .iter()
        .filter(|r| r.method != "GET")
        .count();

    // Gateway into the old allocation pool: moved with the pools.
    let patch = PatchParams::default();
    api.patch(
        "blue",
        &patch,
        &Patch::Merge(json!({"spec": {"gateway": "10.20.0.100"}})),
    )
    .await?;
    wait_network(
        &api,
        "blue",
        "blue Ready at generation 2",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    let subs = subnets(os, &token, &net_id)?;
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0]["gateway_ip"], "10.20.0.100");
    let pools = &subs[0]["allocation_pools"];
    assert_eq!(
        pools,
        &json!([{"start": "10.20.0.1", "end": "10.20.0.99"}, {"start": "10.20.0.101", "end": "10.20.0.254"}]),
        "the pools leave the gateway out"
    );

    // CIDR: the subnet is replaced, in the same network.
    api.patch(
        "blue",
        &patch,
        &Patch::Merge(json!({"spec": {"cidr": "10.21.0.0/16", "gateway": "10.21.0.1"}})),
    )
    .await?;
    let n = wait_network(
        &api,
        "blue",
        "blue Ready at generation 3",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    let subs = subnets(os, &token, &net_id)?;
    assert_eq!(subs.len(), 1, "{subs:?}");
    assert_eq!(subs[0]["cidr"], "10.21.0.0/16");
    assert_eq!(n.data["status"]["subnetId"], subs[0]["id"]);
    assert_eq!(tagged(os, &token, &uid)?.len(), 1);
    let writes_after = os
        .neutron_requests()?
        .iter()
        .filter(|r| r.method != "GET")
        .count();
    // PUT (gateway), DELETE + POST (subnet): nothing more.
    assert_eq!(
        writes_after - writes_before,
        3,
        "Neutron writes for two spec changes"
    );

    // An invalid spec: Invalid, a Warning event, and not one request to Neutron.
    let before = os.neutron_requests()?.len();
    api.create(
        &PostParams::default(),
        &serde_json::from_value(network("bad-gw", "10.30.0.0/24", "10.31.0.1"))?,
    )
    .await?;
    let bad = wait_network(
        &api,
        "bad-gw",
        "bad-gw Invalid",
        Duration::from_secs(30),
        |n| condition_is(n, "Invalid", "True"),
    )
    .await?;
    assert!(
        condition(&bad, "Invalid")
            .is_some_and(|c| c["message"].as_str().is_some_and(|m| m.contains("outside")))
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = os.neutron_requests()?;
    assert_eq!(
        after.len(),
        before,
        "Neutron saw requests for an invalid spec: {:?}",
        &after[before..]
    );
    // The schema refuses what is not a CIDR or an address at all.
    for (cidr, gw) in [
        ("10.0.0.0/33", "10.0.0.1"),
        ("10.0.0.0/24", "gateway"),
        ("", "10.0.0.1"),
    ] {
        let e = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(network("schema", cidr, gw))?,
            )
            .await
            .expect_err("refused by the schema");
        assert!(
            matches!(&e, kube::Error::Api(s) if s.code == 422),
            "{cidr} {gw}: {e}"
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    let reasons = eventually("the InvalidSpec event", Duration::from_secs(30), || async {
        let reasons = event_reasons(&events, "bad-gw").await?;
        Ok(reasons
            .iter()
            .any(|r| r == "InvalidSpec")
            .then_some(reasons))
    })
    .await?;
    // Not retried: an invalid spec is not reconciled again until it changes.
    let reconciles = |m: &Manager| {
        metric(
            m,
            "controller_runtime_reconcile_total",
            &[("controller", "network")],
        )
    };
    let quiet_from = reconciles(&manager);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        reconciles(&manager),
        quiet_from,
        "reconciles while nothing changed"
    );
    assert_eq!(
        reasons.iter().filter(|r| *r == "InvalidSpec").count(),
        1,
        "{reasons:?}"
    );

    // Delete: subnet and network go from Neutron, then the object.
    api.delete("blue", &DeleteParams::default()).await?;
    eventually("blue gone", Duration::from_secs(60), || async {
        Ok(api.get_opt("blue").await?.is_none().then_some(()))
    })
    .await?;
    // Each step said what it did.
    let wanted = [
        "NetworkCreated",
        "SubnetCreated",
        "GatewayChanged",
        "SubnetReplaced",
        "NetworkDeleted",
    ];
    eventually("blue's events", Duration::from_secs(30), || async {
        let reasons = event_reasons(&events, "blue").await?;
        Ok(wanted
            .iter()
            .all(|w| reasons.iter().any(|r| r == w))
            .then_some(()))
    })
    .await
    .context(format!(
        "events of blue: {:?}",
        event_reasons(&events, "blue").await.ok()
    ))?;
    assert!(tagged(os, &token, &uid)?.is_empty());
    let gone = http(
        &format!("{}/v2.0/networks/{net_id}", info.neutron_url),
        "GET",
        Some(&token),
        None,
    )?;
    assert_eq!(gone.status, 404);

    // One token per instance, not one per reconcile. A worker's instance is made again after a
    // trap or a broken limit, after 10,000 calls, and after its worker idled 5 s on a shared slot
    // of the instance pool, so the bound is the instances made; with one worker those are far
    // fewer than the reconciles, so a token per reconcile would break it.
    let reconciles = metric(
        &manager,
        "controller_runtime_reconcile_total",
        &[("controller", "network")],
    );
    let instances = metric(
        &manager,
        "wcm_plugin_instances_total",
        &[("name", "network")],
    );
    // Since the manager started: the plugin's and the test's own (`user_token`). The plugin
    // takes a new token once after a 401 from Neutron (none is expected here).
    let tokens = token_requests(os)? - tokens_before;
    let refused = os
        .neutron_requests()?
        .iter()
        .filter(|r| r.status == 401)
        .count();
    let said = format!(
        "{tokens} tokens for {instances} instances, {refused} answers 401 and {reconciles} reconciles"
    );
    assert!(tokens as f64 <= instances + refused as f64 + 1.0, "{said}");
    assert!(instances >= 1.0 && reconciles >= instances + 4.0, "{said}");
    manager.stop().await;
    Ok(())
}

/// The state a host killed between the network create and the subnet create leaves behind (a
/// network not yet tagged, without a subnet), then Neutron down for a minute, then a Network deleted while
/// the host is down: each converges with no duplicate and nothing left behind.
async fn restarts_and_outages_converge_without_duplicates(os: &OpenStack) -> Result<()> {
    let info = os.info().clone();
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("net-faults").await?;
    let dir = temp_dir("network-faults")?;
    install_network(&dir, os, &ns.name, &client).await?;
    let token = os.user_token()?;
    let api = networks_api(&client, &ns.name);

    // Host down: a Network exists, and its network was created in Neutron just before a crash.
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(network("green", "10.40.0.0/24", "10.40.0.1"))?,
        )
        .await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let answer = http(
        &format!("{}/v2.0/networks", info.neutron_url),
        "POST",
        Some(&token),
        // As the plugin creates it: described by its tag, which is added only after the create.
        Some(&json!({"network": {
            "name": format!("{}/green", ns.name),
            "description": format!("k8s-uid-{uid}"),
        }})),
    )?;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let orphan = answer.body["network"]["id"]
        .as_str()
        .context("id")?
        .to_string();

    let manager = start_manager(network_config(&dir)).await?;
    let n = wait_network(
        &api,
        "green",
        "green Ready",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    let nets = tagged(os, &token, &uid)?;
    let all = os.neutron_get(&token, "networks")?;
    assert_eq!(nets.len(), 1, "one network, tagged: {nets:?}; all: {all}");
    assert_eq!(
        n.data["status"]["networkId"],
        json!(orphan),
        "the existing network was adopted"
    );
    assert_eq!(subnets(os, &token, &orphan)?.len(), 1);

    // Neutron down for a minute while a Network is created: Synced=False, then Ready after.
    os.stop_neutron()?;
    api.create(
        &PostParams::default(),
        &serde_json::from_value(network("amber", "10.50.0.0/24", "10.50.0.1"))?,
    )
    .await?;
    let down = wait_network(
        &api,
        "amber",
        "amber not Synced",
        Duration::from_secs(30),
        |n| condition_is(n, "Synced", "False"),
    )
    .await?;
    let reason = condition(&down, "Synced").map(|c| c["reason"].clone());
    assert_eq!(reason, Some(json!("NeutronUnavailable")), "{down:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    os.start_neutron()?;
    let returned = std::time::Instant::now();
    let amber = wait_network(
        &api,
        "amber",
        "amber Ready after Neutron returned",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    eprintln!(
        "amber Ready {:?} after Neutron returned",
        returned.elapsed()
    );
    let amber_uid = amber.metadata.uid.clone().context("uid")?;
    assert_eq!(tagged(os, &token, &amber_uid)?.len(), 1);

    // Host down while a Network is deleted: the finalizer holds it; the returning host cleans up.
    manager.stop().await;
    api.delete("green", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        api.get_opt("green").await?.is_some(),
        "the finalizer holds it while the host is down"
    );
    assert_eq!(tagged(os, &token, &uid)?.len(), 1);
    let manager = start_manager(network_config(&dir)).await?;
    eventually("green gone", Duration::from_secs(60), || async {
        Ok(api.get_opt("green").await?.is_none().then_some(()))
    })
    .await?;
    assert!(
        tagged(os, &token, &uid)?.is_empty(),
        "its Neutron network was deleted"
    );
    manager.stop().await;
    Ok(())
}

/// Credentials: a wrong secret in the Secret → AuthenticationFailed; the right one put back →
/// Ready again, without a restart (the Secret is read again at each rescan).
async fn rotated_credentials_are_picked_up_without_a_restart(os: &OpenStack) -> Result<()> {
    let info = os.info().clone();
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("net-creds").await?;
    let dir = temp_dir("network-creds")?;
    install_network(&dir, os, &ns.name, &client).await?;
    let manager: Manager = start_manager(network_config(&dir)).await?;
    let api = networks_api(&client, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);

    secrets
        .patch(
            "openstack",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"secret": "wrong"}})),
        )
        .await?;
    // A rescan (2 s in tests) reloads the plugin with the new value.
    tokio::time::sleep(Duration::from_secs(5)).await;
    api.create(
        &PostParams::default(),
        &serde_json::from_value(network("teal", "10.60.0.0/24", "10.60.0.1"))?,
    )
    .await?;
    let failed = wait_network(
        &api,
        "teal",
        "teal AuthenticationFailed",
        Duration::from_secs(30),
        |n| condition(n, "Synced").is_some_and(|c| c["reason"] == "AuthenticationFailed"),
    )
    .await?;
    assert!(!condition_is(&failed, "Ready", "True"));
    secrets
        .patch(
            "openstack",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"secret": info.application_credential_secret}})),
        )
        .await?;
    wait_network(
        &api,
        "teal",
        "teal Ready with the restored credential",
        Duration::from_secs(60),
        is_ready_for,
    )
    .await?;
    manager.stop().await;
    Ok(())
}

/// The real binary, killed with SIGKILL while it is creating Networks in Neutron, then started
/// again: every Network ends with exactly one Neutron network, tagged, with exactly one subnet.
async fn a_host_killed_mid_burst_leaves_no_duplicates(os: &OpenStack) -> Result<()> {
    const N: usize = 30;
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("net-kill").await?;
    let dir = temp_dir("network-kill")?;
    install_network(&dir, os, &ns.name, &client).await?;
    grant_dir(&dir).await?;
    let token = os.user_token()?;
    let api = networks_api(&client, &ns.name);
    let mut uids = Vec::new();
    for i in 0..N {
        let n = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(network(
                    &format!("k{i}"),
                    &format!("10.70.{i}.0/24"),
                    &format!("10.70.{i}.1"),
                ))?,
            )
            .await?;
        uids.push(n.metadata.uid.context("uid")?);
    }
    let kubeconfig = env.kubeconfig_path().context("kubeconfig")?.to_path_buf();
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_wasm-controller-manager"))
            .arg("run")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--plugins-dir")
            .arg(&dir)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
    };
    let creates = |os: &OpenStack| -> Result<usize> {
        Ok(os
            .neutron_requests()?
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/v2.0/networks")
            .count())
    };
    let before = creates(os)?;
    let mut first = spawn()?;
    eventually(
        "the first host creating networks",
        Duration::from_secs(60),
        || async { Ok((creates(os)? >= before + N / 3).then_some(())) },
    )
    .await?;
    // SIGKILL: no cleanup, whatever was in flight stays half done.
    first.kill()?;
    first.wait()?;
    let complete = |uid: &str| -> Result<bool> {
        let nets = tagged(os, &token, uid)?;
        Ok(nets.len() == 1
            && subnets(os, &token, nets[0]["id"].as_str().unwrap_or_default())?.len() == 1)
    };
    let mut half_done = 0;
    for uid in &uids {
        if !complete(uid)? {
            half_done += 1;
        }
    }
    eprintln!("killed with {half_done} of {N} Networks not yet complete in Neutron");

    let mut second = spawn()?;
    let all_ready = eventually(
        "every Network Ready after the restart",
        Duration::from_secs(180),
        || async {
            let list = api.list(&Default::default()).await?;
            Ok((list
                .items
                .iter()
                .filter(|n| condition_is(n, "Ready", "True"))
                .count()
                == N)
                .then_some(()))
        },
    )
    .await;
    second.kill()?;
    second.wait()?;
    all_ready?;
    for uid in &uids {
        let marker = format!("k8s-uid-{uid}");
        let by_tag = tagged(os, &token, uid)?;
        let by_description = os.neutron_get(&token, &format!("networks?description={marker}"))?;
        let by_description = by_description["networks"].as_array().map_or(0, Vec::len);
        assert_eq!(by_tag.len(), 1, "{uid}: {by_tag:?}");
        assert_eq!(by_description, 1, "{uid}: a duplicate network");
        let net_id = by_tag[0]["id"].as_str().context("id")?;
        assert_eq!(subnets(os, &token, net_id)?.len(), 1, "{uid}: subnets");
    }
    Ok(())
}
