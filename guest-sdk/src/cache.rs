//! Typed reads from the host's informer cache.

use std::marker::PhantomData;
use std::rc::Rc;

use kube_core::{ApiResource, Resource};
use serde::de::DeserializeOwned;

use crate::host::Host;
use crate::reconcile::Error;
use crate::resource::decode;
use crate::types::{KindRef, ObjectKey};

/// Reads of one kind from the host's informer cache: no API request, no permission needed, but
/// only for kinds the plugin watches (primary or secondary). Made by
/// [`Context::cache`](crate::Context::cache).
///
/// The cache follows the API server with a small delay. For a metadata-only watch the cached
/// objects carry only `metadata`; they still read as the typed kind (every other field is empty).
///
/// Errors: a cache refusal (kind not watched, bad selector) is a retryable [`Error`]; an object
/// that does not read as `K` is a terminal one.
pub struct Cache<K> {
    host: Rc<dyn Host>,
    resource: ApiResource,
    kind: KindRef,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Cache {
            host: self.host.clone(),
            resource: self.resource.clone(),
            kind: self.kind.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K: Resource + DeserializeOwned> Cache<K> {
    pub(crate) fn new(host: Rc<dyn Host>, resource: ApiResource) -> Self {
        let kind = KindRef::from(&resource);
        Cache {
            host,
            resource,
            kind,
            _kind: PhantomData,
        }
    }

    fn read(&self, json: &str) -> Result<K, Error> {
        decode(json, &self.resource)
            .map_err(|e| Error::terminal(format!("reading a cached {}: {e}", self.resource.kind)))
    }

    fn refused(&self, what: &str, message: String) -> Error {
        Error::retryable(format!("cache {what} of {}: {message}", self.kind))
    }

    /// One cached object; `None` when it is not in the cache.
    pub fn get(&self, key: &ObjectKey) -> Result<Option<K>, Error> {
        self.host
            .cache_get(&self.kind, key)
            .map(|json| self.read(&json))
            .transpose()
    }

    /// One cached object read as `T` rather than `K`: a struct of only the fields the plugin
    /// reads. Reading a whole `Deployment` puts the decoder of every Pod field into the
    /// component (about 1 MB); a `T` of a few fields costs a few KB (docs/writing-a-plugin.md,
    /// "Keeping components small"). `None` when it is not in the cache.
    pub fn get_as<T: DeserializeOwned>(&self, key: &ObjectKey) -> Result<Option<T>, Error> {
        self.host
            .cache_get(&self.kind, key)
            .map(|json| {
                serde_json::from_str(&json).map_err(|e| {
                    Error::terminal(format!("reading a cached {}: {e}", self.resource.kind))
                })
            })
            .transpose()
    }

    /// The keys of the cached objects in `namespace` (`None`: all namespaces) that match
    /// `label_selector` (e.g. `"app=web"`, `"node-role.kubernetes.io/control-plane"`). Cheap: no
    /// object crosses into the plugin.
    pub fn keys(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<ObjectKey>, Error> {
        self.host
            .cache_keys(&self.kind, namespace, label_selector)
            .map_err(|e| self.refused("keys", e))
    }

    /// How many cached objects match (via [`Cache::keys`]).
    pub fn count(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<usize, Error> {
        self.keys(namespace, label_selector).map(|keys| keys.len())
    }

    /// The cached objects that match, filtered like [`Cache::keys`].
    pub fn list(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<K>, Error> {
        let objects = self
            .host
            .cache_list(&self.kind, namespace, label_selector)
            .map_err(|e| self.refused("list", e))?;
        objects.iter().map(|json| self.read(json)).collect()
    }
}
