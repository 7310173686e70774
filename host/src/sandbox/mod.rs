//! The component runtime: one wasmtime engine, components compiled once (with an on-disk cache of
//! precompiled artifacts), and a fresh instance per call from a pre-linked `InstancePre`, under
//! per-call limits.
//!
//! A fresh instance per reconcile is the isolation default: no state leaks from one key to the next,
//! and a trap never poisons later calls. Its cost is measured in docs/benchmarks.md.

mod call_ctx;
mod children;
mod compile_cache;
mod compile_worker;
pub mod compiler;
pub mod dns;
mod guest_clock;
mod host_calls;
mod host_calls_v0_1;
mod host_calls_v0_2;
pub mod http;
pub mod pool;
pub mod recorder;
pub mod redact;
pub mod tape;
mod versions;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap,
};

use crate::contract::{self as bindings, Action, Description, ReconcileError, Request};
pub use call_ctx::{CallCtx, Limits};
pub use compile_cache::sha256_hex;
pub use pool::{InstancePool, InstanceSlot, PluginShare, PoolUse};
use tape::{Tape, Tapes};

use crate::cluster::services::Services;

/// How often the epoch ticks; CPU deadlines are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The longest `describe` waits for an instance slot; past it the file waits and is tried again.
const DESCRIBE_SLOT_WAIT: Duration = Duration::from_secs(2);

/// Engine-wide settings.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Where precompiled components are kept (`None`: compile every time).
    pub compile_cache: Option<PathBuf>,
    /// The compile cache's bound (`--compile-cache-max-mb`).
    pub compile_cache_max_bytes: u64,
    /// Component instances that may exist at once across all plugins (the pooling allocator's
    /// size; shared out by `pool::InstancePool`).
    pub max_instances: u32,
    /// The largest linear memory any plugin may be given.
    pub max_memory: usize,
    /// Bytes of each pooled linear memory kept resident (reset in place, not madvise) between
    /// instances: a fresh instance then starts on warm pages instead of page-faulting its heap.
    pub keep_resident: usize,
    /// How a pooled memory is put back to its initial contents after an instance.
    pub memory_reset: MemoryReset,
    /// Compile in a child process of this binary, within its bounds (`compiler.rs`); `None`:
    /// compile in this process. The default is the process's (`compiler::process_default`: the
    /// binary sets it, a library user compiles in its own process).
    pub child_compile: Option<compiler::ChildCompile>,
}

/// How the kept-resident part of a linear memory is reset between instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MemoryReset {
    /// Only the pages the instance wrote (Linux's PAGEMAP_SCAN), when the kernel has it (≥ 6.7)
    /// and no page of this process can be swapped out; otherwise `memset`.
    #[default]
    Auto,
    /// The first `keep_resident` bytes, written back whole whether the instance touched them or not.
    Memset,
}

impl MemoryReset {
    /// Whether written pages are found by scanning, with the reason when they are not.
    ///
    /// A written page that the kernel swapped out is not "present", so the scan would miss it and
    /// the next instance would read the previous one's data: the scan is used only where no page
    /// can be swapped (no swap device, or a cgroup with `memory.swap.max` 0, as a Guaranteed Pod
    /// gets under Kubernetes' LimitedSwap).
    pub fn resolve(self) -> Result<(), String> {
        if self == MemoryReset::Memset {
            return Err("--memory-reset=memset".into());
        }
        if !kernel_has_pagemap_scan() {
            return Err("the kernel predates PAGEMAP_SCAN (Linux 6.7)".into());
        }
        if swap_may_be_used() {
            return Err("swap is on and this process's cgroup may use it".into());
        }
        Ok(())
    }
}

fn kernel_has_pagemap_scan() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    matches!((major, minor), (Some(a), Some(b)) if (a, b) >= (6, 7))
}

