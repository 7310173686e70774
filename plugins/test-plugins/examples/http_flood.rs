//! `http-flood`: a hostile plugin that tries to flood an outbound host it is allowed to reach.
//! For each ConfigMap labelled `wcm.test/http-flood` it sends `requests` GETs (config key, default
//! 100: the host's cap per call) to the URL of config key `url`, each with `?r=<reconcile>&i=<n>`
//! so the server can tell reconciles apart, and asks to be called again after 1 ms, so it never
//! rests. It asks for 4 workers. Only ConfigMaps in the namespace of config key `namespace` are
//! flooded for (others are done at once), so tests running side by side keep their floods apart. When the host refuses a request for its rate, it sets annotation
//! `wcm.test/http-flood` to `rate-limited: <the error>` (once: the same text is not written again).
//! Config key `timeout-ms` gives each request a timeout (connect, DNS lookup included), so a flood
//! of requests to a name that never resolves moves on from one to the next. Besides `127.0.0.1`
//! it declares the host `never-answers.test`, a name for tests whose DNS server never answers.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use wcm_sdk::{Action, Context, Description, Error, Permission, Reconciler, Request, Watch};

struct HttpFlood;

impl Reconciler for HttpFlood {
    fn describe() -> Description {
        Description::new("http-flood", test_plugins::VERSION)
            .primary(Watch::of::<ConfigMap>().label_selector("wcm.test/http-flood"))
            .permission(Permission::of::<ConfigMap>(&["get", "patch"]))
            .outbound_host("127.0.0.1")
            .outbound_host("never-answers.test")
            .workers(4)
            .config_key("url")
            .config_key("requests")
            .config_key("namespace")
            .config_key("timeout-ms")
    }

    fn reconcile(ctx: &Context, req: Request) -> Result<Action, Error> {
        let Some(cm) = req.object::<ConfigMap>()? else {
            return Ok(Action::done());
        };
        if ctx.config("namespace").as_deref() != req.namespace() {
            return Ok(Action::done());
        }
        let url = ctx.config("url").unwrap_or_default();
        let requests: u32 = ctx
            .config("requests")
            .and_then(|r| r.parse().ok())
            .unwrap_or(100);
        let reconcile = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let timeout = ctx
            .config("timeout-ms")
            .and_then(|t| t.parse().ok())
            .map(Duration::from_millis);
        let mut refused = None;
        for i in 0..requests {
            let mut request = ctx.http().get(format!("{url}?r={reconcile}&i={i}"));
            if let Some(t) = timeout {
                request = request.timeout(t);
            }
            if let Err(e) = request.send() {
                // The text without the URL, which differs per request.
                let text = e.message().split_once(": ").map_or(e.message(), |(_, t)| t);
                if text.contains("rate limited") && refused.is_none() {
                    refused = Some(
                        text.chars()
                            .filter(|c| !c.is_control())
                            .take(300)
                            .collect::<String>(),
                    );
                }
            }
        }
        if let Some(text) = refused {
            test_plugins::annotate(
                ctx,
                &cm,
                "wcm.test/http-flood",
                &format!("rate-limited: {text}"),
            )?;
        }
        Ok(Action::requeue(Duration::from_millis(1)))
    }
}

wcm_sdk::export_plugin!(HttpFlood);
