//! `wasm-controller-manager inspect PLUGIN.wasm`: what a plugin declares, without a cluster.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::sandbox::{Limits, Mapping, Runtime, RuntimeSettings, Watch};
use crate::services::Services;

/// Loads, compiles and describes a plugin; returns the report as text (or JSON).
pub async fn inspect(path: &Path, json: bool) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let runtime = Runtime::new(RuntimeSettings {
        max_instances: 4,
        ..Default::default()
    })?;
    let compiled = runtime
        .compile(&bytes)
        .with_context(|| format!("{} is not a usable plugin", path.display()))?;
    let engine = runtime.engine();
    let ty = compiled.component.component_type();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let services = Arc::new(Services::for_describe("inspect", BTreeMap::new()));
    let d = runtime
        .describe(&compiled, services, &Limits::default())
        .await
        .map_err(|e| anyhow::anyhow!("{}: describe failed: {e}", path.display()))?;
    crate::plugins::validate(&d)
        .with_context(|| format!("{} declares something invalid", path.display()))?;

    let watch = |w: &Watch| -> serde_json::Value {
        serde_json::json!({
            "group": w.kind.group, "version": w.kind.version, "kind": w.kind.kind,
            "namespace": w.namespace, "labelSelector": w.label_selector, "metadataOnly": w.metadata_only,
        })
    };
    let report = serde_json::json!({
        "file": path.display().to_string(),
        "sizeBytes": compiled.size,
        "sha256": compiled.sha256,
        "compileMillis": compiled.load_time.as_secs_f64() * 1000.0,
        "name": d.name,
        "version": d.version,
        "primary": watch(&d.primary),
        "secondaries": d.secondaries.iter().map(|s| {
            let mut v = watch(&s.watch);
            v["mapping"] = match &s.mapping {
                Mapping::ControllerOwner => "controller-owner".into(),
                Mapping::SameKey => "same-key".into(),
                Mapping::FixedKey(k) => format!("fixed-key {}{}", k.namespace.as_deref().map(|n| format!("{n}/")).unwrap_or_default(), k.name).into(),
            };
            v
        }).collect::<Vec<_>>(),
        "resyncSeconds": d.resync_seconds,
        "workers": d.workers,
        "permissions": d.permissions.iter().map(|p| serde_json::json!({"group": p.group, "resource": p.resource, "verbs": p.verbs})).collect::<Vec<_>>(),
        "outboundHosts": d.outbound_hosts,
        "configKeys": d.config_keys,
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
        "compile",
        format!("{:.1} ms", compiled.load_time.as_secs_f64() * 1000.0),
    );
    line(&mut out, "primary", fmt_watch(&d.primary));
    for s in &d.secondaries {
        let m = report["secondaries"]
            .as_array()
            .and_then(|a| a.iter().find(|v| v["kind"] == s.watch.kind.kind))
            .map(|v| v["mapping"].to_string())
            .unwrap_or_default();
        line(
            &mut out,
            "secondary",
            format!("{} → {m}", fmt_watch(&s.watch)),
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
    for i in &imports {
        line(&mut out, "import", i.clone());
    }
    for e in &exports {
        line(&mut out, "export", e.clone());
    }
    Ok(out)
}

fn fmt_watch(w: &Watch) -> String {
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
