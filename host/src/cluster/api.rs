//! API calls made on behalf of plugins: kinds resolved through discovery, one shared client with a
//! client-side QPS/burst limit, a timeout per request, and errors turned into the structured
//! `api-error` of the WIT.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};

use super::discovery::{Discovery, Resolved};
use super::tenure::{Cut, Tenure};
use crate::contract::{KindRef, PatchType, Propagation};
use crate::engine::rate_limit::TokenBucket;

/// What an API call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Create,
    Update,
    Patch(PatchKind),
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl From<PatchType> for PatchKind {
    fn from(p: PatchType) -> Self {
        match p {
            PatchType::Merge => PatchKind::Merge,
            PatchType::Json => PatchKind::Json,
            PatchType::Strategic => PatchKind::Strategic,
            PatchType::Apply => PatchKind::Apply,
        }
    }
}

impl Verb {
    /// The RBAC verb.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch(_) => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// One API call as a plugin asked for it.
#[derive(Debug, Clone, Copy)]
pub struct ApiRequest<'a> {
    pub verb: Verb,
    pub kind: &'a KindRef,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
    /// The JSON body; for a list, the label selector.
    pub body: Option<&'a str>,
    /// What the plugin asked beyond the verb (validated before the call).
    pub options: &'a CallOptions,
}

/// The options of a call (`list-options`, `patch-options`, `delete-options` of the contract);
/// each applies only to its verbs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallOptions {
    pub field_selector: Option<String>,
    pub limit: Option<u32>,
    pub continue_token: Option<String>,
    /// Appended to the plugin's name: the field manager is `wcm:NAME:SUFFIX`.
    pub field_manager_suffix: Option<String>,
    /// Server-side apply only.
    pub force: bool,
    pub dry_run: bool,
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

impl CallOptions {
    /// No options (a 0.1.0 call means these, except that its server-side apply is forced).
    pub const NONE: &'static CallOptions = &CallOptions {
        field_selector: None,
        limit: None,
        continue_token: None,
        field_manager_suffix: None,
        force: false,
        dry_run: false,
        propagation: None,
        precondition_uid: None,
        precondition_resource_version: None,
    };

    /// The field manager of the plugin's writes: `wcm:NAME`, or `wcm:NAME:SUFFIX`. The fixed
    /// prefix and the `:` (which neither a plugin name nor a suffix holds) keep a plugin from
    /// writing as another controller (`kube-controller-manager`) or as another plugin.
    pub fn field_manager(&self, plugin: &str) -> String {
        match &self.field_manager_suffix {
            Some(suffix) => format!("{FIELD_MANAGER_PREFIX}{plugin}:{suffix}"),
            None => format!("{FIELD_MANAGER_PREFIX}{plugin}"),
        }
    }
}

/// What every field manager of a plugin starts with.
pub const FIELD_MANAGER_PREFIX: &str = "wcm:";

/// The longest field-manager suffix: with the prefix, a plugin name (a DNS label of at most 63)
/// and the `:`, the API server's 128.
pub const MAX_FIELD_MANAGER_SUFFIX: usize = 128 - FIELD_MANAGER_PREFIX.len() - 63 - 1;
const _: () = assert!(MAX_FIELD_MANAGER_SUFFIX == wcm_validate::MAX_FIELD_MANAGER_SUFFIX);

