//! `flood`: a hostile plugin that tries to take more of the host than its budgets allow, in the
//! way the config key `mode` names. It watches the ConfigMaps of namespace `wcm-flood`, declares
//! `configmaps get, list`, asks for 4 workers and requeues every key after 1 ms, so it never rests:
//! - `events`: 1,000 events per reconcile, each with a 1 MiB note and its own object name and
//!   reason; one in ten has a bad reason, a bad name or an undeclared kind;
//! - `logs`: 4,000 log lines per reconcile, each a 64 KiB message full of newlines and escapes;
//! - `http`: 100 requests per reconcile over `wasi:http`, each to a new undeclared authority
//!   (`h<n>.invalid`);
//! - `api`: 20 `list` calls of the namespace's ConfigMaps per reconcile, as fast as the host
//!   answers.
//!
//! Any other mode does nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use wcm_sdk::{
    Action, Context, Description, Error, EventType, KindRef, ObjectKey, ObjectRef, Permission,
    Reconciler, Request, Watch,
};

pub const NAMESPACE: &str = "wcm-flood";

const EVENTS_PER_CALL: usize = 1_000;
const LOG_LINES_PER_CALL: usize = 4_000;
/// The host's default request cap per call: one more would be refused for that reason instead.
const HTTP_REQUESTS_PER_CALL: usize = 100;
const LISTS_PER_CALL: usize = 20;

struct Flood;

impl Reconciler for Flood {
    fn describe() -> Description {
        Description::new("flood", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().namespace(NAMESPACE))
            .permission(Permission::of::<ConfigMap>(&["get", "list"]))
            .workers(4)
            .config_key("mode")
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        if req.is_deleted() {
            return Ok(Action::done());
        }
        // A fresh instance per call: the clock, not a static counter, keeps names distinct.
        let base = unique_base();
        match ctx.config("mode").as_deref() {
            Some("events") => events(ctx, &req, base),
            Some("logs") => logs(ctx, base),
            Some("http") => http(base),
            Some("api") => api(ctx),
            _ => return Ok(Action::done()),
        }
        Ok(Action::requeue(Duration::from_millis(1)))
    }
}

fn unique_base() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn events(ctx: &Context, req: &Request, base: u64) {
    // 1 MiB exactly (the host's string cap), with 2-byte characters so that the host's 1 kB cut
    // falls inside one.
    let mut note = String::from("x");
    note.push_str(&"é".repeat(((1 << 20) - 1) / 2));
    let configmap = KindRef::of::<ConfigMap>();
    let secret = KindRef::of::<Secret>();
    let rec = ctx.recorder();
    for i in 0..EVENTS_PER_CALL {
        let n = format!("{base:x}-{i}");
        let object = |name: String| {
            ObjectRef::new(configmap.clone(), ObjectKey::namespaced(NAMESPACE, &name))
        };
        let (regarding, reason) = match i % 10 {
            // Refused by the host: a reason with a space and a newline...
            7 => (
                object(format!("{}-{n}", req.name())),
                format!("Bad reason\n{n}"),
            ),
            // ...a name that is no object name...
            8 => (object(format!("../{n}")), format!("Flood{n}")),
            // ...and a kind the plugin neither watches nor declared.
            9 => (
                ObjectRef::new(secret.clone(), ObjectKey::namespaced(NAMESPACE, &n)),
                format!("Flood{n}"),
            ),
            // Valid, and each one new to the host's bookkeeping.
            _ => (object(format!("{}-{n}", req.name())), format!("Flood{n}")),
        };
        rec.publish(&regarding, EventType::Warning, &reason, "Flood", &note);
    }
}

fn logs(ctx: &Context, base: u64) {
    // 64 KiB of short lines with terminal escapes: each call must stay one escaped host line.
    let mut message = String::with_capacity(64 << 10);
    while message.len() + 40 <= 64 << 10 {
        message.push_str("forged\nlevel=ERROR \x1b[31mmsg=spoofed\r\n");
    }
    while message.len() < 64 << 10 {
        message.push('.');
    }
    let log = ctx.log();
    for i in 0..LOG_LINES_PER_CALL {
        let n = format!("{base:x}-{i}");
        log.warn(
            &message,
            &[("n", &n), ("forged", "x\nERROR plugin=someone-else")],
        );
    }
}

fn http(base: u64) {
    for i in 0..HTTP_REQUESTS_PER_CALL {
        // Every outcome is some refusal; the plugin carries on regardless.
        let _ = get(&format!("h{base:x}-{i}.invalid"));
    }
}

fn api(ctx: &Context) {
    let cms = ctx.api_namespaced::<ConfigMap>(NAMESPACE);
    for _ in 0..LISTS_PER_CALL {
        // Errors (a timeout, a throttled server) change nothing: the flood goes on.
        let _ = cms.list(None);
    }
}

/// GET http://`authority`/; the response status.
#[cfg(target_arch = "wasm32")]
fn get(authority: &str) -> Result<u16, String> {
    use wasip2::http::outgoing_handler::handle;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};

    let request = OutgoingRequest::new(Fields::new());
    request
        .set_scheme(Some(&Scheme::Http))
        .map_err(|_| "scheme")?;
    request
        .set_authority(Some(authority))
        .map_err(|_| "authority")?;
    request.set_path_with_query(Some("/")).map_err(|_| "path")?;
    let pending = handle(request, None).map_err(|e| format!("{e:?}"))?;
    pending.subscribe().block();
    let response = pending
        .get()
        .ok_or("no response")?
        .map_err(|_| "response taken")?
        .map_err(|e| format!("{e:?}"))?;
    Ok(response.status())
}

#[cfg(not(target_arch = "wasm32"))]
fn get(_authority: &str) -> Result<u16, String> {
    Err("outbound HTTP exists only in the wasm build".into())
}

wcm_sdk::export_plugin!(Flood);
