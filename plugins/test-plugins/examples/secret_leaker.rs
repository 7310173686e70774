//! `secret-leaker`: a hostile plugin that tries to get its secret settings (`quote`, `backslash`,
//! `four`, from a Secret named in `secret-leaker.toml`) into a recording of its reconciles. On the
//! ConfigMap `leak-target` (labelled `wcm.test/leak=yes`) it logs each value base64-encoded (standard and URL-safe), hex-encoded,
//! reversed, split in two lines and one character per line; writes it raw and encoded into the
//! ConfigMap's annotations (`wcm.test/leak-NAME-FORM`, so a test sees the plugin held the real
//! values); and fails with an error that holds it. A test plugin only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use wcm_sdk::{Action, Context, Description, Error, Patch, Permission, Reconciler, Request, Watch};

const TARGET: &str = "leak-target";
const NAMES: [&str; 3] = ["quote", "backslash", "four"];
const DONE: &str = "wcm.test/leaked";

fn base64(bytes: &[u8], url: bool, pad: bool) -> String {
    let alphabet: &[u8; 64] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 63) as usize]));
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn percent(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

struct SecretLeaker;

impl Reconciler for SecretLeaker {
    fn describe() -> Description {
        // Only its own ConfigMaps: the shared test cluster has many others.
        Description::new("secret-leaker", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.test/leak=yes"))
            .permission(Permission::of::<ConfigMap>(&["patch"]))
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        if cm.metadata.name.as_deref() != Some(TARGET) {
            return Ok(Action::done());
        }
        let log = ctx.log();
        let mut annotations = BTreeMap::new();
        let mut all = Vec::new();
        for name in NAMES {
            let Some(s) = ctx.secret(name) else {
                continue;
            };
            let b = s.as_bytes();
            log.info(
                &format!("base64 {}", base64(b, false, true)),
                &[
                    ("url", &base64(b, true, false)),
                    ("hex", &hex(b)),
                    ("raw", &s),
                ],
            );
            let reversed: String = s.chars().rev().collect();
            log.warn(&reversed, &[]);
            let half = s
                .char_indices()
                .nth(s.chars().count() / 2)
                .map_or(0, |(i, _)| i);
            log.info(&s[..half], &[]);
            log.info(&s[half..], &[]);
            for c in s.chars() {
                log.info(&c.to_string(), &[]);
            }
            for (form, value) in [
                ("raw", s.clone()),
                ("b64", base64(b, false, true)),
                ("b64url", base64(b, true, false)),
                ("hex", hex(b).to_uppercase()),
                ("pct", percent(b)),
            ] {
                annotations.insert(format!("wcm.test/leak-{name}-{form}"), value);
            }
            all.push(format!("{s} (reversed {reversed})"));
        }
        let leaked = cm
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(DONE));
        if !leaked && !all.is_empty() {
            annotations.insert(DONE.to_string(), "yes".to_string());
            ctx.api_namespaced::<ConfigMap>(req.namespace().unwrap_or_default())
                .patch(
                    req.name(),
                    &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
                )?;
        }
        Err(Error::terminal(format!("leaking {}", all.join(", "))))
    }
}

wcm_sdk::export_plugin!(SecretLeaker);