/// True unless it is known that no page of this process can be swapped out. Unreadable files
/// count as "may swap".
fn swap_may_be_used() -> bool {
    let Ok(swaps) = std::fs::read_to_string("/proc/swaps") else {
        return true;
    };
    // The first line is the header.
    if swaps.lines().skip(1).all(|l| l.trim().is_empty()) {
        return false;
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    // cgroup v2: "0::/path".
    let Some(path) = cgroup.lines().find_map(|l| l.strip_prefix("0::")) else {
        return true;
    };
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.swap.max", path.trim()));
    max.map_or(true, |m| m.trim() != "0")
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            compile_cache: None,
            compile_cache_max_bytes: 192 << 20,
            max_instances: 128,
            max_memory: 256 << 20,
            keep_resident: 2 << 20,
            memory_reset: MemoryReset::Auto,
            child_compile: compiler::process_default(),
        }
    }
}

/// What decides the compiled code, and so the engine's compatibility hash: shared by the runtime
/// and the compile child (`compiler.rs`), which refuses to compile when the hashes differ.
pub(crate) fn code_config() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config
}

/// The engine and the linker with every host function.
pub struct Runtime {
    engine: Engine,
    linker: Linker<CallCtx>,
    settings: RuntimeSettings,
    ticker: Arc<Ticker>,
    /// Whether pooled memories are reset by scanning for written pages (else: memset).
    pagemap_reset: Result<(), String>,
    /// Who may hold which of the pool's component-instance slots.
    pool: Arc<InstancePool>,
}

/// A compiled plugin, ready to instantiate.
pub struct Compiled {
    pre: versions::PluginPre,
    pub sha256: String,
    pub size: usize,
    /// Time to compile, or to load the precompiled artifact.
    pub load_time: Duration,
    pub from_cache: bool,
    /// Peak RSS of the compile, bytes, when a child process compiled it.
    pub compile_peak: Option<u64>,
    pub component: Component,
}

impl Compiled {
    /// The contract version the plugin was built against (`wcm:reconciler@0.3.0`, ...).
    pub fn contract_version(&self) -> &'static str {
        self.pre.version()
    }
}

/// Why a call into a plugin failed (as opposed to the plugin returning an error).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("CPU deadline of {0:?} exceeded")]
    Deadline(Duration),
    #[error("memory limit exceeded: {0}")]
    Memory(String),
    #[error("plugin trapped: {0}")]
    Trap(String),
    #[error("plugin broke a limit: {0}")]
    Limit(String),
    #[error("could not instantiate: {0}")]
    Instantiate(String),
    /// No instance slot was free in time (the pool is shared out by `pool.rs`), or wasmtime's
    /// pool was exhausted: the call is tried again, never a fault of the file.
    #[error("no instance slot free: {0}")]
    PoolFull(String),
    #[error("call took longer than {0:?} (host calls included)")]
    WallTimeout(Duration),
}

