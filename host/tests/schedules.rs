//! Contract 0.3 schedules against the real cluster: a `*/1 * * * *` schedule reconciles its key
//! once a minute on the leading replica only (two replicas; counted by the API server's stored
//! count and by the replicas' tick metrics), and after a time with no replica running, the latest
//! missed tick is caught up once on restart (the catch-up rule, across a restart).

mod common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use wasm_controller_manager::cluster::leader::LeaderSettings;

const PLUGIN: &str = "schedule-probe";

fn settings(ns: &str, identity: &str) -> LeaderSettings {
    LeaderSettings {
        lease_name: "wcm-schedules-test".into(),
        namespace: ns.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_millis(500),
    }
}

async fn ticks(cms: &Api<ConfigMap>) -> Result<u64> {
    let cm = cms.get("clock").await?;
    Ok(cm
        .metadata
        .annotations
        .unwrap_or_default()
        .get("wcm.test/ticks")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

fn ticked(m: &wasm_controller_manager::app::Manager, kind: &str) -> f64 {
    metric(
        m,
        "wcm_schedule_ticks_total",
        &[
            ("plugin", PLUGIN),
            ("schedule", "every-minute"),
            ("kind", kind),
        ],
    )
}

/// Sleeps until `offset` seconds past the next minute boundary.
async fn until_past_minute(offset: u64) {
    let now = Timestamp::now().as_second();
    let next = (now / 60 + 1) * 60 + offset as i64;
    tokio::time::sleep(Duration::from_secs((next - now).max(0) as u64)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_minute_schedule_runs_once_a_minute_on_the_leader_and_catches_up_after_downtime()
-> Result<()> {
    let env = testenv::TestEnv::shared().await?;
    let client = env.client().await?;
    let ns = env.namespace("schedules").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "clock",
        "labels": {"wcm.test/schedule": "yes"}}}))?;
    cms.create(&PostParams::default(), &cm).await?;

    let dir = temp_dir("schedules")?;
    install(&dir, PLUGIN, "schedule-probe.wasm")?;
    let start = |identity: &str| {
        let mut cfg = test_config(&dir);
        cfg.leader_election = Some(settings(&ns.name, identity));
        start_manager(cfg)
    };
    let a = start("replica-a").await?;
    let b = start("replica-b").await?;

    // Two ticks pass (at most ~2 minutes), then one more minute: one write per tick, made by
    // the leader only.
    let two = eventually("two ticks run", Duration::from_secs(150), || async {
        let n = ticks(&cms).await?;
        Ok((n >= 2).then_some(n))
    })
    .await?;
    assert_eq!(two, 2, "a tick ran twice");
    until_past_minute(20).await;
    let three = ticks(&cms).await?;
    assert_eq!(three, 3, "one write per tick");
    let (ta, tb) = (ticked(&a, "tick"), ticked(&b, "tick"));
    assert_eq!(ta + tb, 3.0, "ticks fired: a {ta}, b {tb}");
    assert!(
        ta == 0.0 || tb == 0.0,
        "both replicas fired ticks: a {ta}, b {tb}"
    );
    let (_, debug) = http_get(if ta > 0.0 { &a } else { &b }, "/debug/controllers").await?;
    assert!(
        debug.contains("every-minute") && debug.contains("nextTick"),
        "{debug}"
    );

    // Nothing runs across a minute boundary: on restart, that one missed tick runs once, at
    // once (well before the next boundary), and counts as a catch-up.
    a.stop().await;
    b.stop().await;
    until_past_minute(5).await;
    let before = ticks(&cms).await?;
    assert_eq!(before, 3, "a tick ran while no replica did");
    let c = start("replica-c").await?;
    let started = std::time::Instant::now();
    // Within a lease duration (the stopped leader's Lease), the plugin's start and one reconcile.
    let caught = eventually(
        "the missed tick caught up",
        Duration::from_secs(40),
        || async { Ok((ticks(&cms).await? == before + 1).then_some(())) },
    )
    .await;
    if let Err(e) = caught {
        let (_, plugins) = http_get(&c, "/plugins").await?;
        let (_, debug) = http_get(&c, "/debug/controllers").await?;
        anyhow::bail!(
            "{e}: ticks {} (before {before}), catch-ups fired {}, ticks fired {}; plugins {plugins}; controllers {debug}",
            ticks(&cms).await?,
            ticked(&c, "catch-up"),
            ticked(&c, "tick")
        );
    }
    println!("caught up {:?} after replica-c started", started.elapsed());
    assert_eq!(ticked(&c, "catch-up"), 1.0);
    assert_eq!(
        ticked(&c, "tick"),
        0.0,
        "the catch-up came from a regular tick"
    );
    // And only once: until the next boundary, nothing more.
    let now = Timestamp::now().as_second() % 60;
    assert!(
        now < 50,
        "the check ran late in the minute ({now} s): timing too tight to judge"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ticks(&cms).await?, before + 1, "the catch-up ran twice");
    c.stop().await;
    Ok(())
}
