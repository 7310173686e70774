//! The cluster's side of a test: what other actors do to objects (a user deletes the owned
//! Deployment, the Deployment controller writes its status), without the plugin's permission
//! check and without being recorded as the plugin's calls. The cache sees each change, as a
//! watch would.

use serde::Serialize;
use serde_json::Value;

use super::{MockHost, State, group_kind};
use crate::params::DeleteParams;
use crate::types::{ApiError, KindRef, ObjectKey, PatchType};

/// What the rest of the cluster does, from [`MockHost::cluster`].
pub struct ClusterOps<'a> {
    host: &'a MockHost,
}

impl MockHost {
    /// Acts as the cluster, not as the plugin: no permission or scope check, nothing recorded in
    /// [`calls`](MockHost::calls), and the cache follows (as a watch would). For a test's "then
    /// someone deletes the child" or "then the Deployment controller reports it ready".
    ///
    /// ```
    /// use wcm_sdk::testing::MockHost;
    /// use wcm_sdk::{KindRef, ObjectKey};
    /// use serde_json::json;
    ///
    /// let host = MockHost::new();
    /// host.seed(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ns"}}));
    /// let deploy = KindRef::new("apps", "v1", "Deployment");
    /// let key = ObjectKey::namespaced("ns", "web");
    /// host.cluster().patch_status(&deploy, &key, json!({"status": {"readyReplicas": 2}})).unwrap();
    /// host.cluster().delete(&deploy, &key).unwrap();
    /// assert!(host.object_value(&deploy, &key).is_none());
    /// assert!(host.calls().is_empty());
    /// ```
    pub fn cluster(&self) -> ClusterOps<'_> {
        ClusterOps { host: self }
    }
}

impl ClusterOps<'_> {
    fn with<T>(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        op: impl FnOnce(&mut State) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut st = self.host.state.borrow_mut();
        let out = op(&mut st)?;
        let gk = group_kind(kind);
        let now = st.api.get(&gk).and_then(|objs| objs.get(key)).cloned();
        let cache = st.cache.entry(gk).or_default();
        match now {
            Some(v) => {
                cache.insert(key.clone(), v);
            }
            None => {
                cache.remove(key);
            }
        }
        Ok(out)
    }

    /// Creates or replaces an object as another actor would (a user's `kubectl apply`).
    pub fn put(&self, obj: &impl Serialize) -> &Self {
        self.host.seed(obj);
        self
    }

    /// Deletes an object (finalizers hold it, with a `deletionTimestamp`, as the API server does).
    pub fn delete(&self, kind: &KindRef, key: &ObjectKey) -> Result<(), ApiError> {
        self.with(kind, key, |st| {
            st.delete(kind, key, &DeleteParams::default())
        })
    }

    /// Merge-patches an object's status (`{"status": {...}}`), as its own controller would.
    pub fn patch_status(
        &self,
        kind: &KindRef,
        key: &ObjectKey,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let body = patch.to_string();
        self.with(kind, key, |st| {
            st.patch(kind, key, PatchType::Merge, &body, true)
        })
        .map(|s| serde_json::from_str(&s).unwrap_or(Value::Null))
    }

    /// Merge-patches an object (not its status), as another writer would.
    pub fn patch(&self, kind: &KindRef, key: &ObjectKey, patch: Value) -> Result<Value, ApiError> {
        let body = patch.to_string();
        self.with(kind, key, |st| {
            st.patch(kind, key, PatchType::Merge, &body, false)
        })
        .map(|s| serde_json::from_str(&s).unwrap_or(Value::Null))
    }
}
