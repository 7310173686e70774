//! Each plugin's own Kubernetes identity: a ServiceAccount the host impersonates for every API call,
//! event write and Secret read it makes on the plugin's behalf. The API server then decides what
//! the plugin may do (ordinary RBAC an operator reviews) and its audit log names the plugin.
//!
//! The host itself needs only `impersonate` on those ServiceAccounts, plus list/watch on what its
//! shared informers watch; see docs/security.md.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::scope::Protected;

/// Kubernetes' own namespaces: protected like the host's.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// Where plugins' ServiceAccounts live and how they are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySettings {
    /// The namespace of every plugin's ServiceAccount.
    pub namespace: String,
    /// The ServiceAccount of plugin `p` is `{prefix}{p}`.
    pub prefix: String,
    /// Namespaces besides `namespace` that no plugin acts in unless its NAME.toml names them:
    /// the host's own (its Deployment, ServiceAccount and Leases) and any the operator adds.
    pub protected: Vec<String>,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        IdentitySettings {
            namespace: "wcm-system".into(),
            prefix: "wcm-plugin-".into(),
            protected: Vec::new(),
        }
    }
}

impl IdentitySettings {
    pub fn service_account(&self, plugin: &str) -> String {
        format!("{}{plugin}", self.prefix)
    }

    /// The namespaces no plugin acts in unless its NAME.toml names them: the plugins' identity
    /// namespace, Kubernetes' own (`kube-system`: the control plane's controllers and their
    /// ServiceAccounts; `kube-public`; `kube-node-lease`: the nodes' heartbeats) and `protected`.
    pub fn protected_namespaces(&self) -> Protected {
        Protected::new(
            std::iter::once(self.namespace.clone())
                .chain(SYSTEM_NAMESPACES.iter().map(|n| n.to_string()))
                .chain(self.protected.iter().cloned()),
        )
    }

    /// The user name the API server gives that ServiceAccount.
    pub fn username(&self, plugin: &str) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace,
            self.service_account(plugin)
        )
    }
}

/// A client that acts as one plugin.
#[derive(Clone)]
pub struct PluginIdentity {
    pub username: String,
    client: kube::Client,
}

/// One access the host checks before it serves a plugin from a shared informer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
    /// None: all namespaces (or a cluster-scoped resource).
    pub namespace: Option<String>,
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        match &self.namespace {
            Some(ns) => write!(
                f,
                "{} {} (group {group}) in namespace {ns}",
                self.verb, self.resource
            ),
            None => write!(
                f,
                "{} {} (group {group}) in all namespaces",
                self.verb, self.resource
            ),
        }
    }
}

impl PluginIdentity {
    /// A client for `plugin`, from the host's own configuration. The API server refuses it unless
    /// the host may impersonate that ServiceAccount.
    pub fn new(
        base: &kube::Config,
        settings: &IdentitySettings,
        plugin: &str,
    ) -> anyhow::Result<Self> {
        let username = settings.username(plugin);
        let mut config = base.clone();
        config.auth_info.impersonate = Some(username.clone());
        // No groups given: the API server adds the ServiceAccount's own groups.
        config.auth_info.impersonate_groups = None;
        let client = kube::Client::try_from(config)
            .map_err(|e| anyhow::anyhow!("build the client of plugin {plugin}: {e}"))?;
        Ok(PluginIdentity { username, client })
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Asks the API server whether this identity may do `access` (a SelfSubjectAccessReview made
    /// as the plugin, so the host needs no right to review others).
    pub async fn may(&self, access: &Access) -> anyhow::Result<bool> {
        client_may(&self.client, access)
            .await
            .map_err(|e| anyhow::anyhow!("access review as {}: {e}", self.username))
    }

    /// The first of `accesses` the API server does not allow, if any.
    pub async fn first_denied(&self, accesses: &[Access]) -> anyhow::Result<Option<Access>> {
        first_denied(&self.client, accesses).await
    }
}

/// The first of `accesses` the API server does not allow the client's identity, if any.
pub async fn first_denied(
    client: &kube::Client,
    accesses: &[Access],
) -> anyhow::Result<Option<Access>> {
    for a in accesses {
        if !client_may(client, a).await? {
            return Ok(Some(a.clone()));
        }
    }
    Ok(None)
}

/// Asks the API server whether the client's own identity may do `access` (a
/// SelfSubjectAccessReview, which every authenticated user may make).
pub async fn client_may(client: &kube::Client, access: &Access) -> anyhow::Result<bool> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(access.verb.into()),
                group: Some(access.group.clone()),
                resource: Some(access.resource.clone()),
                namespace: access.namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &review).await {
        Ok(answer) => Ok(answer.status.is_some_and(|s| s.allowed)),
        // The host may not act as this identity (its impersonation right is gone): nothing
        // is allowed.
        Err(kube::Error::Api(e)) if e.code == 401 || e.code == 403 => Ok(false),
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}