impl Runtime {
    pub fn new(settings: RuntimeSettings) -> Result<Self> {
        let mut config = code_config();
        // One slot per concurrently live component instance, and for each slot room for a
        // component of the largest size allowed (pool.rs): only component-instance slots are
        // ever scarce, and those are shared out by `InstancePool`. A component over the
        // per-component caps is refused when compiled.
        let n = settings.max_instances.max(1);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(pool::MAX_CORE_INSTANCES))
            .total_memories(n.saturating_mul(pool::MAX_MEMORIES))
            .total_tables(n.saturating_mul(pool::MAX_TABLES))
            .max_core_instances_per_component(pool::MAX_CORE_INSTANCES)
            .max_memories_per_component(pool::MAX_MEMORIES)
            .max_tables_per_component(pool::MAX_TABLES)
            .total_stacks(n)
            .max_memory_size(settings.max_memory)
            .linear_memory_keep_resident(settings.keep_resident)
            .table_keep_resident(64 << 10);
        let pagemap_reset = settings.memory_reset.resolve();
        if pagemap_reset.is_ok() {
            // Resets only what an instance wrote: less work per call, and a slot keeps resident
            // only the pages its instances touch.
            pool.pagemap_scan(Enabled::Auto);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine =
            Engine::new(&config).map_err(|e| anyhow::anyhow!("create the wasm engine: {e:#}"))?;

        let mut linker = Linker::<CallCtx>::new(&engine);
        // WASI with nothing granted: no files, no environment, no sockets. Rust's wasip2 std imports
        // these interfaces even when the plugin never uses them.
        // Outbound HTTP, checked against each plugin's allow-list (sandbox/http.rs).
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("link wasi:http: {e:#}"))?;
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("link WASI: {e:#}"))?;
        // Every contract version served: a plugin imports the interfaces of the one it was built for.
        bindings::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("link host functions: {e:#}"))?;
        bindings::v0_2::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("link host functions of 0.2.0: {e:#}"))?;
        bindings::v0_1::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("link host functions of 0.1.0: {e:#}"))?;

        let ticker = Ticker::start(engine.clone())?;
        if let Some(dir) = &settings.compile_cache {
            // What compiles killed mid-write (the host stopped hard) left behind.
            let n = compile_cache::clean_stale_temporaries(dir);
            if n > 0 {
                tracing::info!(dir = %dir.display(), removed = n, "stale temporary files of killed compiles removed from the compile cache");
            }
        }
        Ok(Runtime {
            engine,
            linker,
            pool: InstancePool::new(n),
            settings,
            ticker,
            pagemap_reset,
        })
    }

    /// How pooled memories are reset between instances, for the start-up log.
    pub fn memory_reset(&self) -> String {
        match &self.pagemap_reset {
            // wasmtime falls back to memset by itself where the ioctl is refused at run time.
            Ok(()) => "written pages only (PAGEMAP_SCAN, where the kernel allows the scan)".into(),
            Err(why) => format!("memset of the kept-resident bytes ({why})"),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn settings(&self) -> &RuntimeSettings {
        &self.settings
    }

    /// The shares of the instance pool.
    /// Keeps the compile cache within its bound (`RuntimeSettings::compile_cache_max_bytes`),
    /// never removing the artifact of a component in `named`.
    pub fn trim_compile_cache(&self, named: &std::collections::HashSet<String>) {
        if let Some(dir) = &self.settings.compile_cache {
            let n = compile_cache::keep_within(dir, named, self.settings.compile_cache_max_bytes);
            if n > 0 {
                tracing::info!(dir = %dir.display(), removed = n, "compile cache over its bound: artifacts of components no plugin names removed");
            }
        }
    }

    pub fn pool(&self) -> &Arc<InstancePool> {
        &self.pool
    }

    /// Compiles (or loads from the cache) and links a component. Fails with a clear message for
    /// something that is not a component of the `plugin` world.
    pub fn compile(&self, wasm: &[u8]) -> Result<Compiled> {
        self.compile_cancellable(wasm, &compiler::CompileCancel::new())
    }

    /// `compile`, stopped (a compile child killed, or its wait for its turn given up) once `cancel`
    /// is set.
    pub fn compile_cancellable(
        &self,
        wasm: &[u8],
        cancel: &compiler::CompileCancel,
    ) -> Result<Compiled> {
        let started = Instant::now();
        let sha256 = compile_cache::sha256_hex(wasm);
        let loaded = compile_cache::load_or_compile(
            &self.engine,
            self.settings.compile_cache.as_deref(),
            &sha256,
            wasm,
            self.settings.child_compile.as_ref(),
            cancel,
        )
        .map_err(pool::too_large)?;
        let component = loaded.component;
        if let Some(peak) = loaded.compile_peak {
            tracing::info!(
                sha256 = %sha256,
                bytes = wasm.len(),
                millis = started.elapsed().as_millis() as u64,
                compile_peak_rss_mib = peak >> 20,
                "component compiled in a child process"
            );
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            anyhow::anyhow!(
                "not a plugin of world wcm:reconciler/plugin (@0.3.0, @0.2.0 or @0.1.0): {e:#}"
            )
        })?;
        let pre = versions::PluginPre::new(pre)?;
        Ok(Compiled {
            pre,
            sha256,
            size: wasm.len(),
            load_time: started.elapsed(),
            from_cache: loaded.from_cache,
            compile_peak: loaded.compile_peak,
            component,
        })
    }

    /// Calls `describe` in a fresh instance.
    pub async fn describe(
        &self,
        compiled: &Compiled,
        services: Arc<Services>,
        limits: &Limits,
    ) -> Result<Description, CallError> {
        // The loader describes at most `pool::DESCRIBE_SLOTS` files at once, so a slot kept for
        // `describe` is free unless the pool is smaller than that: it does not wait long for one (the
        // file waits and is tried again instead).
        let slot_wait = limits.wall_timeout.min(DESCRIBE_SLOT_WAIT);
        self.call(
            compiled,
            services,
            limits,
            slot_wait,
            None,
            async |plugin, store| plugin.describe(store).await,
        )
        .await
        .0
    }

    /// Calls `reconcile` in a fresh instance.
    pub async fn reconcile(
        &self,
        compiled: &Compiled,
        services: Arc<Services>,
        limits: &Limits,
        req: &Request,
    ) -> Result<Result<Action, ReconcileError>, CallError> {
        let tape = recording_tapes(&services);
        let started_at = std::time::SystemTime::now();
        let (result, tape) = self
            .call(
                compiled,
                services.clone(),
                limits,
                limits.wall_timeout,
                tape,
                async |plugin, store| {
                    store.data_mut().set_key(&req.key);
                    match plugin.reconcile(store, req).await? {
                        Ok(outcome) => store.data_mut().settle_children(req, outcome).await,
                        Err(e) => Ok(Err(e)),
                    }
                },
            )
            .await;
        save_recording(&services, compiled, req, tape, &result, started_at, false);
        result
    }

    /// Runs `reconcile` against a recording: every host call is answered from it, nothing reaches
    /// a cluster or the network. Returns the result and what the plugin did.
    pub async fn replay(
        &self,
        compiled: &Compiled,
        recording: &tape::Recording,
        limits: &Limits,
    ) -> (serde_json::Value, tape::Replay) {
        let services = Arc::new(Services::for_describe(
            &recording.plugin,
            Default::default(),
        ));
        let req = recording.request.to_request();
        let (result, tape) = self
            .call(
                compiled,
                services,
                limits,
                limits.wall_timeout,
                Some(Tapes::replaying(recording)),
                async |plugin, store| {
                    store.data_mut().set_key(&req.key);
                    match plugin.reconcile(store, &req).await? {
                        Ok(outcome) => store.data_mut().settle_children(&req, outcome).await,
                        Err(e) => Ok(Err(e)),
                    }
                },
            )
            .await;
        let (mut replay, http) = match tape {
            Some((calls, http, _)) => (
                calls.finish().unwrap_or_default(),
                http.finish().unwrap_or_default(),
            ),
            None => Default::default(),
        };
        replay.made.extend(http.made);
        replay.differences.extend(http.differences);
        (
            tape::result_json(&result, recording.free_text_withheld),
            replay,
        )
    }

    /// Instantiates in a fresh store and drops it, for benchmarks of the per-call price of
    /// isolation: returns the time to instantiate and the time to drop the store (which resets the
    /// instance's pooled memory for the next one).
    pub async fn instantiate_only(
        &self,
        compiled: &Compiled,
        services: Arc<Services>,
        limits: &Limits,
    ) -> Result<(Duration, Duration), CallError> {
        let mut store = self.new_store(services, limits);
        let running = self.ticker.running();
        let started = Instant::now();
        compiled
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| CallError::Instantiate(format!("{e:#}")))?;
        let instantiated = started.elapsed();
        drop(running);
        let started = Instant::now();
        drop(store);
        Ok((instantiated, started.elapsed()))
    }

    /// A store for one call, with its limits and CPU deadline set.
    fn new_store(&self, services: Arc<Services>, limits: &Limits) -> Store<CallCtx> {
        let mut store = Store::new(&self.engine, CallCtx::new(services, limits));
        store.limiter(|c| c.limiter());
        // Checked at every tick (below), not only when the deadline is due.
        store.set_epoch_deadline(1);
        // The deadline counts the guest's run time only (guest_clock.rs): time it waits on the
        // host, on outbound HTTP or after a yield is not its own.
        store.epoch_deadline_callback(move |mut ctx| {
            let (total, segment) = ctx.data_mut().tick();
            if total >= ctx.data().cpu_deadline {
                return Err(wasmtime::Error::from(Trap::Interrupt));
            }
            // The plugin's CPU share is charged as the guest runs, not when the call ends: at a
            // tick that finds the plugin in debt (its other calls included), this call rests until
            // the debt is paid. The rest is not guest time (the fiber is parked); the wall timeout
            // still runs.
            let budgets = &ctx.data().services.budgets;
            budgets.charge_cpu(segment);
            let rest = budgets.cpu_debt_wait();
            if !rest.is_zero() {
                return Ok(wasmtime::UpdateDeadline::YieldCustom(
                    1,
                    Box::pin(tokio::time::sleep(rest)),
                ));
            }
            // Yield to the async runtime after each tick of guest work, so a guest computing up to
            // its deadline never holds a runtime thread for long: informers, API calls, /healthz
            // and the other plugins keep running. A segment shorter than half a tick (the epoch
            // moved on while the guest was parked) continues instead, so the guest always progresses.
            if segment < EPOCH_TICK / 2 {
                return Ok(wasmtime::UpdateDeadline::Continue(1));
            }
            Ok(wasmtime::UpdateDeadline::Yield(1))
        });
        store
    }

    async fn call<R>(
        &self,
        compiled: &Compiled,
        services: Arc<Services>,
        limits: &Limits,
        slot_wait: Duration,
        tapes: Option<Tapes>,
        f: impl AsyncFnOnce(&versions::PluginInstance, &mut Store<CallCtx>) -> wasmtime::Result<R>,
    ) -> (Result<R, CallError>, Option<(Tape, Tape, Vec<u64>)>) {
        let plugin_name = services.plugin_name().to_string();
        services.budgets.cpu_turn().await;
        // Held for the instance's life (and dropped after the store): the plugin's own instance
        // budget, and a slot of the pool.
        let started = Instant::now();
        let (_permit, _slot) = match self.take_slot(&services, slot_wait).await {
            Ok(held) => held,
            Err(e) => return (Err(e), None),
        };
        let wall = limits.wall_timeout.saturating_sub(started.elapsed());
        let mut store = self.new_store(services.clone(), limits);
        store.data_mut().set_tapes(tapes);
        store.data_mut().set_deadline(Instant::now() + wall);
        if let Some(m) = services.metrics() {
            m.instantiated(&plugin_name);
        }
        let clock = store.data().clock.clone();
        let running = self.ticker.running();
        let result = tokio::time::timeout(
            wall,
            clock.meter(async {
                // Tests make wasmtime's pool look exhausted here, as another host's plugins could.
                #[cfg(feature = "failpoints")]
                fail::fail_point!("instantiate-pool-exhausted", |_| Err(CallError::PoolFull(
                    "maximum concurrent limit of 1 for component instances reached (injected)"
                        .into()
                )));
                let plugin = compiled
                    .pre
                    .instantiate_async(&mut store)
                    .await
                    .map_err(instantiate_error)?;
                f(&plugin, &mut store)
                    .await
                    .map_err(|e| classify(e, limits))
            }),
        )
        .await
        .unwrap_or(Err(CallError::WallTimeout(limits.wall_timeout)));
        drop(running);

        // The whole run counts, its part after the last tick too: most calls end before any tick.
        services.budgets.charge_cpu(store.data_mut().tick().1);
        let tapes = store.data_mut().take_tapes();
        (finish(&mut store, &plugin_name, result), tapes)
    }

    /// The plugin's instance budget (`max_instances`) and a slot of the pool (its own, else a
    /// shared one; `describe` has slots of its own), waiting at most `wait` for them.
    async fn take_slot(
        &self,
        services: &Services,
        wait: Duration,
    ) -> Result<(Option<tokio::sync::OwnedSemaphorePermit>, InstanceSlot), CallError> {
        let take = async {
            let permit = services.instance_permit().await;
            let slot = self.pool.slot(services.share.as_ref()).await;
            (permit, slot)
        };
        tokio::select! {
            taken = tokio::time::timeout(wait, take) => taken.map_err(|_| {
                let u = self.pool.usage();
                CallError::PoolFull(format!(
                    "waited {wait:?} for an instance slot: the plugin has its max_instances alive, or the pool has none for it (--max-instances {}: {} of {} shared slots in use, {} of {} describe's)",
                    u.total, u.shared_in_use, u.shared, u.describing, u.describe_slots
                ))
            }),
            // A stop or a swap does not wait for calls that have not started.
            () = services.retired() => Err(CallError::PoolFull(
                "the plugin version was stopped or replaced while the call waited for an instance slot".into(),
            )),
        }
    }

    /// Calls `reconcile` in the worker's warm instance, making one if there is none (opt-in
    /// `isolation = "worker"`): state may carry over between keys of one worker, so this is only
    /// for plugins that keep none. Any failure drops the instance; the next call starts fresh.
    pub async fn reconcile_warm(
        &self,
        compiled: &Compiled,
        services: Arc<Services>,
        limits: &Limits,
        req: &Request,
        slot: &mut Option<Warm>,
    ) -> Result<Result<Action, ReconcileError>, CallError> {
        let plugin_name = services.plugin_name().to_string();
        services.budgets.cpu_turn().await;
        let mut warm = match slot.take() {
            Some(w) => w,
            None => {
                let started = Instant::now();
                let (permit, pool_slot) = self.take_slot(&services, limits.wall_timeout).await?;
                let wall = limits.wall_timeout.saturating_sub(started.elapsed());
                let mut store = self.new_store(services.clone(), limits);
                if let Some(m) = services.metrics() {
                    m.instantiated(&plugin_name);
                }
                // Metered and timed like a call: a start function that spins meets the deadline.
                let clock = store.data().clock.clone();
                let running = self.ticker.running();
                let made = tokio::time::timeout(
                    wall,
                    clock.meter(compiled.pre.instantiate_async(&mut store)),
                )
                .await;
                drop(running);
                let plugin = match made {
                    Ok(Ok(p)) => p,
                    Ok(Err(e)) => {
                        let e = classify(e, limits);
                        services.budgets.charge_cpu(store.data_mut().tick().1);
                        return Err(match e {
                            CallError::Trap(t) => CallError::Instantiate(t),
                            other => other,
                        });
                    }
                    Err(_) => return Err(CallError::WallTimeout(limits.wall_timeout)),
                };
                services.budgets.charge_cpu(store.data_mut().tick().1);
                Warm {
                    store,
                    plugin,
                    calls: 0,
                    _permit: permit,
                    slot: pool_slot,
                }
            }
        };
        warm.store.data_mut().begin_call();
        warm.store.data_mut().set_key(&req.key);
        warm.store.data_mut().set_tapes(recording_tapes(&services));
        let started_at = std::time::SystemTime::now();
        let reused = warm.calls > 0;
        warm.store.set_epoch_deadline(1);
        let wall = limits.wall_timeout;
        warm.store.data_mut().set_deadline(Instant::now() + wall);
        let clock = warm.store.data().clock.clone();
        let running = self.ticker.running();
        let result = tokio::time::timeout(
            wall,
            clock.meter(async {
                let settled = match warm.plugin.reconcile(&mut warm.store, req).await {
                    Ok(Ok(outcome)) => warm.store.data_mut().settle_children(req, outcome).await,
                    Ok(Err(e)) => Ok(Err(e)),
                    Err(e) => Err(e),
                };
                settled.map_err(|e| classify(e, limits))
            }),
        )
        .await
        .unwrap_or(Err(CallError::WallTimeout(wall)));
        drop(running);
        services.budgets.charge_cpu(warm.store.data_mut().tick().1);
        let result = finish(&mut warm.store, &plugin_name, result);
        let tapes = warm.store.data_mut().take_tapes();
        save_recording(&services, compiled, req, tapes, &result, started_at, reused);
        warm.calls += 1;
        // Recycle now and then: bounded output buffers, and no heap grown without bound.
        let recycle =
            warm.calls >= MAX_WARM_CALLS || warm.store.data().output_len() > limits.max_output / 2;
        if result.is_ok() && !recycle {
            *slot = Some(warm);
        }
        result
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker.stop.store(true, Ordering::Relaxed);
        self.ticker.thread.unpark();
    }
}