/// An API error as the plugin sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiFailure {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiFailure {
            code,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn forbidden(plugin: &str, verb: &str, group: &str, resource: &str) -> Self {
        let group = if group.is_empty() { "core" } else { group };
        Self::new(
            403,
            "NotDeclared",
            format!(
                "plugin {plugin} did not declare permission to {verb} {resource} (group {group}) in describe"
            ),
        )
    }

    /// A write from a replica that no longer leads the plugin: not sent.
    pub fn not_leader() -> Self {
        Self::new(
            503,
            "NotLeader",
            "this replica no longer leads: the write was not sent (the key is retried by the leader)",
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    pub fn unavailable(message: &str) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn from_kube(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => ApiFailure {
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => ApiFailure::new(0, "ServiceUnavailable", format!("{other}")),
        }
    }
}

/// What API calls on behalf of plugins share: discovery, the client-side limit of all plugins
/// together, and the timeout. The calls themselves go out with each plugin's own client.
#[derive(Clone)]
pub struct ApiAccess {
    discovery: Arc<Discovery>,
    limit: Arc<TokenBucket>,
    timeout: Duration,
}

impl ApiAccess {
    pub fn new(client: kube::Client, limit: Arc<TokenBucket>, timeout: Duration) -> Self {
        ApiAccess {
            discovery: Arc::new(Discovery::new(client, timeout)),
            limit,
            timeout,
        }
    }

    pub fn discovery(&self) -> &Arc<Discovery> {
        &self.discovery
    }

    /// Finds the plural and scope of a kind (cached per group).
    pub async fn resolve(&self, kind: &KindRef) -> Result<Resolved, ApiFailure> {
        self.discovery.resolve(kind).await
    }

    fn api(
        client: &kube::Client,
        r: &Resolved,
        namespace: Option<&str>,
    ) -> Result<Api<DynamicObject>, ApiFailure> {
        match (r.namespaced, namespace) {
            (true, Some(ns)) => Ok(Api::namespaced_with(client.clone(), ns, &r.resource)),
            (true, None) | (false, None) => Ok(Api::all_with(client.clone(), &r.resource)),
            (false, Some(_)) => Err(ApiFailure::bad_request(format!(
                "{} is cluster-scoped: give no namespace",
                r.plural
            ))),
        }
    }

    /// Makes one API call with `client` (the plugin's identity); bodies and answers are JSON text.
    /// A write passes its `tenure`: it is sent only if this replica still leads the plugin once
    /// its turn in the host-wide bucket comes (a Lease may move while it waits), and it is cut at
    /// the end of that tenure, so it is never in flight after another replica may lead.
    pub async fn call(
        &self,
        client: &kube::Client,
        plugin: &str,
        r: &Resolved,
        req: &ApiRequest<'_>,
        tenure: Option<&Arc<Tenure>>,
    ) -> Result<String, ApiFailure> {
        self.limit.acquire().await;
        let pass = match tenure {
            Some(t) => Some(t.begin().ok_or_else(ApiFailure::not_leader)?),
            None => None,
        };
        let fut = Self::call_inner(client, plugin, r, req);
        let out = match &pass {
            Some(p) => p.run(self.timeout, fut).await,
            None => tokio::time::timeout(self.timeout, fut)
                .await
                .map_err(|_| Cut { by_tenure: false }),
        };
        match out {
            Ok(r) => r,
            Err(Cut { by_tenure: true }) => Err(ApiFailure::new(
                0,
                "Timeout",
                "no answer from the API server before this replica's lease ran out: the write \
                 was abandoned (the key is retried by the leader)",
            )),
            Err(Cut { by_tenure: false }) => Err(ApiFailure::new(
                0,
                "Timeout",
                format!("no answer from the API server within {:?}", self.timeout),
            )),
        }
    }

    async fn call_inner(
        client: &kube::Client,
        plugin: &str,
        r: &Resolved,
        req: &ApiRequest<'_>,
    ) -> Result<String, ApiFailure> {
        let ApiRequest {
            verb,
            namespace,
            name,
            subresource,
            body,
            options,
            ..
        } = *req;
        let manager = options.field_manager(plugin);
        let own = CallOptions::NONE.field_manager(plugin);
        let dry_run = options.dry_run;
        let api = Self::api(client, r, namespace)?;
        let name = || name.ok_or_else(|| ApiFailure::bad_request("a name is required"));
        let json = || -> Result<serde_json::Value, ApiFailure> {
            serde_json::from_str(body.unwrap_or(""))
                .map_err(|e| ApiFailure::bad_request(format!("the body is not valid JSON: {e}")))
        };
        let to_text = |v: &dyn erased::Ser| {
            v.to_json()
                .map_err(|e| ApiFailure::new(500, "InternalError", e.to_string()))
        };
        let k = ApiFailure::from_kube;
        match verb {
            Verb::Get => to_text(&api.get(name()?).await.map_err(k)?),
            Verb::List => {
                let mut lp = ListParams::default();
                if let Some(sel) = body.filter(|s| !s.is_empty()) {
                    lp = lp.labels(sel);
                }
                if let Some(sel) = options.field_selector.as_deref().filter(|s| !s.is_empty()) {
                    lp = lp.fields(sel);
                }
                if let Some(limit) = options.limit {
                    lp = lp.limit(limit);
                }
                if let Some(token) = &options.continue_token {
                    lp = lp.continue_token(token);
                }
                to_text(&api.list(&lp).await.map_err(k)?)
            }
            Verb::Create => {
                let obj: DynamicObject = serde_json::from_value(json()?)
                    .map_err(|e| ApiFailure::bad_request(format!("not an object: {e}")))?;
                to_text(
                    &api.create(
                        &PostParams {
                            field_manager: Some(own),
                            ..Default::default()
                        },
                        &obj,
                    )
                    .await
                    .map_err(k)?,
                )
            }
            Verb::Update => {
                let obj: DynamicObject = serde_json::from_value(json()?)
                    .map_err(|e| ApiFailure::bad_request(format!("not an object: {e}")))?;
                let pp = PostParams {
                    field_manager: Some(own),
                    ..Default::default()
                };
                let out = match subresource {
                    Some("status") => api.replace_status(name()?, &pp, &obj).await,
                    _ => api.replace(name()?, &pp, &obj).await,
                };
                to_text(&out.map_err(k)?)
            }
            Verb::Patch(kind) => {
                let v = json()?;
                // Force is checked to come only with server-side apply.
                let pp = PatchParams {
                    field_manager: Some(manager),
                    dry_run,
                    force: options.force,
                    ..Default::default()
                };
                let patch = match kind {
                    PatchKind::Merge => Patch::Merge(v),
                    PatchKind::Strategic => Patch::Strategic(v),
                    PatchKind::Apply => Patch::Apply(v),
                    PatchKind::Json => {
                        let p: json_patch::Patch = serde_json::from_value(v).map_err(|e| {
                            ApiFailure::bad_request(format!("not a JSON patch: {e}"))
                        })?;
                        Patch::Json(p)
                    }
                };
                let out = match subresource {
                    Some("status") => api.patch_status(name()?, &pp, &patch).await,
                    _ => api.patch(name()?, &pp, &patch).await,
                };
                to_text(&out.map_err(k)?)
            }
            Verb::Delete => {
                let mut dp = DeleteParams {
                    dry_run,
                    ..DeleteParams::default()
                };
                dp.propagation_policy = options.propagation.map(|p| match p {
                    Propagation::Background => kube::api::PropagationPolicy::Background,
                    Propagation::Foreground => kube::api::PropagationPolicy::Foreground,
                    Propagation::Orphan => kube::api::PropagationPolicy::Orphan,
                });
                if options.precondition_uid.is_some()
                    || options.precondition_resource_version.is_some()
                {
                    dp.preconditions = Some(kube::api::Preconditions {
                        uid: options.precondition_uid.clone(),
                        resource_version: options.precondition_resource_version.clone(),
                    });
                }
                api.delete(name()?, &dp).await.map_err(k)?;
                Ok(String::new())
            }
        }
    }
}

/// Serialising the different answer types through one closure.
mod erased {
    pub trait Ser {
        fn to_json(&self) -> serde_json::Result<String>;
    }
    impl<T: serde::Serialize> Ser for T {
        fn to_json(&self) -> serde_json::Result<String> {
            serde_json::to_string(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(plugin: &str, suffix: Option<&str>) -> String {
        CallOptions {
            field_manager_suffix: suffix.map(str::to_string),
            ..CallOptions::default()
        }
        .field_manager(plugin)
    }

    #[test]
    fn a_plugin_never_writes_as_another_controller_or_another_plugin() {
        // Once "kube-controller-manager"; now unmistakably the plugin's.
        assert_eq!(
            manager("kube", Some("controller-manager")),
            "wcm:kube:controller-manager"
        );
        assert_eq!(manager("kubectl", None), "wcm:kubectl");
        // Two plugins whose names and suffixes once made the same manager.
        assert_ne!(manager("a-b", Some("c")), manager("a", Some("b-c")));
        assert_ne!(manager("a-b", None), manager("a", Some("b")));
        // The longest name and suffix stay within the API server's 128.
        let longest = manager(&"n".repeat(63), Some(&"s".repeat(MAX_FIELD_MANAGER_SUFFIX)));
        assert_eq!(longest.len(), 128);
        for (plugin, suffix) in [("p", None), ("p", Some("x")), ("q-r", Some("s-t"))] {
            let m = manager(plugin, suffix);
            // The plugin's part reads back: prefix, name, then the suffix after a ':'.
            let rest = m.strip_prefix(FIELD_MANAGER_PREFIX).expect("prefixed");
            let (name, s) = match rest.split_once(':') {
                Some((n, s)) => (n, Some(s)),
                None => (rest, None),
            };
            assert_eq!((name, s), (plugin, suffix));
        }
    }
}
