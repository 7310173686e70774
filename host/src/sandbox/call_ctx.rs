//! The state of one call into a plugin: WASI with nothing granted, memory limits, host-call
//! accounting and the plugin's captured stdout/stderr.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::http::{HostRule, HttpPolicy};

use crate::services::Services;

/// Per-call limits of a plugin.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time the guest may run per call (time inside host calls does not count).
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
    store_limits: StoreLimits,
    pub(crate) services: Arc<Services>,
    pub(crate) started: Instant,
    /// Time spent inside host calls, given back to the CPU deadline.
    pub(crate) host_time: Duration,
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
}

impl CallCtx {
    pub fn new(services: Arc<Services>, limits: &Limits) -> Self {
        // Until `Services` carries parsed rules: its list is already declared ∩ allowed.
        let rules: Arc<[HostRule]> = services
            .allowed_hosts
            .iter()
            .filter_map(|h| h.parse().ok())
            .collect();
        let http_policy = HttpPolicy::new(
            services.plugin_name().into(),
            rules,
            Arc::from([]),
            services.metrics.clone(),
        );
        let stdout = MemoryOutputPipe::new(limits.max_output);
        let stderr = MemoryOutputPipe::new(limits.max_output);
        // Nothing ambient: no preopened directories, no environment, no network, no args.
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        CallCtx {
            wasi,
            table: ResourceTable::new(),
            store_limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory)
                .trap_on_grow_failure(true)
                .instances(64)
                .tables(64)
                .memories(4)
                .build(),
            services,
            started: Instant::now(),
            host_time: Duration::ZERO,
            cpu_deadline: limits.cpu_deadline,
            host_calls: 0,
            max_host_calls: limits.max_host_calls,
            max_string: limits.max_string,
            broken: None,
            stdout,
            stderr,
            logged: [0, 0],
            http: WasiHttpCtx::new(),
            http_policy,
        }
    }

    /// Resets the per-call accounting before a call into a reused instance.
    pub(crate) fn begin_call(&mut self) {
        self.started = Instant::now();
        self.host_time = Duration::ZERO;
        self.host_calls = 0;
        self.broken = None;
        self.http_policy.begin_call();
    }

    /// Bytes the guest has printed in this store's life.
    pub(crate) fn output_len(&self) -> usize {
        self.stdout.contents().len() + self.stderr.contents().len()
    }

    pub(crate) fn store_limits(&mut self) -> &mut StoreLimits {
        &mut self.store_limits
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
                tracing::info!(plugin, stream, "{line}");
            }
        }
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
