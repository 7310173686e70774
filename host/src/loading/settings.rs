//! The operator's settings for one plugin: the optional `NAME.toml` beside `NAME.wasm`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::cluster::services::BudgetSettings;
use crate::sandbox::Limits;

/// `NAME.toml`. Every key is optional; unknown keys are an error (a typo must not pass silently).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSettings {
    /// Instance name, replacing the name the plugin declares: runs one component more than once,
    /// each with its own settings, queue and metrics.
    pub name: Option<String>,
    /// `false` keeps the plugin loaded-but-stopped (default true).
    pub enabled: Option<bool>,
    /// Concurrent reconciles; overrides the plugin's own default.
    pub workers: Option<u32>,
    /// Periodic resync in seconds (0: none); overrides the plugin's own default.
    pub resync_seconds: Option<u32>,
    /// Guest CPU time per call, milliseconds.
    pub cpu_deadline_ms: Option<u64>,
    /// Linear memory cap, MiB.
    pub memory_mb: Option<u32>,
    /// `"call"` (default): a fresh instance for every reconcile, nothing carried over between keys.
    /// `"worker"`: each worker keeps one instance across calls (faster; for plugins that keep no
    /// state), replaced after any failure.
    pub isolation: Option<Isolation>,
    /// API requests per second of this plugin, and the burst above it (default: --plugin-api-qps
    /// and --plugin-api-burst).
    pub api_qps: Option<f64>,
    pub api_burst: Option<u32>,
    /// Outbound HTTP requests per second of this plugin, and the burst above it (default:
    /// --plugin-http-qps and --plugin-http-burst; 0: no limit).
    pub http_qps: Option<f64>,
    pub http_burst: Option<u32>,
    /// The shortest `requeue-after` of this plugin, milliseconds (default: --min-requeue-after-ms).
    pub min_requeue_after_ms: Option<u64>,
    /// Instances of this plugin alive at once, warm ones included (default:
    /// --max-instances-per-plugin).
    pub max_instances: Option<u32>,
    /// Cores of guest CPU this plugin may use on average (default: --plugin-cpu-share; 0: none).
    pub cpu_share: Option<f64>,
    /// Where the plugin acts: the namespaces its declared permissions on namespaced kinds reach
    /// (the host's fence and the Roles `rbac` prints). Default: the namespaces it watches, or, for a
    /// plugin watching some kind in every namespace, every namespace except the protected ones
    /// (the plugins' identity namespace and the host's). A protected namespace is reached only
    /// when named here.
    pub namespaces: Option<Vec<String>>,
    /// Distinct list+watch streams this plugin may need (default:
    /// --max-watch-streams-per-plugin); the operator's choice, up or down.
    pub max_watch_streams: Option<u32>,
    /// Series of the plugin's own metrics (default: --plugin-metric-series).
    pub max_metric_series: Option<u32>,
    /// Sharded mode (needs `--leader-elect-mode per-plugin`): the plugin's keys are split by hash
    /// into this many ranges, each led by one replica through a Lease of its own, so replicas
    /// share one plugin's keys (2 to 64; absent: one replica leads the whole plugin).
    pub shards: Option<u32>,
    /// What a key's shard is the hash of: `"uid"` (default; the most even split) or
    /// `"namespace"` (every object of a namespace lands on one replica).
    pub shard_by: Option<crate::engine::shard::ShardBy>,
    /// Hosts the plugin may reach over HTTP (intersected with what it declares).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Plain settings the plugin reads with `config.get`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Secret references, `key = "namespace/secret-name/data-key"`, read with `config.secret`.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
}

