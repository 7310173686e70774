//! Which Rust types stand for API objects: every k8s-openapi resource, [`DynamicObject`] for kinds
//! known only at run time, and custom types that implement [`Resource`].

use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::types::{KindRef, split_api_version};

/// The group, version, kind and plural resource name of a kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApiResource {
    /// API group; `""` for core.
    pub group: String,
    /// API version, e.g. `"v1"`.
    pub version: String,
    /// Kind, e.g. `"Network"`.
    pub kind: String,
    /// Plural resource name, e.g. `"networks"`: what permissions are declared against.
    pub plural: String,
}

impl ApiResource {
    /// A kind with its plural guessed the way Kubernetes forms most plurals (`Network` →
    /// `networks`, `Policy` → `policies`, `Ingress` → `ingresses`); set [`ApiResource::plural`]
    /// (or use [`ApiResource::with_plural`]) for the irregular ones.
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
            plural: plural_of(kind),
        }
    }

    /// The same resource with an explicit plural.
    pub fn with_plural(mut self, plural: &str) -> Self {
        self.plural = plural.to_string();
        self
    }

    /// The resource of a typed kind (`ApiResource::of::<Pod>()`).
    pub fn of<K: Resource<DynamicType = ()>>() -> Self {
        K::api_resource(&())
    }

    /// Its kind reference, as the host calls take it.
    pub fn kind_ref(&self) -> KindRef {
        KindRef {
            group: self.group.clone(),
            version: self.version.clone(),
            kind: self.kind.clone(),
        }
    }

    /// `"v1"` for core, `"group/version"` otherwise.
    pub fn api_version(&self) -> String {
        self.kind_ref().api_version()
    }
}

/// Lower-cased English plural of a kind, like the API server's defaults (and kube-rs's guess).
pub(crate) fn plural_of(kind: &str) -> String {
    let word = kind.to_ascii_lowercase();
    if matches!(word.as_str(), "endpoints" | "endpointslices") {
        return word;
    }
    if word.ends_with('s')
        || word.ends_with('x')
        || word.ends_with('z')
        || word.ends_with("ch")
        || word.ends_with("sh")
    {
        return format!("{word}es");
    }
    if let Some(stem) = word.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    format!("{word}s")
}

