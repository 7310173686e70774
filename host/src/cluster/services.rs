//! What a running plugin may reach through its host calls, and the checks on the way: every value
//! validated (`contract::validate`), every API call fenced by the declared permissions in memory,
//! then made under the plugin's own identity within its own budget; cache reads only from the
//! informers it was granted; events only about kinds it watches or declared.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::cluster::api::{ApiAccess, ApiFailure, ApiRequest, CallOptions, PatchKind, Verb};
use crate::cluster::events::{EventSink, PluginEvent};
use crate::cluster::identity::PluginIdentity;
use crate::cluster::permissions::{Grants, Refusal};
use crate::contract::validate::{self, Invalid};
use crate::contract::{KindKey, KindRef, ObjectKey};
use crate::engine::cache::ObjectStore;
use crate::engine::rate_limit::TokenBucket;
use crate::metrics::Metrics;
use crate::sandbox::PluginShare;
use crate::sandbox::http::HostRule;
use crate::sandbox::tape::Recorder;

/// The stores of a plugin's watches, by kind, with the namespace each is limited to and whether
/// it holds metadata only. Reads of a kind watched several times see the union of its stores.
#[derive(Default)]
pub struct PluginCache {
    stores: Vec<(KindKey, Option<String>, Arc<ObjectStore>, bool)>,
}

impl PluginCache {
    /// Adds the store of one watch. A plugin may watch one kind several times (other namespaces
    /// or selectors): reads of that kind see all of them.
    pub fn add(
        &mut self,
        kind: KindKey,
        namespace: Option<String>,
        store: Arc<ObjectStore>,
        metadata_only: bool,
    ) {
        if self
            .stores
            .iter()
            .any(|(_, _, s, _)| Arc::ptr_eq(s, &store))
        {
            return;
        }
        // Kept with full-object stores first, so reads need not sort.
        let at = if metadata_only {
            self.stores.len()
        } else {
            self.stores
                .iter()
                .position(|(_, _, _, m)| *m)
                .unwrap_or(self.stores.len())
        };
        self.stores
            .insert(at, (kind, namespace, store, metadata_only));
    }

    /// The stores of the watches of `kind` (none when the plugin does not watch it), those with
    /// full objects first: an object in both reads as the full one.
    pub fn stores<'a, 'k>(
        &'a self,
        kind: &'k KindKey,
    ) -> impl Iterator<Item = &'a Arc<ObjectStore>> + 'k
    where
        'a: 'k,
    {
        self.stores
            .iter()
            .filter(move |(k, _, _, _)| k == kind)
            .map(|(_, _, s, _)| s)
    }

    /// Whether the plugin watches `kind` where `namespace` lies.
    pub fn covers(&self, kind: &KindKey, namespace: Option<&str>) -> bool {
        self.stores
            .iter()
            .any(|(k, ns, _, _)| k == kind && (ns.is_none() || ns.as_deref() == namespace))
    }
}

/// Per-plugin budgets: what one plugin may take of the host, so it cannot take it from others.
pub struct Budgets {
    /// API calls of this plugin (QPS and burst), before the host-wide bucket.
    pub api: TokenBucket,
    /// Log lines: the plugin's own and the host's warnings about it. Lines over it are dropped and
    /// counted.
    pub logs: TokenBucket,
    /// Instances of this plugin alive at once (warm ones included).
    pub instances: Arc<Semaphore>,
    /// Guest CPU: cores this plugin may use on average. It is charged at every epoch tick of a
    /// running call, not when the call ends: a call that finds the plugin in debt at a tick is
    /// paused there until the debt is paid, and a new call waits before it starts. The debt so
    /// stays within one tick per running call, never workers × deadline.
    cpu: CpuBudget,
    /// Outbound HTTP: requests per second over all the plugin's calls, and DNS lookups in flight.
    pub http: Arc<HttpBudget>,
    /// The shortest delay a `requeue-after` gets; shorter ones are raised to it and go through
    /// the queue's overall bucket (`engine/queue.rs`).
    pub min_requeue_after: std::time::Duration,
    dropped_logs: AtomicU64,
}