impl PluginSettings {
    pub fn parse(text: &str) -> Result<Self, String> {
        // The message and the position only: toml's own rendering quotes the file's lines, and
        // what reaches logs and `/plugins` must never carry file contents (a mistyped secret).
        let s: PluginSettings = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|r| text[..r.start.min(text.len())].matches('\n').count() + 1);
            let message = redact_quoted(e.message().trim());
            match line {
                Some(l) => format!("line {l}: {message}"),
                None => message,
            }
        })?;
        for (key, reference) in &s.secrets {
            SecretRef::parse(reference).map_err(|e| format!("secrets.{key}: {e}"))?;
        }
        for ns in s.namespaces.iter().flatten() {
            crate::contract::validate::namespace(ns).map_err(|e| format!("namespaces: {e}"))?;
        }
        if s.workers == Some(0) {
            return Err("workers must be at least 1".into());
        }
        if s.memory_mb == Some(0) {
            return Err("memory_mb must be at least 1".into());
        }
        if s.max_instances == Some(0) {
            return Err("max_instances must be at least 1".into());
        }
        if s.max_watch_streams == Some(0) {
            return Err("max_watch_streams must be at least 1".into());
        }
        if s.cpu_share.is_some_and(|c| !c.is_finite() || c < 0.0) {
            return Err("cpu_share must be a number of cores, at least 0 (0: no limit)".into());
        }
        if s.api_qps.is_some_and(|q| !q.is_finite() || q < 0.0) {
            return Err("api_qps must be a number of at least 0 (0: no per-plugin limit)".into());
        }
        if s.http_qps.is_some_and(|q| !q.is_finite() || q < 0.0) {
            return Err("http_qps must be a number of at least 0 (0: no per-plugin limit)".into());
        }
        if let Some(n) = s.shards
            && !(2..=crate::engine::shard::MAX_SHARDS).contains(&n)
        {
            return Err(format!(
                "shards must be from 2 to {} (leave it out for an unsharded plugin)",
                crate::engine::shard::MAX_SHARDS
            ));
        }
        if s.shard_by.is_some() && s.shards.is_none() {
            return Err("shard_by needs shards (how many ranges the keys are split into)".into());
        }
        if s.http_burst == Some(0) {
            return Err("http_burst must be at least 1".into());
        }
        Ok(s)
    }

    /// The sharded mode asked for: how many ranges, and by what.
    pub fn sharding(&self) -> Option<(u32, crate::engine::shard::ShardBy)> {
        self.shards.map(|n| (n, self.shard_by.unwrap_or_default()))
    }

    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The plugin's budgets: host defaults, overridden where the operator says.
    pub fn budgets(&self, defaults: &BudgetSettings) -> BudgetSettings {
        BudgetSettings {
            api_qps: self.api_qps.unwrap_or(defaults.api_qps),
            api_burst: self.api_burst.unwrap_or(defaults.api_burst),
            max_instances: self.max_instances.unwrap_or(defaults.max_instances),
            cpu_share: self.cpu_share.unwrap_or(defaults.cpu_share),
            max_watch_streams: self.max_watch_streams.unwrap_or(defaults.max_watch_streams),
            max_metric_series: self.max_metric_series.unwrap_or(defaults.max_metric_series),
            http_qps: self.http_qps.unwrap_or(defaults.http_qps),
            http_burst: self.http_burst.unwrap_or(defaults.http_burst),
            min_requeue_after: self
                .min_requeue_after_ms
                .map_or(defaults.min_requeue_after, Duration::from_millis),
            ..*defaults
        }
    }

    /// The call limits: host defaults, overridden where the operator says.
    pub fn limits(&self, defaults: &Limits) -> Limits {
        let mut l = defaults.clone();
        if let Some(ms) = self.cpu_deadline_ms {
            l.cpu_deadline = Duration::from_millis(ms.max(1));
        }
        if let Some(mb) = self.memory_mb {
            l.memory = (mb as usize) << 20;
        }
        l
    }
}

/// Replaces every double-quoted value in a parser message with `"…"` (serde quotes the offending
/// value; keys are quoted with backticks and stay).
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        match (c, inside) {
            ('"', false) => {
                out.push_str("\"…");
                inside = true;
            }
            ('"', true) => {
                out.push('"');
                inside = false;
            }
            (_, false) => out.push(c),
            (_, true) => {}
        }
    }
    out
}

pub use crate::contract::isolation::Isolation;

/// `namespace/name/key` of a Secret's data entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl SecretRef {
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts.as_slice() {
            [ns, name, key] if !ns.is_empty() && !name.is_empty() && !key.is_empty() => {
                Ok(SecretRef {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    key: key.to_string(),
                })
            }
            _ => Err(format!(
                "{s:?} is not a secret reference of the form namespace/secret-name/key"
            )),
        }
    }
}

/// Which plugins run, by name, as kube-controller-manager's `--controllers`: `*` every plugin not
/// named otherwise, `NAME` that plugin, `-NAME` not that plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    all: bool,
    on: Vec<String>,
    off: Vec<String>,
}

impl Default for ControllerSelection {
    fn default() -> Self {
        ControllerSelection {
            all: true,
            on: Vec::new(),
            off: Vec::new(),
        }
    }
}

