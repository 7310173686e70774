//! The informer cache: each object stored once, as the JSON text handed to plugins (with
//! `managedFields` and the last-applied annotation stripped), plus the few metadata fields the host
//! itself needs. Indexed by namespace and by owner UID.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

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
    /// Whether the JSON carries `apiVersion` and `kind` (a List's items may not).
    has_type: bool,
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An object as decoded from the API server: its metadata as a tree (the host reads and strips
/// it), every other top-level field as the JSON text it came as. Building no tree for `spec` and
/// `status` is most of the saving over decoding the whole object.
#[derive(Debug, Default)]
pub struct ObjectParts {
    pub metadata: Option<Map<String, Value>>,
    /// Every top-level field in the order it came; `None` stands in the place of `metadata`.
    pub fields: Vec<(String, Option<Box<RawValue>>)>,
}

impl<'de> serde::Deserialize<'de> for ObjectParts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ObjectParts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ObjectParts, A::Error> {
                let mut parts = ObjectParts::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "metadata" && parts.metadata.is_none() {
                        // Anything but an object here makes the whole object unusable (None
                        // below), as a bookmark without metadata is.
                        parts.metadata = match map.next_value::<Value>()? {
                            Value::Object(m) => Some(m),
                            _ => None,
                        };
                        parts.fields.push((key, None));
                    } else {
                        let raw = map.next_value::<Box<RawValue>>()?;
                        parts.fields.push((key, Some(raw)));
                    }
                }
                Ok(parts)
            }
        }
        d.deserialize_map(Visitor)
    }
}

impl CachedObject {
    /// Builds the cached form of an object given as a tree (tests, and callers that have one).
    pub fn from_value(v: Value) -> Option<CachedObject> {
        let Value::Object(map) = v else { return None };
        let mut parts = ObjectParts::default();
        for (key, value) in map {
            if key == "metadata" {
                let Value::Object(m) = value else { return None };
                parts.metadata = Some(m);
                parts.fields.push((key, None));
            } else {
                let raw = serde_json::value::to_raw_value(&value).ok()?;
                parts.fields.push((key, Some(raw)));
            }
        }
        CachedObject::from_parts(parts)
    }

    /// What is kept of an object whose range a sharded stream gave up, until its next list is
    /// in: its key, UID and resourceVersion, what the deletion of a plugin's primary is told with
    /// (no labels, owners or JSON: an empty object).
    pub fn trace(&self) -> CachedObject {
        CachedObject {
            key: self.key.clone(),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            generation: None,
            labels: BTreeMap::new(),
            owners: Vec::new(),
            json: Arc::from("{}"),
            has_type: false,
        }
    }

    /// The same object with `apiVersion` and `kind` first, when the API server left them out (the
    /// items of a List): what a plugin reads, and what the host reads a primary's kind from.
    pub fn with_type(self: Arc<Self>, api_version: &str, kind: &str) -> Arc<Self> {
        if self.has_type || !self.json.starts_with('{') {
            return self;
        }
        let rest = &self.json[1..];
        let sep = if rest.trim_start().starts_with('}') {
            ""
        } else {
            ","
        };
        let json = format!(
            "{{\"apiVersion\":{},\"kind\":{}{sep}{rest}",
            Value::String(api_version.into()),
            Value::String(kind.into())
        );
        let mut typed = (*self).clone();
        typed.json = json.into();
        typed.has_type = true;
        Arc::new(typed)
    }

    /// Builds the cached form of an object as the API server sent it. `None` for something that
    /// is not an object with a name (e.g. a watch bookmark).
    pub fn from_parts(parts: ObjectParts) -> Option<CachedObject> {
        let ObjectParts {
            metadata: Some(mut meta_map),
            fields,
        } = parts
        else {
            return None;
        };
        let meta = &mut meta_map;
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
        let has_type = ["apiVersion", "kind"]
            .iter()
            .all(|t| fields.iter().any(|(k, _)| k == t));
        let json: Arc<str> = object_text(&meta_map, &fields)?.into();
        Some(CachedObject {
            has_type,
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

/// The object's JSON text: each top-level field as it came, the stripped metadata in its place.
fn object_text(
    meta: &Map<String, Value>,
    fields: &[(String, Option<Box<RawValue>>)],
) -> Option<String> {
    let meta = serde_json::to_string(meta).ok()?;
    let size = fields
        .iter()
        .map(|(k, v)| k.len() + 4 + v.as_ref().map_or(meta.len(), |r| r.get().len()))
        .sum::<usize>();
    let mut out = String::with_capacity(size + 2);
    out.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(key).ok()?);
        out.push(':');
        out.push_str(value.as_ref().map_or(meta.as_str(), |r| r.get()));
    }
    out.push('}');
    Some(out)
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

    #[test]
    fn a_list_item_gets_its_api_version_and_kind() {
        let item = Arc::new(
            CachedObject::from_value(
                serde_json::json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
            )
            .expect("an object"),
        );
        let typed = item.with_type("v1", "ConfigMap");
        let v: Value = serde_json::from_str(&typed.json).expect("JSON");
        assert_eq!(
            (v["apiVersion"].as_str(), v["kind"].as_str()),
            (Some("v1"), Some("ConfigMap"))
        );
        assert_eq!(v["data"]["k"], "v");
        // One that has them keeps its own.
        let full = Arc::new(
            CachedObject::from_value(serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a"}}))
                .expect("an object"),
        );
        assert!(Arc::ptr_eq(
            &full.clone().with_type("v1", "ConfigMap"),
            &full
        ));
    }

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
    fn decoded_text_keeps_every_field_but_managed_fields_and_last_applied() {
        let text = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"a","uid":"u1","resourceVersion":"7","managedFields":[{"manager":"kubectl"}],"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"}},"spec":{"containers":[{"name":"c","image":"x:1"}],"nodeName":"n\u00e9"},"status":{"phase":"Pending"}}"#;
        let parts: ObjectParts = serde_json::from_str(text).expect("decode");
        let o = CachedObject::from_parts(parts).expect("object");
        let got: Value = serde_json::from_str(&o.json).expect("json");
        let mut want: Value = serde_json::from_str(text).expect("json");
        let meta = want["metadata"].as_object_mut().expect("metadata");
        meta.remove("managedFields");
        meta.remove("annotations");
        assert_eq!(got, want);
        assert_eq!((o.key.to_string(), o.uid.as_str()), ("a/p".into(), "u1"));
        assert_eq!(o.resource_version, "7");
        // spec and status are the API server's own text.
        assert!(o.json.contains(
            r#""spec":{"containers":[{"name":"c","image":"x:1"}],"nodeName":"n\u00e9"}"#
        ));
    }

    #[test]
    fn an_object_without_metadata_is_not_cached() {
        let parts: ObjectParts =
            serde_json::from_str(r#"{"kind":"Pod","metadata":"x","spec":{}}"#).expect("decode");
        assert!(CachedObject::from_parts(parts).is_none());
        let parts: ObjectParts = serde_json::from_str(r#"{"kind":"Pod"}"#).expect("decode");
        assert!(CachedObject::from_parts(parts).is_none());
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
