//! `wasm-controller-manager inspect PLUGIN.wasm`: what a plugin declares, without a cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::cluster::services::Services;
use crate::contract::mapping::{self, ExtraMapping};
use crate::contract::{Description, Mapping, Watch};
use crate::loading::files;
use crate::loading::settings::PluginSettings;
use crate::sandbox::{Compiled, Limits, Runtime, RuntimeSettings};

/// A plugin file compiled and described, with the settings beside it (NAME.toml), as the loader
/// would see it.
pub struct Described {
    pub compiled: Compiled,
    pub description: Description,
    pub settings: PluginSettings,
    imports: Vec<String>,
    exports: Vec<String>,
}

/// A runtime for one offline command, and the plugin file compiled in it.
pub(crate) fn compile_file(
    path: &Path,
    compile_cache: Option<PathBuf>,
) -> Result<(Runtime, Compiled)> {
    // Read as the loader reads its directory: regular files only (a FIFO or a device is refused,
    // not read), inside the file's own directory, size-capped.
    let bytes = files::read_plugin_file(dir_of(path), path, MAX_FILE_BYTES)
        .map_err(|e| anyhow::anyhow!("read {}: {e}", path.display()))?;
    let runtime = Runtime::new(RuntimeSettings {
        max_instances: 4,
        compile_cache,
        ..Default::default()
    })?;
    let compiled = runtime
        .compile(&bytes)
        .with_context(|| format!("{} is not a usable plugin", path.display()))?;
    Ok((runtime, compiled))
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Compiles and describes a plugin file without a cluster (its NAME.toml's config and name apply).
pub async fn describe_file(path: &Path, compile_cache: Option<PathBuf>) -> Result<Described> {
    let dir = dir_of(path);
    let settings_path = path.with_extension("toml");
    let settings = match files::read_settings_file(dir, &settings_path, 64 << 10)
        .map_err(|e| anyhow::anyhow!("read {}: {e}", settings_path.display()))?
    {
        Some(text) => PluginSettings::parse(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", settings_path.display()))?,
        None => PluginSettings::default(),
    };
    let (runtime, compiled) = compile_file(path, compile_cache)?;
    let engine = runtime.engine();
    let ty = compiled.component.component_type();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let services = Arc::new(Services::for_describe("inspect", settings.config.clone()));
    let mut d = runtime
        .describe(&compiled, services, &Limits::default())
        .await
        .map_err(|e| anyhow::anyhow!("{}: describe failed: {e}", path.display()))?;
    if let Some(name) = &settings.name {
        d.name = name.clone();
    }
    crate::contract::validate::description(&d)
        .map_err(|e| anyhow::anyhow!("{} declares something invalid: {e}", path.display()))?;
    Ok(Described {
        compiled,
        description: d,
        settings,
        imports,
        exports,
    })
}

/// Largest plugin file these commands read (as `run --max-plugin-bytes`' default).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// Loads, compiles and describes a plugin; returns the report as text (or JSON).
pub async fn inspect(path: &Path, json: bool) -> Result<String> {
    let Described {
        compiled,
        description: d,
        imports,
        exports,
        settings,
    } = describe_file(path, None).await?;
    let watch = |w: &Watch| -> serde_json::Value {
        serde_json::json!({
            "group": w.kind.group, "version": w.kind.version, "kind": w.kind.kind,
            "namespace": w.namespace, "labelSelector": w.label_selector, "metadataOnly": w.metadata_only,
        })
    };
    // Checked when the file was described: a description that got here has valid mappings.
    let extended = mapping::mappings(&d).unwrap_or_else(|_| vec![None; d.secondaries.len()]);
    let declared_isolation =
        crate::contract::isolation::declared(&d)
            .ok()
            .flatten()
            .map(|i| match i {
                crate::contract::isolation::Isolation::Call => "call",
                crate::contract::isolation::Isolation::Worker => "worker",
            });
    let report = serde_json::json!({
        "file": path.display().to_string(),
        "sizeBytes": compiled.size,
        "sha256": compiled.sha256,
        "contract": compiled.contract_version(),
        "compileMillis": compiled.load_time.as_secs_f64() * 1000.0,
        "compilePeakRssBytes": compiled.compile_peak,
        "processPeakRssBytes": crate::sandbox::compiler::peak_rss_of_this_process(),
        "name": d.name,
        "version": d.version,
        "primary": watch(&d.primary),
        "secondaries": d.secondaries.iter().zip(extended).map(|(s, extended)| {
            let mut v = watch(&s.watch);
            v["mapping"] = match (extended, &s.mapping) {
                (Some(ExtraMapping::AnyOwner), _) => "any-owner".into(),
                (Some(ExtraMapping::Label(key)), _) => format!("label {key}").into(),
                (None, Mapping::ControllerOwner) => "controller-owner".into(),
                (None, Mapping::SameKey) => "same-key".into(),
                (None, Mapping::FixedKey(k)) => format!("fixed-key {}{}", k.namespace.as_deref().map(|n| format!("{n}/")).unwrap_or_default(), k.name).into(),
            };
            v
        }).collect::<Vec<_>>(),
        "resyncSeconds": d.resync_seconds,
        "workers": d.workers,
        "isolation": declared_isolation,
        "shards": settings.sharding().map(|(n, by)| serde_json::json!({"count": n, "by": by})),
        "permissions": d.permissions.iter().map(|p| serde_json::json!({"group": p.group, "resource": p.resource, "verbs": p.verbs})).collect::<Vec<_>>(),
        "outboundHosts": d.outbound_hosts,
        "configKeys": d.config_keys,
        "schedules": d.schedules.iter().map(|s| serde_json::json!({
            "name": s.name,
            "cron": s.cron,
            "timeZone": s.time_zone.clone().unwrap_or_else(|| "UTC".into()),
            "enqueues": schedule_key(s),
            "jitterSeconds": s.jitter_seconds,
            "catchUpSeconds": s.catch_up_seconds,
        })).collect::<Vec<_>>(),
        "metrics": d.metrics.iter().map(|m| serde_json::json!({
            "name": m.name,
            "exportedAs": metric_name(&d.name, m),
            "kind": format!("{:?}", m.kind).to_lowercase(),
            "help": m.help,
            "labels": m.labels,
            "buckets": m.buckets,
        })).collect::<Vec<_>>(),
        "propagateTraceContext": d.propagate_trace_context,
        "extensions": d.extensions.iter().cloned().collect::<BTreeMap<_, _>>(),
        "imports": imports,
        "exports": exports,
    });
    if json {
        return Ok(serde_json::to_string_pretty(&report)?);
    }
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
    line(&mut out, "plugin", format!("{} {}", d.name, d.version));
    line(
        &mut out,
        "file",
        format!(
            "{} ({} bytes, sha256 {})",
            path.display(),
            compiled.size,
            compiled.sha256
        ),
    );
    line(
        &mut out,
        "contract",
        compiled.contract_version().to_string(),
    );
    line(
        &mut out,
        "compile",
        match compiled.compile_peak {
            Some(peak) => format!(
                "{:.1} ms, in a child process: peak RSS {:.1} MiB",
                compiled.load_time.as_secs_f64() * 1000.0,
                peak as f64 / f64::from(1 << 20)
            ),
            None => format!("{:.1} ms", compiled.load_time.as_secs_f64() * 1000.0),
        },
    );
    // Checked when the file was described: a description that got here has valid filters.
    let filters = crate::contract::change_filter::filters(&d).unwrap_or_default();
    let filter_of = |i: usize| filters.get(i).copied().unwrap_or_default();
    line(
        &mut out,
        "primary",
        format!("{}{}", fmt_watch(&d.primary), fmt_filter(filter_of(0))),
    );
    for (i, s) in d.secondaries.iter().enumerate() {
        let m = report["secondaries"]
            .as_array()
            .and_then(|a| a.iter().find(|v| v["kind"] == s.watch.kind.kind))
            .map(|v| v["mapping"].to_string())
            .unwrap_or_default();
        line(
            &mut out,
            "secondary",
            format!(
                "{} → {m}{}",
                fmt_watch(&s.watch),
                fmt_filter(filter_of(i + 1))
            ),
        );
    }
    line(
        &mut out,
        "resync",
        d.resync_seconds
            .map(|s| format!("{s} s"))
            .unwrap_or_else(|| "none".into()),
    );
    line(
        &mut out,
        "workers",
        d.workers
            .map(|w| w.to_string())
            .unwrap_or_else(|| "host default".into()),
    );
    line(
        &mut out,
        "isolation",
        match declared_isolation {
            Some(i) => format!("{i} (declared; NAME.toml may override)"),
            None => "call (host default; NAME.toml may override)".into(),
        },
    );
    line(
        &mut out,
        "shards",
        match settings.sharding() {
            Some((n, by)) => format!(
                "{n} ranges by {by} (NAME.toml; with --leader-elect-mode per-plugin, replicas share them)"
            ),
            None => "none (one replica reconciles every key)".into(),
        },
    );
    for p in &d.permissions {
        line(
            &mut out,
            "permission",
            format!(
                "{} {} ({})",
                p.verbs.join(","),
                p.resource,
                if p.group.is_empty() { "core" } else { &p.group }
            ),
        );
    }
    for h in &d.outbound_hosts {
        line(&mut out, "host", h.clone());
    }
    if !d.config_keys.is_empty() {
        line(&mut out, "config keys", d.config_keys.join(", "));
    }
    for s in &d.schedules {
        let mut v = format!(
            "{} \"{}\" ({}) → {}",
            s.name,
            s.cron,
            s.time_zone.as_deref().unwrap_or("UTC"),
            schedule_key(s)
        );
        if s.jitter_seconds > 0 {
            v.push_str(&format!(", jitter ≤ {} s", s.jitter_seconds));
        }
        v.push_str(&match s.catch_up_seconds {
            0 => ", missed ticks skipped".to_string(),
            n => format!(", catch-up ≤ {n} s"),
        });
        line(&mut out, "schedule", v);
    }
    for m in &d.metrics {
        let mut v = format!(
            "{} ({})",
            metric_name(&d.name, m),
            format!("{:?}", m.kind).to_lowercase()
        );
        if !m.labels.is_empty() {
            v.push_str(&format!(" {{{}}}", m.labels.join(",")));
        }
        line(&mut out, "metric", v);
    }
    if d.propagate_trace_context {
        line(
            &mut out,
            "tracing",
            "outbound HTTP carries the trace context".into(),
        );
    }
    for i in &imports {
        line(&mut out, "import", i.clone());
    }
    for e in &exports {
        line(&mut out, "export", e.clone());
    }
    Ok(out)
}

/// What a schedule's tick enqueues.
fn schedule_key(s: &crate::contract::Schedule) -> String {
    match &s.key {
        Some(k) => match &k.namespace {
            Some(ns) => format!("{ns}/{}", k.name),
            None => k.name.clone(),
        },
        None => "every primary object".into(),
    }
}

/// The name a plugin metric is exported under.
fn metric_name(plugin: &str, m: &crate::contract::Metric) -> String {
    let suffix = if m.kind == crate::contract::MetricKind::Counter {
        "_total"
    } else {
        ""
    };
    format!(
        "wcm_plugin_{}__{}{suffix}",
        plugin.replace('-', "_"),
        m.name
    )
}

/// What wakes the plugin beyond creations, deletions and resyncs, when a watch filters updates.
fn fmt_filter(f: crate::contract::change_filter::ChangeFilter) -> &'static str {
    use crate::contract::change_filter::ChangeFilter;
    match f {
        ChangeFilter::All => "",
        ChangeFilter::IgnoreStatus => " {changes: ignore-status: status-only updates do not wake}",
        ChangeFilter::Generation => {
            " {changes: generation: only spec, deletion and finalizer changes wake}"
        }
    }
}

pub(crate) fn fmt_watch(w: &Watch) -> String {
    let mut s = if w.kind.group.is_empty() {
        format!("{}/{}", w.kind.version, w.kind.kind)
    } else {
        format!("{}/{}/{}", w.kind.group, w.kind.version, w.kind.kind)
    };
    if let Some(ns) = &w.namespace {
        s.push_str(&format!(" in {ns}"));
    }
    if let Some(sel) = &w.label_selector {
        s.push_str(&format!(" [{sel}]"));
    }
    if w.metadata_only {
        s.push_str(" (metadata only)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::change_filter::ChangeFilter;

    #[test]
    fn the_text_report_shows_each_watchs_change_filter() {
        assert_eq!(fmt_filter(ChangeFilter::All), "");
        assert!(fmt_filter(ChangeFilter::IgnoreStatus).contains("ignore-status"));
        assert!(fmt_filter(ChangeFilter::Generation).contains("generation"));
    }
}