/// Outbound HTTP budget of one plugin, shared by all its workers and instances.
pub struct HttpBudget {
    /// Requests per second (0: no limit) and the burst above it.
    pub qps: f64,
    pub burst: u32,
    /// Requests that passed the allow-list take a token here before any lookup or connection;
    /// one whose token would come after the call's wall deadline is refused at once.
    pub(crate) requests: TokenBucket,
    /// DNS lookups of this plugin in flight (`sandbox/dns.rs`): a permit is held until the
    /// blocking lookup returns, also when the request that asked for it has timed out.
    pub(crate) lookups: Arc<Semaphore>,
}

impl HttpBudget {
    pub fn new(qps: f64, burst: u32) -> Self {
        HttpBudget {
            qps,
            burst,
            requests: TokenBucket::new(qps, burst),
            lookups: Arc::new(Semaphore::new(crate::sandbox::dns::LOOKUPS_PER_PLUGIN)),
        }
    }
}

/// A token bucket of CPU seconds, refilled at `share` seconds per second, that may go into debt by
/// one call; a call waits until the debt is paid.
struct CpuBudget {
    share: f64,
    burst: f64,
    state: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl CpuBudget {
    fn new(share: f64) -> Self {
        // A burst of one second of CPU: ordinary reconciles never wait.
        let burst = 1.0;
        CpuBudget {
            share,
            burst,
            state: std::sync::Mutex::new((burst, std::time::Instant::now())),
        }
    }

    fn refill(&self, s: &mut (f64, std::time::Instant)) {
        let now = std::time::Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.share).min(self.burst);
        s.1 = now;
    }

    /// How long to wait before the next call.
    fn wait(&self) -> std::time::Duration {
        if self.share <= 0.0 {
            return std::time::Duration::ZERO;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s);
        if s.0 >= 0.0 {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(-s.0 / self.share)
        }
    }

    /// CPU seconds left (negative: debt).
    fn balance(&self) -> f64 {
        if self.share <= 0.0 {
            return 0.0;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s);
        s.0
    }

    fn charge(&self, used: std::time::Duration) {
        if self.share <= 0.0 {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s);
        s.0 -= used.as_secs_f64();
    }
}

/// The operator's budget settings for one plugin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetSettings {
    pub api_qps: f64,
    pub api_burst: u32,
    pub log_lines_per_second: f64,
    pub log_burst: u32,
    pub max_instances: u32,
    /// Cores of guest CPU one plugin may use on average (0: no limit).
    pub cpu_share: f64,
    /// Distinct list+watch streams (informer keys) one plugin may need; a plugin that needs more
    /// is refused and opens none.
    pub max_watch_streams: u32,
    /// Outbound HTTP requests per second of one plugin (0: no limit), and the burst above it.
    pub http_qps: f64,
    pub http_burst: u32,
    /// The floor of `requeue-after` delays.
    pub min_requeue_after: std::time::Duration,
    /// Series of the plugin's own metrics (contract 0.3), over all of them.
    pub max_metric_series: u32,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        BudgetSettings {
            api_qps: 20.0,
            api_burst: 40,
            log_lines_per_second: 50.0,
            log_burst: 200,
            max_instances: 16,
            cpu_share: 0.25,
            max_watch_streams: 8,
            http_qps: 20.0,
            http_burst: 40,
            min_requeue_after: std::time::Duration::from_secs(1),
            max_metric_series: crate::plugin_metrics::DEFAULT_MAX_SERIES as u32,
        }
    }
}

