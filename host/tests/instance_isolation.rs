//! A fresh instance per call carries nothing over from earlier calls: what one call wrote to its
//! linear memory (statics, pages it grew) is gone in the next, whichever way pooled memories are
//! reset. No cluster is needed: the calls go straight to the sandbox.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use wasm_controller_manager::cluster::services::Services;
use wasm_controller_manager::contract::{Action, ObjectKey, Request};
use wasm_controller_manager::sandbox::{Limits, MemoryReset, Runtime, RuntimeSettings};

fn request() -> Request {
    Request {
        key: ObjectKey {
            namespace: Some("default".into()),
            name: "probe".into(),
        },
        object: None,
        attempt: 0,
        scheduled: None,
    }
}

fn runtime(reset: MemoryReset) -> Result<Runtime> {
    Runtime::new(RuntimeSettings {
        max_instances: 4,
        memory_reset: reset,
        ..RuntimeSettings::default()
    })
}

#[tokio::test]
async fn no_call_sees_what_an_earlier_call_wrote_to_its_memory() -> Result<()> {
    let wasm = std::fs::read(common::plugin("state-probe")?)?;
    for reset in [MemoryReset::Auto, MemoryReset::Memset] {
        let runtime = runtime(reset)?;
        if reset == MemoryReset::Auto && MemoryReset::Auto.resolve().is_ok() {
            // Where the scan can be used, it is: this test then covers it.
            assert!(
                runtime.memory_reset().starts_with("written pages only"),
                "{}",
                runtime.memory_reset()
            );
        }
        let compiled = runtime.compile(&wasm)?;
        let services = Arc::new(Services::for_describe("state-probe", BTreeMap::new()));
        let limits = Limits::default();
        // More calls than pool slots, so slots are reused many times over.
        for call in 0..200 {
            let result = runtime
                .reconcile(&compiled, services.clone(), &limits, &request())
                .await;
            assert!(
                matches!(result, Ok(Ok(Action::Done))),
                "{reset:?}, call {call}: {result:?} ({})",
                runtime.memory_reset()
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_probe_sees_state_that_a_reused_instance_carries_over() -> Result<()> {
    let wasm = std::fs::read(common::plugin("state-probe")?)?;
    let runtime = runtime(MemoryReset::Auto)?;
    let compiled = runtime.compile(&wasm)?;
    let services = Arc::new(Services::for_describe("state-probe", BTreeMap::new()));
    let limits = Limits::default();
    let mut warm = None;
    let first = runtime
        .reconcile_warm(&compiled, services.clone(), &limits, &request(), &mut warm)
        .await;
    assert!(matches!(first, Ok(Ok(Action::Done))), "{first:?}");
    let second = runtime
        .reconcile_warm(&compiled, services.clone(), &limits, &request(), &mut warm)
        .await;
    match second {
        Ok(Err(e)) => assert!(
            e.terminal && e.message.contains("CALLS = 1"),
            "{}",
            e.message
        ),
        other => panic!("a reused instance's second call passed the probe: {other:?}"),
    }
    Ok(())
}
