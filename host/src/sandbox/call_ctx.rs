//! The state of one call into a plugin: WASI with nothing granted, memory limits, host-call
//! accounting and the plugin's captured stdout/stderr.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::ResourceLimiter;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::guest_clock::GuestClock;
use super::http::HttpPolicy;
use super::tape::{ClockTape, Tape, Tapes};

use crate::cluster::services::Services;

/// Per-call limits of a plugin.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time the guest may run per call. Time it waits (host API calls, outbound HTTP, WASI polls,
    /// rate limits) does not count: see `guest_clock`.
    pub cpu_deadline: Duration,
    /// Whole call, host calls included.
    pub wall_timeout: Duration,
    /// Linear memory, bytes.
    pub memory: usize,
    /// Host calls per call.
    pub max_host_calls: u32,
    /// Bytes of any one string a plugin hands the host (bodies, log lines, notes).
    pub max_string: usize,
    /// Bytes of stdout + stderr kept per call.
    pub max_output: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_deadline: Duration::from_secs(1),
            wall_timeout: Duration::from_secs(120),
            memory: 64 << 20,
            max_host_calls: 10_000,
            max_string: 1 << 20,
            max_output: 64 << 10,
        }
    }
}

pub struct CallCtx {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: InstanceLimiter,
    pub(crate) services: Arc<Services>,
    /// The call's run time (time being polled), shared with the future that meters it.
    pub(crate) clock: Arc<GuestClock>,
    /// Run time already seen by the last epoch tick.
    charged: Duration,
    pub(crate) cpu_deadline: Duration,
    pub(crate) host_calls: u32,
    pub(crate) max_host_calls: u32,
    pub(crate) max_string: usize,
    /// Set when the plugin broke a limit in a host call (the call then traps).
    pub(crate) broken: Option<String>,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    /// Output bytes already written to the log (a reused instance keeps its pipes).
    logged: [usize; 2],
    http: WasiHttpCtx,
    http_policy: HttpPolicy,
    /// Host calls being recorded, or answered from a recording (`tape.rs`).
    pub(crate) tape: Option<Tape>,
    /// The guest's wall-clock readings, while recording or replaying.
    clock_tape: Option<Arc<Mutex<ClockTape>>>,
    /// The key being reconciled ("namespace/name" or "name"; empty in `describe`): every log line
    /// of the plugin carries it.
    pub(crate) key: String,
}

impl CallCtx {
    pub fn new(services: Arc<Services>, limits: &Limits) -> Self {
        let mut http_policy = HttpPolicy::new(
            services.plugin_name().into(),
            services.allowed_hosts.clone(),
            services.protected_ips.clone(),
            services.metrics().cloned(),
            services.budgets.http.clone(),
        );
        http_policy.propagate_trace_context = services.propagate_trace_context;
        let stdout = MemoryOutputPipe::new(limits.max_output);
        let stderr = MemoryOutputPipe::new(limits.max_output);
        let wasi = wasi_ctx(&stdout, &stderr, None);
        CallCtx {
            wasi,
            table: {
                // Resources a guest holds at once (streams, HTTP requests, fields, ...), in host
                // memory outside its linear-memory cap: bounded.
                let mut t = ResourceTable::new();
                t.set_max_capacity(MAX_RESOURCES);
                t
            },
            limiter: InstanceLimiter {
                cap: limits.memory,
                used: 0,
            },
            services,
            clock: GuestClock::new(),
            charged: Duration::ZERO,
            cpu_deadline: limits.cpu_deadline,
            host_calls: 0,
            max_host_calls: limits.max_host_calls,
            max_string: limits.max_string,
            broken: None,
            stdout,
            stderr,
            logged: [0, 0],
            http: {
                // Header sets of at most 16 KiB each: a guest's HTTP state is host memory too.
                let mut h = WasiHttpCtx::new();
                h.set_field_size_limit(16 << 10);
                h
            },
            http_policy,
            tape: None,
            clock_tape: None,
            key: String::new(),
        }
    }

    /// Records (or replays) this call's host calls and outbound HTTP. A replay runs at the
    /// recorded time: the guest's wall clock starts where the recorded call's did.
    pub(crate) fn set_tapes(&mut self, tapes: Option<Tapes>) {
        match tapes {
            Some(t) => {
                self.wasi = wasi_ctx(&self.stdout, &self.stderr, Some(t.clock.clone()));
                self.clock_tape = Some(t.clock);
                self.tape = Some(t.calls);
                self.http_policy.tape = Some(t.http);
            }
            None => {
                if self.clock_tape.take().is_some() {
                    self.wasi = wasi_ctx(&self.stdout, &self.stderr, None);
                }
                self.tape = None;
                self.http_policy.tape = None;
            }
        }
    }

    /// The call's tapes (host calls, HTTP, clock readings), if it had them.
    pub(crate) fn take_tapes(&mut self) -> Option<(Tape, Tape, Vec<u64>)> {
        let calls = self.tape.take()?;
        let http = self
            .http_policy
            .tape
            .take()
            .map_or_else(Tape::recording, Tapes::take_http);
        let clock = self
            .clock_tape
            .as_ref()
            .map(|c| {
                std::mem::take(&mut *c.lock().unwrap_or_else(|p| p.into_inner())).into_readings()
            })
            .unwrap_or_default();
        Some((calls, http, clock))
    }

    /// Names the key a reconcile call is for (its log lines carry it).
    pub(crate) fn set_key(&mut self, key: &crate::contract::ObjectKey) {
        self.key.clear();
        if let Some(ns) = &key.namespace {
            self.key.push_str(ns);
            self.key.push('/');
        }
        self.key.push_str(&key.name);
    }