/// A Rust type that stands for an API object.
///
/// Implemented for every k8s-openapi resource type (`Pod`, `Node`, ...) and for [`DynamicObject`].
/// For a custom resource with its own struct, implement it by hand:
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use wcm_sdk::{ApiResource, Resource};
/// use wcm_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
///
/// #[derive(Serialize, Deserialize, Default)]
/// struct Network {
///     metadata: ObjectMeta,
///     spec: NetworkSpec,
/// }
/// #[derive(Serialize, Deserialize, Default)]
/// struct NetworkSpec {
///     cidr: String,
/// }
///
/// impl Resource for Network {
///     type DynamicType = ();
///     fn api_resource(_: &()) -> ApiResource {
///         ApiResource::new("samplecrd.k8s.io", "v1", "Network")
///     }
///     fn meta(&self) -> &ObjectMeta { &self.metadata }
///     fn meta_mut(&mut self) -> &mut ObjectMeta { &mut self.metadata }
/// }
/// ```
///
/// Serialize it *without* `apiVersion`/`kind` fields if you like: the SDK adds them when it sends an
/// object (see [`Api::create`](crate::Api::create)).
pub trait Resource: Serialize + DeserializeOwned {
    /// What identifies the kind at run time: `()` for types with a fixed kind, [`ApiResource`] for
    /// [`DynamicObject`].
    type DynamicType;
    /// The kind's group, version, kind and plural.
    fn api_resource(dt: &Self::DynamicType) -> ApiResource;
    /// The object's metadata.
    fn meta(&self) -> &ObjectMeta;
    /// The object's metadata, mutable.
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

impl<K> Resource for K
where
    K: k8s_openapi::Resource
        + k8s_openapi::Metadata<Ty = ObjectMeta>
        + Serialize
        + DeserializeOwned,
{
    type DynamicType = ();

    fn api_resource(_: &()) -> ApiResource {
        ApiResource {
            group: K::GROUP.to_string(),
            version: K::VERSION.to_string(),
            kind: K::KIND.to_string(),
            plural: K::URL_PATH_SEGMENT.to_string(),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        k8s_openapi::Metadata::metadata(self)
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        k8s_openapi::Metadata::metadata_mut(self)
    }
}

/// An object of any kind: typed metadata, everything else as JSON.
///
/// ```
/// use wcm_sdk::{ApiResource, DynamicObject};
/// let net = ApiResource::new("samplecrd.k8s.io", "v1", "Network");
/// let obj = DynamicObject::new("office", &net)
///     .within("default")
///     .data(serde_json::json!({"spec": {"cidr": "10.0.0.0/24"}}));
/// assert_eq!(obj.data["spec"]["cidr"], "10.0.0.0/24");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DynamicObject {
    /// `apiVersion`, as the object carried it (may be empty).
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub api_version: String,
    /// `kind`, as the object carried it (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Every other top-level field (`spec`, `status`, `data`, ...), as a JSON object.
    #[serde(flatten)]
    pub data: Value,
}

impl DynamicObject {
    /// An object of the given kind and name, with no other fields.
    pub fn new(name: &str, resource: &ApiResource) -> Self {
        DynamicObject {
            api_version: resource.api_version(),
            kind: resource.kind.clone(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            data: Value::Object(serde_json::Map::new()),
        }
    }

    /// The same object in a namespace.
    pub fn within(mut self, namespace: &str) -> Self {
        self.metadata.namespace = Some(namespace.to_string());
        self
    }

    /// The same object with these top-level fields (a JSON object, e.g. `{"spec": {...}}`).
    pub fn data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }

    /// The kind the object says it is, from its `apiVersion` and `kind`.
    pub fn kind_ref(&self) -> Option<KindRef> {
        if self.api_version.is_empty() || self.kind.is_empty() {
            return None;
        }
        let (group, version) = split_api_version(&self.api_version);
        Some(KindRef::new(group, version, &self.kind))
    }
}

impl Resource for DynamicObject {
    type DynamicType = ApiResource;

    fn api_resource(dt: &ApiResource) -> ApiResource {
        dt.clone()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Only the metadata of an object of kind `K`, as kube-rs's `PartialObjectMeta`.
///
/// What a metadata-only watch delivers, and all a plugin that reads names, labels, annotations or
/// owners needs. Reading it skips `spec` and `status`, and a plugin that never reads the full `K`
/// leaves `K`'s (large) deserializer out of the component: `ctx.cache::<PartialObjectMeta<Pod>>()`
/// rather than `ctx.cache::<Pod>()` makes a much smaller `.wasm`. It works with [`Api`](crate::Api)
/// too (a patch's response is then read as metadata only).
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct PartialObjectMeta<K> {
    /// The object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(skip)]
    _kind: PhantomData<fn() -> K>,
}

impl<K> PartialObjectMeta<K> {
    /// Metadata of a `K`.
    pub fn new(metadata: ObjectMeta) -> Self {
        PartialObjectMeta {
            metadata,
            _kind: PhantomData,
        }
    }
}

impl<K> Clone for PartialObjectMeta<K> {
    fn clone(&self) -> Self {
        Self::new(self.metadata.clone())
    }
}

impl<K> fmt::Debug for PartialObjectMeta<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartialObjectMeta")
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl<K> PartialEq for PartialObjectMeta<K> {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata
    }
}

impl<K: Resource> Resource for PartialObjectMeta<K> {
    type DynamicType = K::DynamicType;