impl Budgets {
    pub fn new(s: &BudgetSettings) -> Self {
        Budgets {
            api: TokenBucket::new(s.api_qps, s.api_burst),
            logs: TokenBucket::new(s.log_lines_per_second, s.log_burst),
            instances: Arc::new(Semaphore::new(s.max_instances.max(1) as usize)),
            cpu: CpuBudget::new(s.cpu_share),
            http: Arc::new(HttpBudget::new(s.http_qps, s.http_burst)),
            min_requeue_after: s.min_requeue_after,
            dropped_logs: AtomicU64::new(0),
        }
    }

    /// Whether one more log line may be written; counts the ones that may not.
    pub fn log_line(&self) -> bool {
        if self.logs.try_take() {
            true
        } else {
            self.dropped_logs.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Waits while the plugin owes guest CPU (it used more than its share lately).
    pub async fn cpu_turn(&self) {
        let wait = self.cpu.wait();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Counts guest CPU a call used (at each epoch tick, and the rest when it ends).
    pub fn charge_cpu(&self, used: std::time::Duration) {
        self.cpu.charge(used);
    }

    /// How long the plugin must rest until its CPU debt is paid (zero when it owes nothing).
    pub fn cpu_debt_wait(&self) -> std::time::Duration {
        self.cpu.wait()
    }

    /// The plugin's CPU debt now: guest time used beyond its share and burst (zero when it owes
    /// nothing).
    pub fn cpu_debt(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64((-self.cpu.balance()).max(0.0))
    }

    /// Log lines dropped since the last call (reported as one line when the budget allows).
    pub fn take_dropped_logs(&self) -> u64 {
        self.dropped_logs.swap(0, Ordering::Relaxed)
    }
}

tokio::task_local! {
    /// The tenure the writes of the reconcile running in this task go under, when it is not the
    /// plugin's own: a sharded plugin's key is written for only while this replica holds the
    /// key's range (set by the worker around the call, which runs in the worker's task).
    pub static KEY_TENURE: Arc<crate::cluster::tenure::Tenure>;
}

/// The tenure a write made now goes under: the key's range's, else the plugin's.
fn write_tenure(reach: &Reach) -> Arc<crate::cluster::tenure::Tenure> {
    KEY_TENURE
        .try_with(Arc::clone)
        .unwrap_or_else(|_| reach.tenure.clone())
}

/// What only a loaded plugin has (a plugin being described has none of it).
pub struct Reach {
    pub grants: Grants,
    pub identity: PluginIdentity,
    pub api: ApiAccess,
    pub cache: PluginCache,
    pub events: EventSink,
    pub secrets: BTreeMap<String, String>,
    pub metrics: Arc<Metrics>,
    /// When this replica may write for the plugin: a reconcile still running when leadership
    /// goes may read, but its writes are refused (and those in flight cut at the tenure's end),
    /// so two replicas never write for one plugin at once.
    pub tenure: Arc<crate::cluster::tenure::Tenure>,
}

/// Everything a plugin's host calls can use. Built once per loaded plugin and shared by its calls;
/// `describe` runs with [`Services::for_describe`], which refuses API, cache and event calls.
pub struct Services {
    plugin: Arc<str>,
    pub(crate) reach: Option<Reach>,
    pub(crate) config: BTreeMap<String, String>,
    pub(crate) budgets: Budgets,
    /// Hosts for outbound HTTP: declared by the plugin and allowed by the operator.
    pub(crate) allowed_hosts: Arc<[HostRule]>,
    /// Addresses outbound HTTP never reaches unless allowed by address (the API server's).
    pub(crate) protected_ips: Arc<[IpAddr]>,
    /// Where this plugin's reconciles are recorded (`--record-dir`), if anywhere.
    pub(crate) recorder: Option<Arc<Recorder>>,
    /// The instance slot reserved for this loaded version (`sandbox/pool.rs`); none while it is
    /// being described (`describe` has slots of its own).
    pub(crate) share: Option<PluginShare>,
    /// Set when this version is stopped or replaced: its calls waiting for an instance slot give up.
    retired: (std::sync::atomic::AtomicBool, tokio::sync::Notify),
    /// The metrics this version declared (contract 0.3), if any.
    pub(crate) plugin_metrics: Option<Arc<crate::plugin_metrics::PluginMetrics>>,
    /// Its outbound HTTP carries the trace context (contract 0.3, `propagate-trace-context`).
    pub(crate) propagate_trace_context: bool,
}

impl Services {
    pub fn for_describe(plugin: &str, config: BTreeMap<String, String>) -> Self {
        Services {
            plugin: plugin.into(),
            reach: None,
            config,
            // `describe` runs once per load; its CPU is not a running plugin's share.
            budgets: Budgets::new(&BudgetSettings {
                cpu_share: 0.0,
                ..BudgetSettings::default()
            }),
            allowed_hosts: Arc::from(Vec::new()),
            protected_ips: Arc::from(Vec::new()),
            recorder: None,
            share: None,
            retired: Default::default(),
            plugin_metrics: None,
            propagate_trace_context: false,
        }
    }

    /// A plugin with these budgets and nothing to reach (no API, cache, events or outbound hosts):
    /// for tests and benchmarks of the sandbox's budgets.
    pub fn with_budgets(plugin: &str, budgets: &BudgetSettings) -> Self {
        Services {
            budgets: Budgets::new(budgets),
            ..Services::for_describe(plugin, BTreeMap::new())
        }
    }

    pub fn new(
        plugin: &str,
        reach: Reach,
        config: BTreeMap<String, String>,
        budgets: &BudgetSettings,
        allowed_hosts: Vec<HostRule>,
        protected_ips: Vec<IpAddr>,
    ) -> Self {
        Services {
            plugin: plugin.into(),
            reach: Some(reach),
            config,
            budgets: Budgets::new(budgets),
            allowed_hosts: allowed_hosts.into(),
            protected_ips: protected_ips.into(),
            recorder: None,
            share: None,
            retired: Default::default(),
            plugin_metrics: None,
            propagate_trace_context: false,
        }
    }

    /// Marks this version as stopped or replaced: its calls waiting for an instance slot give up
    /// (calls that run are not touched).
    pub fn retire(&self) {
        self.retired.0.store(true, Ordering::Release);
        self.retired.1.notify_waiters();
    }

    /// Returns once this version is retired.
    pub async fn retired(&self) {
        loop {
            let notified = self.retired.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.retired.0.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// Gives this version the instance slot reserved for it: its first instance never waits for
    /// the other plugins' (held until the version and its last instance are gone).
    pub fn with_share(mut self, share: PluginShare) -> Self {
        self.share = Some(share);
        self
    }

    /// Records this plugin's reconciles with `recorder`.
    pub fn with_recorder(mut self, recorder: Option<Arc<Recorder>>) -> Self {
        self.recorder = recorder;
        self
    }

    /// The plugin's budgets.
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    pub fn plugin_name(&self) -> &str {
        &self.plugin
    }

    /// With the plugin's declared metrics, updated by its `metrics` host calls.
    pub fn with_plugin_metrics(
        mut self,
        metrics: Option<Arc<crate::plugin_metrics::PluginMetrics>>,
    ) -> Self {
        self.plugin_metrics = metrics;
        self
    }

    /// Whether the plugin declared permissions on this kind (true in a replay, which has no grant).
    pub(crate) fn covers(&self, kind: &crate::contract::KindKey) -> bool {
        self.reach.as_ref().is_none_or(|r| r.grants.covers(kind))
    }

    /// Whether a kind is namespaced, as discovery says; none when unknown (or in a replay).
    pub(crate) async fn namespaced(&self, kind: &crate::contract::KindRef) -> Option<bool> {
        let reach = self.reach.as_ref()?;
        reach.api.resolve(kind).await.ok().map(|r| r.namespaced)
    }

    /// With outbound HTTP carrying the reconcile's trace context.
    pub fn with_trace_context(mut self, propagate: bool) -> Self {
        self.propagate_trace_context = propagate;
        self
    }

    pub fn plugin_metrics(&self) -> Option<&Arc<crate::plugin_metrics::PluginMetrics>> {
        self.plugin_metrics.as_ref()
    }

    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.reach.as_ref().map(|r| &r.metrics)
    }

    pub fn secret(&self, key: &str) -> Option<&String> {
        self.reach.as_ref()?.secrets.get(key)
    }

    /// Every secret setting of the plugin, name and value (to keep them out of recordings).
    pub(crate) fn secrets(&self) -> impl Iterator<Item = (&str, &str)> {
        self.reach
            .iter()
            .flat_map(|r| r.secrets.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Every secret value the plugin may read (to keep them out of recordings).
    pub(crate) fn secret_values(&self) -> impl Iterator<Item = &str> {
        self.reach
            .iter()
            .flat_map(|r| r.secrets.values().map(String::as_str))
    }

    /// A place in this plugin's instance budget (`max_instances`); waits while the plugin has its
    /// maximum alive. The pool's slot is taken after it (`sandbox/pool.rs`).
    pub async fn instance_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.budgets.instances.clone().acquire_owned().await.ok()
    }

    /// Writes a warning about this plugin, within its log budget.
    pub fn warn(&self, message: std::fmt::Arguments<'_>) {
        if self.budgets.log_line() {
            tracing::warn!(plugin = %self.plugin, "{message}");
        }
    }

    /// Validates, fences, then makes the API call as the plugin.
    pub async fn api_call(&self, req: &ApiRequest<'_>) -> Result<String, ApiFailure> {
        let Some(reach) = &self.reach else {
            return Err(ApiFailure::unavailable(
                "API calls are not available while the plugin is being described",
            ));
        };
        let verb = req.verb.as_str();
        let writes = !matches!(
            req.verb,
            crate::cluster::api::Verb::Get | crate::cluster::api::Verb::List
        );
        let tenure = write_tenure(reach);
        if writes && !tenure.is_open() {
            return Err(ApiFailure::not_leader());
        }
        if let Err(e) = check_request(req) {
            self.warn(format_args!("API call refused ({verb}): {e}"));
            reach.metrics.invalid_call(&self.plugin, verb);
            return Err(ApiFailure::bad_request(e.to_string()));
        }
        // A create names its object in the body: the guard of protected namespaces' own objects
        // needs that name (children are created this way too).
        let created_namespace = (req.verb == crate::cluster::api::Verb::Create
            && req.name.is_none()
            && req.kind.group.is_empty()
            && req.kind.kind == "Namespace")
            .then(|| {
                req.body
                    .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
                    .and_then(|v| v["metadata"]["name"].as_str().map(str::to_string))
            })
            .flatten();
        let resolved = match reach.grants.check(
            req.kind,
            req.subresource,
            verb,
            req.namespace,
            req.name.or(created_namespace.as_deref()),
        ) {
            Ok(r) => r,
            Err(Refusal::Undeclared { resource }) => {
                let group = &req.kind.group;
                self.warn(format_args!(
                    "undeclared API call refused: {verb} {} (group {})",
                    validate::shown(&resource),
                    validate::shown(group)
                ));
                // The label is a declared plural or "undeclared": never a guest's free string.
                let label = if reach.grants.covers(&KindKey::from(req.kind)) {
                    resource.as_str()
                } else {
                    "undeclared"
                };
                reach.metrics.forbidden_call(&self.plugin, verb, label);
                return Err(ApiFailure::forbidden(&self.plugin, verb, group, &resource));
            }
            Err(Refusal::OutOfScope {
                resource,
                namespace,
            }) => {
                let scope = reach.grants.scope();
                let place = match &namespace {
                    Some(ns) => format!("namespace {}", validate::shown(ns)),
                    None => "all namespaces at once (name a namespace; read across namespaces from the cache)".to_string(),
                };
                self.warn(format_args!(
                    "API call outside the plugin's namespaces refused: {verb} {resource} in {place} (it acts in {scope})"
                ));
                reach.metrics.forbidden_call(&self.plugin, verb, &resource);
                return Err(ApiFailure::new(
                    403,
                    "OutOfScope",
                    format!(
                        "plugin {} may {verb} {resource} only in {scope}, not in {place}: the operator names where it acts with `namespaces` in its NAME.toml",
                        self.plugin
                    ),
                ));
            }
            Err(Refusal::NotServed(why)) => return Err(ApiFailure::not_found(why)),
        };
        self.budgets.api.acquire().await;
        reach
            .api
            .call(
                reach.identity.client(),
                &self.plugin,
                &resolved,
                req,
                writes.then_some(&tenure),
            )
            .await
    }

    /// Records an event about an object of a kind the plugin watches (in the namespace it watches)
    /// or declared permissions for; anything else is refused here, and the API server checks the
    /// write again under the plugin's identity.
    pub fn record_event(&self, event: PluginEvent, kind: &KindRef) {
        let Some(reach) = &self.reach else {
            tracing::debug!(plugin = %self.plugin, "event dropped: events are not available while describing");
            return;
        };
        if !write_tenure(reach).is_open() {
            tracing::debug!(plugin = %self.plugin, "event dropped: this replica no longer leads");
            return;
        }
        let refused = check_event(&event, kind).err().or_else(|| {
            let k = KindKey::from(kind);
            // About an object it watches (there) or of a declared kind, in a namespace where it
            // acts (events are writes).
            let acts_there = match event.namespace.as_deref() {
                Some(ns) => reach.grants.scope().allows(ns),
                None => true,
            };
            let ours = (reach.cache.covers(&k, event.namespace.as_deref())
                || reach.grants.covers(&k))
                && acts_there;
            (!ours).then(|| {
                format!(
                    "{k} is neither watched (there) nor declared by the plugin, or the namespace is not one where it acts ({})",
                    reach.grants.scope()
                )
            })
        });
        if let Some(why) = refused {
            self.warn(format_args!("event refused: {why}"));
            reach.metrics.invalid_call(&self.plugin, "event");
            return;
        }
        reach.events.record(&self.plugin, event);
    }

    /// The cached stores of `kind` this plugin watches (one per watch of it).
    pub fn cache_stores(&self, kind: &KindRef) -> Vec<&Arc<ObjectStore>> {
        let Some(reach) = &self.reach else {
            return Vec::new();
        };
        let key = KindKey::from(kind);
        reach.cache.stores(&key).collect()
    }

    /// Counts a refused cache or config call (bad key or selector).
    pub fn invalid_call(&self, call: &str, e: &Invalid) {
        self.warn(format_args!("{call} refused: {e}"));
        if let Some(m) = self.metrics() {
            m.invalid_call(&self.plugin, call);
        }
    }
}

/// Checks every guest value of an API request.
fn check_request(req: &ApiRequest<'_>) -> Result<(), Invalid> {
    validate::kind(req.kind)?;
    if let Some(ns) = req.namespace {
        validate::namespace(ns)?;
    }
    if let Some(name) = req.name {
        validate::name(name)?;
    }
    if req.verb == crate::cluster::api::Verb::List
        && let Some(sel) = req.body
    {
        validate::label_selector(sel)?;
    }
    check_options(req.options, req.verb)?;
    Ok(())
}

/// The options of an API call (from the guest): each only where its verb takes it, and every string bounded and
/// of the characters the API server accepts there (they become query parameters).
fn check_options(o: &CallOptions, verb: Verb) -> Result<(), Invalid> {
    let only = |what: &'static str, set: bool, allowed: bool| {
        if set && !allowed {
            Err(Invalid::new(what, "", "does not apply to this call"))
        } else {
            Ok(())
        }
    };
    let list = verb == Verb::List;
    let patch = matches!(verb, Verb::Patch(_));
    let delete = verb == Verb::Delete;
    only("field selector", o.field_selector.is_some(), list)?;
    only("limit", o.limit.is_some(), list)?;
    only("continue token", o.continue_token.is_some(), list)?;
    only(
        "field manager suffix",
        o.field_manager_suffix.is_some(),
        patch,
    )?;
    only("force", o.force, verb == Verb::Patch(PatchKind::Apply))?;
    only("dry run", o.dry_run, patch || delete)?;
    only("propagation", o.propagation.is_some(), delete)?;
    only(
        "precondition",
        o.precondition_uid.is_some() || o.precondition_resource_version.is_some(),
        delete,
    )?;
    if let Some(f) = &o.field_selector {
        validate::field_selector(f)?;
    }
    if let Some(l) = o.limit {
        validate::limit(l)?;
    }
    if let Some(t) = &o.continue_token {
        validate::continue_token(t)?;
    }
    if let Some(m) = &o.field_manager_suffix {
        // `wcm:NAME:SUFFIX`: no ':' in it, and within the API server's 128.
        validate::field_manager_suffix(m)?;
    }
    if let Some(u) = &o.precondition_uid {
        validate::uid(u)?;
    }
    if let Some(rv) = &o.precondition_resource_version {
        validate::precondition_resource_version(rv)?;
    }
    Ok(())
}

fn check_event(e: &PluginEvent, kind: &KindRef) -> Result<(), String> {
    wcm_validate::event(
        (&kind.group, &kind.version, &kind.kind),
        e.namespace.as_deref(),
        &e.name,
        e.uid.as_deref(),
        &e.reason,
        &e.action,
    )
    .map_err(|e| e.to_string())
}

/// Turns an object key into the store's key.
pub fn store_key(key: &ObjectKey) -> crate::engine::cache::Key {
    crate::engine::cache::Key::new(key.namespace.as_deref(), &key.name)
}

#[cfg(test)]
mod cpu_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_plugin_over_its_cpu_share_waits_in_proportion() {
        let b = Budgets::new(&BudgetSettings {
            cpu_share: 0.25,
            ..BudgetSettings::default()
        });
        assert!(b.cpu.wait().is_zero(), "a fresh plugin has a burst");
        b.charge_cpu(Duration::from_millis(1000));
        assert!(
            b.cpu.wait() < Duration::from_millis(50),
            "the burst covers one second"
        );
        b.charge_cpu(Duration::from_millis(1000));
        let w = b.cpu.wait();
        // One second of debt at a quarter of a core: about four seconds.
        assert!(
            w > Duration::from_millis(3500) && w <= Duration::from_secs(4),
            "{w:?}"
        );
        let unlimited = Budgets::new(&BudgetSettings {
            cpu_share: 0.0,
            ..BudgetSettings::default()
        });
        unlimited.charge_cpu(Duration::from_secs(100));
        assert!(unlimited.cpu.wait().is_zero());
    }
}

#[cfg(test)]
mod option_tests {
    use super::*;
    use crate::contract::Propagation;

    #[test]
    fn options_apply_only_to_their_verbs_and_are_bounded() {
        let apply = Verb::Patch(PatchKind::Apply);
        let merge = Verb::Patch(PatchKind::Merge);
        let ok = |o: CallOptions, v: Verb| check_options(&o, v).is_ok();
        assert!(ok(CallOptions::default(), Verb::Get));
        let forced = CallOptions {
            force: true,
            ..CallOptions::default()
        };
        assert!(ok(forced.clone(), apply));
        assert!(!ok(forced, merge), "force is for server-side apply only");
        let paged = CallOptions {
            field_selector: Some("spec.nodeName=n1".into()),
            limit: Some(100),
            continue_token: Some("abc".into()),
            ..CallOptions::default()
        };
        assert!(ok(paged.clone(), Verb::List));
        assert!(!ok(paged, Verb::Get));
        for limit in [0, 10_001] {
            let o = CallOptions {
                limit: Some(limit),
                ..CallOptions::default()
            };
            assert!(!ok(o, Verb::List), "limit {limit}");
        }
        let deleting = CallOptions {
            propagation: Some(Propagation::Foreground),
            precondition_uid: Some("u-1".into()),
            dry_run: true,
            ..CallOptions::default()
        };
        assert!(ok(deleting.clone(), Verb::Delete));
        assert!(!ok(deleting, merge), "propagation is for delete only");
        let longest = "s".repeat(60);
        let too_long = "s".repeat(61);
        for (suffix, good) in [
            ("labels", true),
            ("", false),
            ("Bad", false),
            ("a b", false),
            ("a:b", false),
            (longest.as_str(), true),
            (too_long.as_str(), false),
        ] {
            let o = CallOptions {
                field_manager_suffix: Some(suffix.into()),
                ..CallOptions::default()
            };
            assert_eq!(ok(o, merge), good, "suffix {suffix:?}");
        }
        let control = CallOptions {
            field_selector: Some("a=\u{1}".into()),
            ..CallOptions::default()
        };
        assert!(!ok(control, Verb::List));
        let long = CallOptions {
            continue_token: Some("x".repeat(9000)),
            ..CallOptions::default()
        };
        assert!(!ok(long, Verb::List));
    }
}

#[cfg(test)]
mod shared_table_tests {
    use super::*;
    use wcm_validate::{BAD_INPUTS, Field};

    /// The table the SDK's MockHost is tested with too (guest-sdk/tests/validation_parity.rs).
    #[test]
    fn the_host_refuses_every_value_of_the_table_mockhost_refuses() {
        for (field, value, what) in BAD_INPUTS {
            let mut kind = KindRef {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
            };
            let (mut ns, mut name) = ("default", "web");
            let mut options = CallOptions::default();
            let mut verb = Verb::Get;
            let mut selector = None;
            let mut event = PluginEvent {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: Some("default".into()),
                name: "web".into(),
                uid: None,
                warning: false,
                reason: "Created".into(),
                action: "Create".into(),
                note: String::new(),
            };
            match field {
                Field::Namespace => ns = value,
                Field::Name => name = value,
                Field::Group => kind.group = value.to_string(),
                Field::Version => kind.version = value.to_string(),
                Field::Kind => kind.kind = value.to_string(),
                Field::LabelSelector => {
                    verb = Verb::List;
                    selector = Some(*value);
                }
                Field::FieldSelector => {
                    verb = Verb::List;
                    options.field_selector = Some(value.to_string());
                }
                Field::FieldManagerSuffix => {
                    verb = Verb::Patch(PatchKind::Merge);
                    options.field_manager_suffix = Some(value.to_string());
                }
                Field::EventReason => event.reason = value.to_string(),
                Field::EventAction => event.action = value.to_string(),
                Field::EventUid => event.uid = Some(value.to_string()),
            }
            let refused = if matches!(
                field,
                Field::EventReason | Field::EventAction | Field::EventUid
            ) {
                check_event(&event, &kind).expect_err(&format!("event {field:?} {value:?}"))
            } else {
                let req = ApiRequest {
                    verb,
                    kind: &kind,
                    namespace: Some(ns),
                    name: (verb != Verb::List).then_some(name),
                    subresource: None,
                    body: selector,
                    options: &options,
                };
                check_request(&req)
                    .expect_err(&format!("call {field:?} {value:?}"))
                    .to_string()
            };
            assert!(
                refused.starts_with(&format!("invalid {what} ")),
                "{field:?} {value:?}: {refused}"
            );
        }
    }
}