/// The thread that moves the epoch on every tick, but only while some guest may be running: an
/// idle host does not wake 200 times a second.
struct Ticker {
    /// Calls in progress (instantiation included).
    running: AtomicUsize,
    stop: AtomicBool,
    thread: std::thread::Thread,
}

impl Ticker {
    fn start(engine: Engine) -> Result<Arc<Ticker>> {
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Ticker>>();
        let handle = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                let Ok(t) = rx.recv() else { return };
                while !t.stop.load(Ordering::Relaxed) {
                    if t.running.load(Ordering::Acquire) == 0 {
                        // An unpark between the load and here is kept as a token: no call is missed.
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .context("start the epoch thread")?;
        let ticker = Arc::new(Ticker {
            running: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            thread: handle.thread().clone(),
        });
        tx.send(ticker.clone())
            .map_err(|_| anyhow::anyhow!("the epoch thread ended at start"))?;
        Ok(ticker)
    }

    /// Marks a call as running until the guard is dropped; wakes the thread for the first one.
    fn running(&self) -> Running<'_> {
        if self.running.fetch_add(1, Ordering::AcqRel) == 0 {
            self.thread.unpark();
        }
        Running(self)
    }
}

struct Running<'a>(&'a Ticker);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Logs the guest's output and turns a failure into the most telling error.
fn finish<R>(
    store: &mut Store<CallCtx>,
    plugin: &str,
    result: Result<R, CallError>,
) -> Result<R, CallError> {
    let ctx = store.data_mut();
    let panic = if matches!(result, Err(CallError::Trap(_))) {
        ctx.panic_message()
    } else {
        None
    };
    ctx.flush_output(plugin);
    match (&result, ctx.limit_broken()) {
        (Err(_), Some(why)) => Err(CallError::Limit(why.to_string())),
        (Err(CallError::Trap(t)), None) => Err(CallError::Trap(with_panic_message(t, panic))),
        _ => result,
    }
}

