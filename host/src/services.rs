//! What a running plugin may reach through its host calls: the API (checked against its declared
//! permissions), the informer cache of the kinds it watches, the event recorder, its settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cache::ObjectStore;
use crate::events::{EventSink, PluginEvent};
use crate::kubeapi::{ApiAccess, ApiFailure, ApiRequest};
use crate::metrics::Metrics;
use crate::permissions::Permissions;
use crate::sandbox::{KindRef, ObjectKey};

/// One store per watched kind (the first watch of a kind wins when several select different
/// subsets; cache reads by kind then see that subset).
#[derive(Default)]
pub struct PluginCache {
    stores: Vec<(KindKey, Arc<ObjectStore>)>,
}

/// group/version/kind as a comparable key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindKey {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl From<&KindRef> for KindKey {
    fn from(k: &KindRef) -> Self {
        KindKey {
            group: k.group.clone(),
            version: k.version.clone(),
            kind: k.kind.clone(),
        }
    }
}

impl std::fmt::Display for KindKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}/{}", self.version, self.kind)
        } else {
            write!(f, "{}/{}/{}", self.group, self.version, self.kind)
        }
    }
}

impl PluginCache {
    pub fn add(&mut self, kind: KindKey, store: Arc<ObjectStore>) {
        if !self.stores.iter().any(|(k, _)| *k == kind) {
            self.stores.push((kind, store));
        }
    }

    pub fn store(&self, kind: &KindKey) -> Option<&Arc<ObjectStore>> {
        self.stores.iter().find(|(k, _)| k == kind).map(|(_, s)| s)
    }
}

/// Everything a plugin's host calls can use. Built once per loaded plugin and shared by its calls;
/// `describe` runs with [`Services::for_describe`], which refuses API, cache and event calls.
pub struct Services {
    plugin: Arc<str>,
    pub(crate) permissions: Permissions,
    pub(crate) api: Option<ApiAccess>,
    pub(crate) cache: PluginCache,
    pub(crate) events: Option<EventSink>,
    pub(crate) config: BTreeMap<String, String>,
    pub(crate) secrets: BTreeMap<String, String>,
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Hosts for outbound HTTP: declared by the plugin and allowed by the operator.
    pub(crate) allowed_hosts: Arc<[String]>,
}

impl Services {
    pub fn for_describe(plugin: &str, config: BTreeMap<String, String>) -> Self {
        Services {
            plugin: plugin.into(),
            permissions: Permissions::default(),
            api: None,
            cache: PluginCache::default(),
            events: None,
            config,
            secrets: BTreeMap::new(),
            metrics: None,
            allowed_hosts: Arc::from(Vec::new()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        plugin: &str,
        permissions: Permissions,
        api: ApiAccess,
        cache: PluginCache,
        events: EventSink,
        config: BTreeMap<String, String>,
        secrets: BTreeMap<String, String>,
        metrics: Arc<Metrics>,
        allowed_hosts: Vec<String>,
    ) -> Self {
        Services {
            plugin: plugin.into(),
            permissions,
            api: Some(api),
            cache,
            events: Some(events),
            config,
            secrets,
            metrics: Some(metrics),
            allowed_hosts: allowed_hosts.into(),
        }
    }

    pub fn plugin_name(&self) -> &str {
        &self.plugin
    }

    /// Checks the permission, then makes the API call.
    pub async fn api_call(&self, req: &ApiRequest<'_>) -> Result<String, ApiFailure> {
        let Some(api) = &self.api else {
            return Err(ApiFailure::unavailable(
                "API calls are not available while the plugin is being described",
            ));
        };
        let (kind, verb) = (req.kind, req.verb.as_str());
        let resolved = api.resolve(kind).await?;
        let resource = match req.subresource {
            Some(sub) => format!("{}/{sub}", resolved.plural),
            None => resolved.plural.clone(),
        };
        if !self.permissions.allows(&kind.group, &resource, verb) {
            tracing::warn!(plugin = %self.plugin, verb, group = %kind.group, resource, "undeclared API call refused");
            if let Some(m) = &self.metrics {
                m.forbidden_call(&self.plugin, verb, &resource);
            }
            return Err(ApiFailure::forbidden(
                &self.plugin,
                verb,
                &kind.group,
                &resource,
            ));
        }
        api.call(&self.plugin, &resolved, req).await
    }

    pub fn record_event(&self, event: PluginEvent) {
        if let Some(sink) = &self.events {
            sink.record(&self.plugin, event);
        } else {
            tracing::debug!(plugin = %self.plugin, "event dropped: events are not available while describing");
        }
    }

    pub fn cache_store(&self, kind: &KindRef) -> Option<&Arc<ObjectStore>> {
        self.cache.store(&KindKey::from(kind))
    }
}

/// Turns an object key into the store's key.
pub fn store_key(key: &ObjectKey) -> crate::cache::Key {
    crate::cache::Key::new(key.namespace.as_deref(), &key.name)
}
