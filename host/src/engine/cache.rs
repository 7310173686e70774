//! The informer cache: each object stored once, as the JSON text handed to plugins (with
//! `managedFields` and the last-applied annotation stripped), plus the few metadata fields the host
//! itself needs. Indexed by namespace and by owner UID.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::selector::Selector;

/// namespace (None for cluster-scoped) + name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: Option<String>,
    pub name: String,
}

impl Key {
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        Key {
            namespace: namespace.filter(|n| !n.is_empty()).map(str::to_string),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A controller (or other) owner reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: bool,
}

/// One cached object.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedObject {
    pub key: Key,
    pub uid: String,
    pub resource_version: String,
    pub generation: Option<i64>,
    pub labels: BTreeMap<String, String>,
    pub owners: Vec<Owner>,
    /// The object as JSON, ready to hand to a plugin.
    pub json: Arc<str>,
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl CachedObject {
    /// Builds the cached form of an object as the API server sent it. `None` for something that
    /// is not an object with a name (e.g. a watch bookmark).
    pub fn from_value(mut v: Value) -> Option<CachedObject> {
        let meta = v.get_mut("metadata")?.as_object_mut()?;
        meta.remove("managedFields");
        if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
            ann.remove(LAST_APPLIED);
            if ann.is_empty() {
                meta.remove("annotations");
            }
        }
        let s = |k: &str| meta.get(k).and_then(Value::as_str).map(str::to_string);
        let name = s("name")?;
        let key = Key::new(s("namespace").as_deref(), &name);
        let uid = s("uid").unwrap_or_default();
        let resource_version = s("resourceVersion").unwrap_or_default();
        let generation = meta.get("generation").and_then(Value::as_i64);
        let labels = match meta.get("labels") {
            Some(Value::Object(m)) => m
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
            _ => BTreeMap::new(),
        };
        let owners = match meta.get("ownerReferences") {
            Some(Value::Array(refs)) => refs
                .iter()
                .filter_map(|r| {
                    let g = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_string);
                    Some(Owner {
                        api_version: g("apiVersion")?,
                        kind: g("kind")?,
                        name: g("name")?,
                        uid: g("uid").unwrap_or_default(),
                        controller: r
                            .get("controller")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let json: Arc<str> = serde_json::to_string(&v).ok()?.into();
        Some(CachedObject {
            key,
            uid,
            resource_version,
            generation,
            labels,
            owners,
            json,
        })
    }

    pub fn controller(&self) -> Option<&Owner> {
        self.owners.iter().find(|o| o.controller)
    }
}

#[derive(Default)]
struct Inner {
    objects: HashMap<Key, Arc<CachedObject>>,
    by_namespace: HashMap<String, BTreeSet<Key>>,
    by_owner: HashMap<String, BTreeSet<Key>>,
}

impl Inner {
    fn index(&mut self, o: &CachedObject) {
        if let Some(ns) = &o.key.namespace {
            self.by_namespace
                .entry(ns.clone())
                .or_default()
                .insert(o.key.clone());
        }
        for owner in &o.owners {
            self.by_owner
                .entry(owner.uid.clone())
                .or_default()
                .insert(o.key.clone());
        }
    }

    fn unindex(&mut self, o: &CachedObject) {
        if let Some(ns) = &o.key.namespace
            && let Some(set) = self.by_namespace.get_mut(ns)
        {
            set.remove(&o.key);
            if set.is_empty() {
                self.by_namespace.remove(ns);
            }
        }
        for owner in &o.owners {
            if let Some(set) = self.by_owner.get_mut(&owner.uid) {
                set.remove(&o.key);
                if set.is_empty() {
                    self.by_owner.remove(&owner.uid);
                }
            }
        }
    }
}

/// The objects of one informer.
#[derive(Default)]
pub struct ObjectStore {
    inner: RwLock<Inner>,
}

impl ObjectStore {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &Key) -> Option<Arc<CachedObject>> {
        self.read().objects.get(key).cloned()
    }

    /// Inserts or replaces; returns the previous object.
    pub fn upsert(&self, obj: Arc<CachedObject>) -> Option<Arc<CachedObject>> {
        let mut inner = self.write();
        let old = inner.objects.insert(obj.key.clone(), obj.clone());
        if let Some(old) = &old {
            inner.unindex(old);
        }
        inner.index(&obj);
        old
    }

    pub fn remove(&self, key: &Key) -> Option<Arc<CachedObject>> {
        let mut inner = self.write();
        let old = inner.objects.remove(key);
        if let Some(old) = &old {
            inner.unindex(old);
        }
        old
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object (a snapshot).
    pub fn all(&self) -> Vec<Arc<CachedObject>> {
        self.read().objects.values().cloned().collect()
    }

    /// Objects in `namespace` (all when None) that match `selector`, sorted by key.
    pub fn select(&self, namespace: Option<&str>, selector: &Selector) -> Vec<Arc<CachedObject>> {
        let inner = self.read();
        let mut out: Vec<Arc<CachedObject>> = match namespace {
            Some(ns) => inner
                .by_namespace
                .get(ns)
                .map(|keys| {
                    keys.iter()
                        .filter_map(|k| inner.objects.get(k).cloned())
                        .collect()
                })
                .unwrap_or_default(),
            None => inner.objects.values().cloned().collect(),
        };
        out.retain(|o| selector.matches(&o.labels));
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Keys of objects with an owner reference to `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<Key> {
        self.read()
            .by_owner
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(ns: &str, name: &str, labels: Value, owner: Option<&str>) -> Arc<CachedObject> {
        let mut meta = json!({"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": "1", "labels": labels,
            "managedFields": [{"manager": "kubectl"}], "annotations": {LAST_APPLIED: "{}", "keep": "me"}});
        if let Some(o) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": format!("uid-{o}"), "controller": true}]);
        }
        Arc::new(
            CachedObject::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta}))
                .expect("object"),
        )
    }

    #[test]
    fn strips_managed_fields_and_last_applied_but_keeps_the_rest() {
        let o = obj("a", "p", json!({"app": "web"}), None);
        let v: Value = serde_json::from_str(&o.json).expect("json");
        assert!(v["metadata"].get("managedFields").is_none());
        assert!(v["metadata"]["annotations"].get(LAST_APPLIED).is_none());
        assert_eq!(v["metadata"]["annotations"]["keep"], "me");
        assert_eq!(o.labels.get("app").map(String::as_str), Some("web"));
    }

    #[test]
    fn indexes_follow_updates_and_removals() {
        let store = ObjectStore::default();
        store.upsert(obj("a", "p1", json!({"app": "web"}), Some("rs1")));
        store.upsert(obj("b", "p2", json!({"app": "db"}), Some("rs1")));
        store.upsert(obj("a", "p3", json!({}), None));
        let all = Selector::parse("").expect("selector");
        assert_eq!(store.select(Some("a"), &all).len(), 2);
        assert_eq!(
            store
                .select(None, &Selector::parse("app=web").expect("selector"))
                .len(),
            1
        );
        assert_eq!(store.owned_by("uid-rs1").len(), 2);
        // p2 loses its owner on update
        store.upsert(obj("b", "p2", json!({"app": "db"}), None));
        assert_eq!(store.owned_by("uid-rs1"), vec![Key::new(Some("a"), "p1")]);
        store.remove(&Key::new(Some("a"), "p1"));
        assert!(store.owned_by("uid-rs1").is_empty());
        assert_eq!(store.select(Some("a"), &all).len(), 1);
        assert_eq!(store.len(), 2);
    }
}