/// The tapes of a reconcile when the plugin is recorded. A plugin holding a secret value too short
/// to redact is not recorded at all, so nothing of its exchanges is kept; one holding secrets has
/// its free text withheld.
fn recording_tapes(services: &Services) -> Option<Tapes> {
    let recorder = services.recorder.as_ref()?;
    let mut holds = false;
    for v in services.secret_values().filter(|v| !v.is_empty()) {
        if v.chars().count() < redact::MIN_SECRET_CHARS {
            recorder.refuse(services.plugin_name(), &redact::Unsafe::TooShort);
            return None;
        }
        holds = true;
    }
    Some(Tapes::recording(holds))
}

/// Writes the recording of a reconcile when the plugin's recorder wants it.
fn save_recording(
    services: &Services,
    compiled: &Compiled,
    req: &Request,
    tapes: Option<(Tape, Tape, Vec<u64>)>,
    result: &Result<Result<Action, ReconcileError>, CallError>,
    started_at: std::time::SystemTime,
    reused_instance: bool,
) {
    let (Some(recorder), Some((tape, http, clock))) = (services.recorder.as_ref(), tapes) else {
        return;
    };
    let failed = !matches!(result, Ok(Ok(_)));
    if !recorder.wants(failed) {
        return;
    }
    let withhold = tape.withholds_free_text();
    let (calls, calls_left_out, _) = tape.into_calls();
    let (http, http_left_out, credentials) = http.into_calls();
    // The object comes from the API server (a few MiB at most); past the bound it is left out,
    // and the recording says so.
    let (object, object_left_out) = match &req.object {
        Some(o) if o.len() > tape::MAX_RECORDED_OBJECT => (None, 1),
        other => (other.clone(), 0),
    };
    let mut recording = tape::Recording {
        format: tape::FORMAT,
        plugin: services.plugin_name().to_string(),
        sha256: compiled.sha256.clone(),
        started_at_ms: started_at
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_millis()).ok()),
        clock,
        reused_instance,
        request: tape::RecordedRequest {
            namespace: req.key.namespace.clone(),
            name: req.key.name.clone(),
            object,
            attempt: req.attempt,
            scheduled: req.scheduled.clone(),
        },
        calls,
        http,
        calls_left_out: calls_left_out + http_left_out + object_left_out,
        free_text_withheld: withhold,
        result: tape::result_json(result, withhold),
    };
    let secrets: Vec<(String, String)> = services
        .secrets()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // A recording can be megabytes: searched and written off the async threads, a few at a time
    // (each holds its recording and a matcher); one that finds them all busy is not written.
    static REDACTING: AtomicUsize = AtomicUsize::new(0);
    const MAX_REDACTING: usize = 32;
    if REDACTING.fetch_add(1, Ordering::AcqRel) >= MAX_REDACTING {
        REDACTING.fetch_sub(1, Ordering::AcqRel);
        recorder.refuse(&recording.plugin, &redact::Unsafe::Busy);
        return;
    }
    let recorder = recorder.clone();
    tokio::task::spawn_blocking(move || {
        let secrets = secrets.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        match recording.redact(secrets, credentials) {
            Ok(()) => recorder.save(&recording),
            Err(why) => recorder.refuse(&recording.plugin, &why),
        }
        REDACTING.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Calls a warm instance serves before it is replaced by a fresh one.
const MAX_WARM_CALLS: u32 = 10_000;

/// A worker's instance kept between calls (`isolation = "worker"`).
pub struct Warm {
    store: Store<CallCtx>,
    plugin: versions::PluginInstance,
    calls: u32,
    /// The plugin's instance budget, released with the instance (fields drop in order: the
    /// store first).
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The pool's slot, released with the instance.
    slot: InstanceSlot,
}

impl Warm {
    /// Whether it holds a slot of the pool's shared part: its worker gives it back when idle.
    pub fn on_shared_slot(&self) -> bool {
        self.slot.is_shared()
    }
}

fn classify(e: wasmtime::Error, limits: &Limits) -> CallError {
    if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        return CallError::Deadline(limits.cpu_deadline);
    }
    if e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
        .is_some()
    {
        return CallError::PoolFull(format!("{e:#}"));
    }
    let text = format!("{e:#}");
    if text.contains("forcing trap when growing memory") || text.contains("memory allocation of") {
        return CallError::Memory(format!("{} bytes allowed", limits.memory));
    }
    CallError::Trap(text)
}

/// An instantiation that failed: a pool that ran out is a wait, not a fault of the plugin.
fn instantiate_error(e: wasmtime::Error) -> CallError {
    if e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
        .is_some()
    {
        CallError::PoolFull(format!("{e:#}"))
    } else {
        CallError::Instantiate(format!("{e:#}"))
    }
}

fn with_panic_message(trap: &str, panic: Option<String>) -> String {
    match panic {
        Some(p) => format!("{p} ({})", trap.lines().next().unwrap_or(trap)),
        None => trap.to_string(),
    }
}
