//! API discovery, cached per group: the kinds a group serves, with their plurals, scope, versions
//! and subresources. A group is asked for only when a plugin's declaration names it, so a plugin
//! cannot make the host query the API server for arbitrary kinds; failures are cached briefly too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{self, Scope};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::api::ApiFailure;
use crate::contract::KindRef;

/// One kind of a group, across the versions that serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindInfo {
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    pub versions: Vec<String>,
    /// "status", "scale", ...
    pub subresources: Vec<String>,
}

/// What a group serves.
#[derive(Debug, Clone, Default)]
pub struct GroupInfo {
    pub group: String,
    pub kinds: Vec<KindInfo>,
}

impl GroupInfo {
    pub fn kind(&self, kind: &str) -> Option<&KindInfo> {
        self.kinds.iter().find(|k| k.kind == kind)
    }

    pub fn by_plural(&self, plural: &str) -> Option<&KindInfo> {
        self.kinds.iter().find(|k| k.plural == plural)
    }
}

/// A kind resolved to what a request needs.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub resource: ApiResource,
    pub plural: String,
    pub namespaced: bool,
}

impl Resolved {
    pub fn new(kind: &KindRef, info: &KindInfo) -> Self {
        let gvk = GroupVersionKind::gvk(&kind.group, &kind.version, &kind.kind);
        Resolved {
            resource: ApiResource::from_gvk_with_plural(&gvk, &info.plural),
            plural: info.plural.clone(),
            namespaced: info.namespaced,
        }
    }
}

/// A group's cached answer, behind the lock its discovery holds.
type GroupSlot = Arc<Mutex<Option<Entry>>>;

struct Entry {
    at: Instant,
    group: Result<Arc<GroupInfo>, ApiFailure>,
}

/// The discovery cache of the host (its own identity: discovery is not a plugin's request).
pub struct Discovery {
    client: kube::Client,
    groups: std::sync::Mutex<HashMap<String, GroupSlot>>,
    timeout: Duration,
}

/// How long a discovered group is trusted; a miss inside it refreshes at most once per `RETRY`.
const TTL: Duration = Duration::from_secs(300);
const RETRY: Duration = Duration::from_secs(5);

impl Discovery {
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Discovery {
            client,
            groups: Default::default(),
            timeout,
        }
    }

    /// What `group` serves ("" for core).
    pub async fn group(&self, group: &str) -> Result<Arc<GroupInfo>, ApiFailure> {
        self.group_fresh(group, false).await
    }

    /// Like [`Discovery::group`], but asks the API server again if the cached answer is older than
    /// a few seconds (a kind not found may have been installed since).
    async fn group_fresh(&self, group: &str, refresh: bool) -> Result<Arc<GroupInfo>, ApiFailure> {
        // One lock per group, held across its request: one discovery per group at a time, the rest
        // wait for its answer; a slow group never holds up another.
        let slot = {
            let mut groups = self
                .groups
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            groups.entry(group.to_string()).or_default().clone()
        };
        let mut entry = slot.lock().await;
        if let Some(e) = entry.as_ref() {
            let age = e.at.elapsed();
            let keep = match (&e.group, refresh) {
                (Ok(_), false) => age < TTL,
                _ => age < RETRY,
            };
            if keep {
                return e.group.clone();
            }
        }
        let fetched = self.fetch(group).await;
        *entry = Some(Entry {
            at: Instant::now(),
            group: fetched.clone(),
        });
        fetched
    }

    async fn fetch(&self, group: &str) -> Result<Arc<GroupInfo>, ApiFailure> {
        let g = tokio::time::timeout(self.timeout, discovery::group(&self.client, group))
            .await
            .map_err(|_| ApiFailure::new(0, "Timeout", "discovery timed out"))?
            .map_err(|e| match e {
                kube::Error::Discovery(d) => ApiFailure::new(
                    404,
                    "NotFound",
                    format!("the API server does not serve group {group:?}: {d}"),
                ),
                other => ApiFailure::from_kube(other),
            })?;
        let mut info = GroupInfo {
            group: group.to_string(),
            kinds: Vec::new(),
        };
        for version in g.versions() {
            for (ar, caps) in g.versioned_resources(version) {
                let subresources: Vec<String> = caps
                    .subresources
                    .iter()
                    .map(|(s, _)| s.plural.clone())
                    .collect();
                match info.kinds.iter_mut().find(|k| k.kind == ar.kind) {
                    Some(k) => k.versions.push(version.to_string()),
                    None => info.kinds.push(KindInfo {
                        kind: ar.kind.clone(),
                        plural: ar.plural.clone(),
                        namespaced: caps.scope == Scope::Namespaced,
                        versions: vec![version.to_string()],
                        subresources,
                    }),
                }
            }
        }
        Ok(Arc::new(info))
    }

    /// Drops what is cached of `group`: the next resolution asks the API server.
    pub async fn forget_group(&self, group: &str) {
        let slot = self
            .groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(group)
            .cloned();
        if let Some(slot) = slot {
            *slot.lock().await = None;
        }
    }

    /// Follows CustomResourceDefinitions (their metadata only) and forgets the group of each one
    /// created, changed or deleted, so a CRD deleted and re-created with other versions or scope
    /// is seen at once instead of after the cache's 5 minutes. Without the right to watch CRDs it
    /// logs once per failure and the cache's expiry does the same, later.
    pub fn follow_crds(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        use futures::StreamExt;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::core::PartialObjectMeta;
        use kube::runtime::WatchStreamExt;
        use kube::runtime::watcher::{self, Event};
        let this = self.clone();
        tokio::spawn(async move {
            let api: kube::Api<PartialObjectMeta<CustomResourceDefinition>> =
                kube::Api::all(this.client.clone());
            let mut events = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let changed = match event {
                    Ok(Event::Apply(m) | Event::Delete(m) | Event::InitApply(m)) => m.metadata.name,
                    Ok(Event::Init | Event::InitDone) => None,
                    Err(e) => {
                        tracing::warn!(
                            "cannot follow CustomResourceDefinitions (discovery is refreshed every 5 minutes instead): {e}"
                        );
                        None
                    }
                };
                // A CRD is named PLURAL.GROUP.
                if let Some((_, group)) = changed.as_deref().and_then(|n| n.split_once('.')) {
                    this.forget_group(group).await;
                }
            }
        })
    }

    /// Resolves a kind at a version; a kind or version not found refreshes the group once.
    pub async fn resolve(&self, kind: &KindRef) -> Result<Resolved, ApiFailure> {
        let mut refresh = false;
        loop {
            let g = self.group_fresh(&kind.group, refresh).await?;
            if let Some(info) = g.kind(&kind.kind)
                && info.versions.contains(&kind.version)
            {
                return Ok(Resolved::new(kind, info));
            }
            if refresh {
                return Err(ApiFailure::new(
                    404,
                    "NotFound",
                    format!(
                        "the API server does not serve kind {} at {}",
                        kind.kind,
                        crate::contract::KindKey::from(kind).api_version()
                    ),
                ));
            }
            refresh = true;
        }
    }
}