impl ControllerSelection {
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut out = ControllerSelection {
            all: false,
            on: Vec::new(),
            off: Vec::new(),
        };
        for e in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if e == "*" {
                out.all = true;
                continue;
            }
            let (name, list) = match e.strip_prefix('-') {
                Some(n) => (n, &mut out.off),
                None => (e, &mut out.on),
            };
            crate::contract::validate::namespace(name).map_err(|_| {
                format!("{e:?} is not \"*\", a plugin name or -NAME (plugin names are DNS labels)")
            })?;
            list.push(name.to_string());
        }
        if let Some(both) = out.on.iter().find(|n| out.off.contains(n)) {
            return Err(format!("{both} is both enabled and disabled"));
        }
        Ok(out)
    }

    /// Whether plugin `name` runs.
    pub fn enables(&self, name: &str) -> bool {
        !self.off.iter().any(|n| n == name) && (self.all || self.on.iter().any(|n| n == name))
    }

    /// Names enabled explicitly, to tell the operator which of them no plugin file holds.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.on.iter().chain(&self.off).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn controllers_select_plugins_as_kube_controller_manager_does() {
        let sel = |v: &[&str]| {
            ControllerSelection::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        let all = sel(&["*"]).expect("valid");
        assert!(all.enables("network") && all.enables("pod-counter"));
        let some = sel(&["*", "-network"]).expect("valid");
        assert!(!some.enables("network") && some.enables("pod-counter"));
        let only = sel(&["network"]).expect("valid");
        assert!(only.enables("network") && !only.enables("pod-counter"));
        assert!(ControllerSelection::default().enables("anything"));
        for bad in [&["Bad_Name"][..], &["--x"], &["a", "-a"]] {
            assert!(sel(bad).is_err(), "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn full_file_parses() {
        let s = PluginSettings::parse(
            r#"
            workers = 3
            resync_seconds = 30
            cpu_deadline_ms = 250
            memory_mb = 32
            isolation = "worker"
            allowed_hosts = ["neutron:9696"]
            [config]
            label-key = "example.com/pods"
            [secrets]
            password = "openstack/neutron-credentials/password"
            "#,
        )
        .expect("valid");
        assert!(s.enabled());
        assert_eq!(s.workers, Some(3));
        assert_eq!(s.isolation, Some(Isolation::Worker));
        assert_eq!(
            s.config.get("label-key").map(String::as_str),
            Some("example.com/pods")
        );
        let l = s.limits(&Limits::default());
        assert_eq!(l.cpu_deadline, Duration::from_millis(250));
        assert_eq!(l.memory, 32 << 20);
    }

    #[test]
    fn mistakes_are_named() {
        let e = PluginSettings::parse("worker = 2").expect_err("unknown key");
        assert!(e.contains("worker"), "{e}");
        let e = PluginSettings::parse("enabled = true\nworkers = \"hunter2-secret\"")
            .expect_err("wrong type");
        assert!(e.starts_with("line 2"), "{e}");
        assert!(
            !e.contains("hunter2"),
            "a value from the file is echoed: {e}"
        );
        let e = PluginSettings::parse("[secrets]\npw = \"only/two\"").expect_err("bad ref");
        assert!(e.contains("secrets.pw"), "{e}");
        assert!(PluginSettings::parse("workers = 0").is_err());
        assert!(PluginSettings::parse("workers = \"two\"").is_err());
        assert!(PluginSettings::parse("isolation = \"none\"").is_err());
        assert!(PluginSettings::parse("max_watch_streams = 0").is_err());
    }

    #[test]
    fn the_http_rate_and_the_requeue_floor_are_the_flags_unless_the_operator_sets_them() {
        let defaults = BudgetSettings::default();
        let none = PluginSettings::parse("").expect("valid").budgets(&defaults);
        assert_eq!(
            (none.http_qps, none.http_burst, none.min_requeue_after),
            (20.0, 40, Duration::from_secs(1))
        );
        let set =
            PluginSettings::parse("http_qps = 2.5\nhttp_burst = 5\nmin_requeue_after_ms = 200")
                .expect("valid")
                .budgets(&defaults);
        assert_eq!(
            (set.http_qps, set.http_burst, set.min_requeue_after),
            (2.5, 5, Duration::from_millis(200))
        );
        for bad in ["http_qps = -1.0", "http_qps = nan", "http_burst = 0"] {
            assert!(PluginSettings::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_watch_stream_budget_is_the_flag_unless_the_operator_sets_it() {
        let defaults = BudgetSettings {
            max_watch_streams: 8,
            ..BudgetSettings::default()
        };
        let none = PluginSettings::parse("").expect("valid");
        assert_eq!(none.budgets(&defaults).max_watch_streams, 8);
        for n in [2, 40] {
            let s = PluginSettings::parse(&format!("max_watch_streams = {n}")).expect("valid");
            assert_eq!(s.budgets(&defaults).max_watch_streams, n);
        }
    }
}