    /// Resets the per-call accounting before a call into a reused instance.
    pub(crate) fn begin_call(&mut self) {
        self.key.clear();
        self.clock.reset();
        self.charged = Duration::ZERO;
        self.host_calls = 0;
        self.broken = None;
        self.http_policy.begin_call();
    }

    /// Sets when the current call's wall time ends (outbound HTTP does not wait for its rate past it).
    pub(crate) fn set_deadline(&mut self, deadline: std::time::Instant) {
        self.http_policy.set_deadline(deadline);
    }

    /// The guest's run time so far and the part of it since the last tick.
    pub(crate) fn tick(&mut self) -> (Duration, Duration) {
        let total = self.clock.elapsed();
        let segment = total.saturating_sub(self.charged);
        self.charged = total;
        (total, segment)
    }

    /// Bytes the guest has printed in this store's life.
    pub(crate) fn output_len(&self) -> usize {
        self.stdout.contents().len() + self.stderr.contents().len()
    }

    pub(crate) fn limiter(&mut self) -> &mut InstanceLimiter {
        &mut self.limiter
    }

    pub(crate) fn limit_broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Counts a host call and checks the sizes of the strings it carries; an error traps the guest.
    pub(crate) fn admit(
        &mut self,
        what: &str,
        sizes: impl IntoIterator<Item = usize>,
    ) -> wasmtime::Result<()> {
        self.host_calls += 1;
        if self.host_calls > self.max_host_calls {
            return Err(self.break_limit(format!(
                "more than {} host calls in one call",
                self.max_host_calls
            )));
        }
        if let Some(big) = sizes.into_iter().max()
            && big > self.max_string
        {
            return Err(self.break_limit(format!(
                "{what}: a string of {big} bytes exceeds the {} byte limit",
                self.max_string
            )));
        }
        Ok(())
    }

    fn break_limit(&mut self, why: String) -> wasmtime::Error {
        self.broken = Some(why.clone());
        wasmtime::Error::msg(why)
    }

    /// The panic message, if the guest printed one to stderr.
    pub(crate) fn panic_message(&self) -> Option<String> {
        let all = self.stderr.contents();
        let err = String::from_utf8_lossy(all.get(self.logged[1]..).unwrap_or(&all)).into_owned();
        let line = err.lines().find(|l| l.contains("panicked at"))?;
        let idx = err.find(line)?;
        let rest: Vec<&str> = err[idx..].lines().take(2).collect();
        Some(rest.join(": ").trim().to_string())
    }

    /// Writes what the guest printed to the host log under the plugin's name.
    pub(crate) fn flush_output(&mut self, plugin: &str) {
        let budgets = &self.services.budgets;
        let dropped = budgets.take_dropped_logs();
        if dropped > 0 && budgets.log_line() {
            tracing::warn!(
                plugin,
                dropped,
                "log lines of the plugin dropped: over its log budget"
            );
        }
        for (i, (stream, pipe)) in [("stdout", &self.stdout), ("stderr", &self.stderr)]
            .into_iter()
            .enumerate()
        {
            let all = pipe.contents();
            let bytes = all.get(self.logged[i]..).unwrap_or_default();
            self.logged[i] = all.len();
            if bytes.is_empty() {
                continue;
            }
            for line in String::from_utf8_lossy(bytes)
                .lines()
                .filter(|l| !l.trim().is_empty())
            {
                if budgets.log_line() {
                    let line = crate::contract::validate::log_text(line, 4096);
                    tracing::info!(plugin, stream, "{line}");
                }
            }
        }
    }
}

/// WASI with nothing ambient: no preopened directories, no environment, no network, no args;
/// the host's wall clock, or one that starts at `start` (a replay).
fn wasi_ctx(
    stdout: &MemoryOutputPipe,
    stderr: &MemoryOutputPipe,
    clock: Option<Arc<Mutex<ClockTape>>>,
) -> WasiCtx {
    let mut b = WasiCtxBuilder::new();
    b.stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    if let Some(clock) = clock {
        b.wall_clock(TapedClock(clock));
    }
    b.build()
}

/// The wall clock while recording (readings kept) or replaying (readings handed back).
struct TapedClock(Arc<Mutex<ClockTape>>);

impl wasmtime_wasi::HostWallClock for TapedClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).now()
    }
}

/// The memory cap of one instance, over all its linear memories and tables together (a component
/// has several core instances, each with its own): growth past it traps the guest.
pub(crate) struct InstanceLimiter {
    cap: usize,
    used: usize,
}

/// Host-side resources one instance may hold at once.
const MAX_RESOURCES: usize = 1024;

/// What one table element is counted as against the memory cap.
const TABLE_ELEMENT_BYTES: usize = 16;

impl InstanceLimiter {
    fn grow(&mut self, current: usize, desired: usize, what: &str) -> wasmtime::Result<bool> {
        let total = self.used.saturating_add(desired.saturating_sub(current));
        if total > self.cap {
            return Err(wasmtime::Error::msg(format!(
                "forcing trap when growing memory: {what} would bring the instance to {total} bytes, over its {} byte cap",
                self.cap
            )));
        }
        self.used = total;
        Ok(true)
    }
}

impl ResourceLimiter for InstanceLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(current, desired, "a linear memory")
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
            "a table",
        )
    }

    // The per-component caps (`pool.rs`): the pooling allocator already refuses a component over
    // them when it is compiled; the store's own count is the same bound, for what it instantiates.
    fn instances(&self) -> usize {
        super::pool::MAX_CORE_INSTANCES as usize
    }

    fn tables(&self) -> usize {
        super::pool::MAX_TABLES as usize
    }

    fn memories(&self) -> usize {
        super::pool::MAX_MEMORIES as usize
    }
}

impl WasiHttpView for CallCtx {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_policy,
        }
    }
}

impl WasiView for CallCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