    fn api_resource(dt: &K::DynamicType) -> ApiResource {
        K::api_resource(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Reads an object the host handed over.
///
/// Objects of a metadata-only watch arrive as the API server sent them: `PartialObjectMetadata`
/// with `apiVersion: meta.k8s.io/v1`. k8s-openapi types refuse a foreign `kind`, so on failure the
/// object is read again with its `apiVersion`/`kind` replaced by `resource`'s (only `metadata` is
/// there, and every other field of the k8s-openapi types is optional).
pub(crate) fn decode<K: Resource>(
    json: &str,
    resource: &ApiResource,
) -> Result<K, serde_json::Error> {
    match serde_json::from_str(json) {
        Ok(obj) => Ok(obj),
        Err(first) => {
            let Ok(value) = serde_json::from_str::<Value>(json) else {
                return Err(first);
            };
            decode_value(value, resource).map_err(|_| first)
        }
    }
}

/// [`decode`] for a value already parsed (items of a List).
pub(crate) fn decode_value<K: Resource>(
    mut value: Value,
    resource: &ApiResource,
) -> Result<K, serde_json::Error> {
    if let Value::Object(map) = &mut value
        && map.get("kind").and_then(Value::as_str) != Some(resource.kind.as_str())
        && map.contains_key("kind")
    {
        map.insert("apiVersion".into(), Value::String(resource.api_version()));
        map.insert("kind".into(), Value::String(resource.kind.clone()));
    }
    serde_json::from_value(value)
}

/// Serializes an object to send it, with the `apiVersion` and `kind` of its type filled in when the
/// type does not write them itself (custom types, a fresh [`DynamicObject`]).
pub(crate) fn encode<K: Resource>(
    obj: &K,
    resource: &ApiResource,
) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(obj)?;
    if let Value::Object(map) = &mut value {
        map.entry("apiVersion")
            .or_insert_with(|| Value::String(resource.api_version()));
        map.entry("kind")
            .or_insert_with(|| Value::String(resource.kind.clone()));
    }
    serde_json::to_string(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};

    #[test]
    fn plurals() {
        for (kind, plural) in [
            ("Pod", "pods"),
            ("Ingress", "ingresses"),
            ("NetworkPolicy", "networkpolicies"),
            ("Gateway", "gateways"),
            ("Endpoints", "endpoints"),
            ("Mesh", "meshes"),
            ("Box", "boxes"),
        ] {
            assert_eq!(plural_of(kind), plural, "{kind}");
        }
        assert_eq!(ApiResource::of::<Node>().plural, "nodes");
    }

    #[test]
    fn metadata_only_objects_read_as_typed() {
        let json = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"n1","labels":{"a":"b"}}}"#;
        let node: Node = decode(json, &ApiResource::of::<Node>()).expect("decodes");
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        // A real mismatch still fails.
        let err = decode::<Pod>(
            r#"{"apiVersion":"v1","kind":"Pod","spec":42}"#,
            &ApiResource::of::<Pod>(),
        );
        assert!(err.is_err());
    }

    #[test]
    fn dynamic_objects_round_trip() {
        let res = ApiResource::new("samplecrd.k8s.io", "v1", "Network");
        let obj = DynamicObject::new("n", &res).data(serde_json::json!({"spec": {"cidr": "x"}}));
        let json = encode(&obj, &res).expect("encodes");
        let back: DynamicObject = decode(&json, &res).expect("decodes");
        assert_eq!(back, obj);
        assert_eq!(back.kind_ref(), Some(res.kind_ref()));
    }

    #[test]
    fn partial_object_meta_reads_any_form() {
        let res = ApiResource::of::<Pod>();
        for json in [
            r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"p"}}"#,
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[]}}"#,
        ] {
            let meta: PartialObjectMeta<Pod> = decode(json, &res).expect(json);
            assert_eq!(meta.metadata.name.as_deref(), Some("p"));
        }
        let sent =
            encode(&PartialObjectMeta::<Pod>::new(ObjectMeta::default()), &res).expect("encodes");
        assert_eq!(sent, r#"{"apiVersion":"v1","kind":"Pod","metadata":{}}"#);
    }
}
