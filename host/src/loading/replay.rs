//! `wasm-controller-manager replay RECORDING PLUGIN.wasm`: runs a component against a recorded
//! reconcile (`--record-dir`) with no cluster and no network, every host call answered from the
//! recording, and reports what it did and where that differs from what was recorded.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::{Value, json};

use crate::sandbox::Limits;
use crate::sandbox::tape::{Exchange, Recording, summary};

/// What a replay found.
pub struct ReplayReport {
    pub text: String,
    /// The same calls, in the same order, and the same result as recorded.
    pub same: bool,
}

/// Replays `recording` with the component in `plugin`.
pub async fn replay(
    recording: &Path,
    plugin: &Path,
    json_out: bool,
    compile_cache: Option<PathBuf>,
) -> Result<ReplayReport> {
    let rec = Recording::read(recording)?;
    if rec.calls_left_out > 0 {
        anyhow::bail!(
            "{} was cut short at its size bound ({} calls left out): it cannot be replayed whole",
            recording.display(),
            rec.calls_left_out
        );
    }
    let (runtime, compiled) = super::inspect::compile_file(plugin, compile_cache)?;
    let (result, replay) = runtime.replay(&compiled, &rec, &Limits::default()).await;
    let mut differences = replay.differences.clone();
    if result != rec.result {
        differences.push(format!("result {result}, recorded {}", rec.result));
    }
    let same = differences.is_empty();
    let text = if json_out {
        serde_json::to_string_pretty(&json!({
            "plugin": rec.plugin,
            "recordedSha256": rec.sha256,
            "sha256": compiled.sha256,
            "calls": replay.made,
            "result": result,
            "recordedResult": rec.result,
            "differences": differences,
            "same": same,
        }))? + "\n"
    } else {
        let mut out = String::new();
        let key = match &rec.request.namespace {
            Some(ns) => format!("{ns}/{}", rec.request.name),
            None => rec.request.name.clone(),
        };
        out += &format!(
            "recording: {} (plugin {}, key {key}, attempt {})\n",
            recording.display(),
            rec.plugin,
            rec.request.attempt
        );
        out += &format!(
            "component: {} (sha256 {})",
            plugin.display(),
            compiled.sha256
        );
        if compiled.sha256 != rec.sha256 {
            out += &format!(", not the build that was recorded ({})", rec.sha256);
        }
        out += "\n";
        if rec.reused_instance {
            out += "note: recorded in an instance that had served earlier calls; what it kept from them (a cached token, say) is not in the recording, and may make the replay differ\n";
        }
        out += &format!("calls ({}):\n", replay.made.len());
        for (i, call) in replay.made.iter().enumerate() {
            out += &format!(
                "  {:>3}. {} → {}\n",
                i + 1,
                summary(call),
                answer_summary(call)
            );
        }
        out += &format!("result: {result}\n");
        if same {
            out += "same calls and result as recorded\n";
        } else {
            out += &format!("differs from the recording ({}):\n", differences.len());
            for d in &differences {
                out += &format!("  - {d}\n");
            }
        }
        out
    };
    Ok(ReplayReport { text, same })
}

/// A short form of an answer: sizes rather than bodies.
fn answer_summary(e: &Exchange) -> String {
    match &e.answer {
        Value::Null => "-".into(),
        Value::String(s) => format!("{} bytes", s.len()),
        Value::Object(o) => match (o.get("ok"), o.get("error")) {
            (Some(Value::String(s)), _) => format!("ok, {} bytes", s.len()),
            (Some(Value::Array(a)), _) => format!("ok, {} items", a.len()),
            (_, Some(Value::Object(err))) => format!(
                "error {} {}",
                err.get("code").unwrap_or(&Value::Null),
                err.get("reason").and_then(Value::as_str).unwrap_or("")
            ),
            (_, Some(err)) => format!("error {err}"),
            _ if o.contains_key("placeholder") => "a secret (redacted)".into(),
            _ => e.answer.to_string(),
        },
        other => other.to_string(),
    }
}
