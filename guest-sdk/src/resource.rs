//! Which Rust types stand for API objects: kube-core's [`Resource`], so every k8s-openapi type,
//! kube-core's [`DynamicObject`] and [`PartialObjectMeta`], and custom resources made with kube's
//! `#[derive(CustomResource)]` work here as they do with kube-rs.

use kube_core::{ApiResource, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

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

/// Reads an object the host handed over.
///
/// Objects of a metadata-only watch arrive as the API server sent them: `PartialObjectMetadata`
/// with `apiVersion: meta.k8s.io/v1`. k8s-openapi types refuse a foreign `kind`, so on failure the
/// object is read again with its `apiVersion`/`kind` replaced by `resource`'s (only `metadata` is
/// there, and every other field of the k8s-openapi types is optional).
pub(crate) fn decode<K: Resource + DeserializeOwned>(
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
pub(crate) fn decode_value<K: Resource + DeserializeOwned>(
    mut value: Value,
    resource: &ApiResource,
) -> Result<K, serde_json::Error> {
    if let Value::Object(map) = &mut value
        && map.get("kind").and_then(Value::as_str) != Some(resource.kind.as_str())
        && map.contains_key("kind")
    {
        map.insert(
            "apiVersion".into(),
            Value::String(resource.api_version.clone()),
        );
        map.insert("kind".into(), Value::String(resource.kind.clone()));
    }
    serde_json::from_value(value)
}

/// Serializes an object to send it, with the `apiVersion` and `kind` of its type filled in when the
/// object does not carry them (a fresh [`DynamicObject`](kube_core::DynamicObject)), or carries
/// those of a metadata-only read (`meta.k8s.io/v1` `PartialObjectMetadata`, which the API server
/// would refuse in a request).
pub(crate) fn encode<K: Resource + Serialize>(
    obj: &K,
    resource: &ApiResource,
) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(obj)?;
    if let Value::Object(map) = &mut value {
        let erased = map.get("kind").and_then(Value::as_str) == Some("PartialObjectMetadata")
            && resource.kind != "PartialObjectMetadata";
        if erased || !map.contains_key("kind") {
            map.insert("kind".into(), Value::String(resource.kind.clone()));
        }
        if erased || !map.contains_key("apiVersion") {
            map.insert(
                "apiVersion".into(),
                Value::String(resource.api_version.clone()),
            );
        }
    }
    serde_json::to_string(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube_core::{
        DynamicObject, GroupVersionKind, ObjectMeta, PartialObjectMeta, PartialObjectMetaExt,
    };

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
        assert_eq!(ApiResource::erase::<Node>(&()).plural, "nodes");
    }

    #[test]
    fn metadata_only_objects_read_as_typed() {
        let json = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"n1","labels":{"a":"b"}}}"#;
        let node: Node = decode(json, &ApiResource::erase::<Node>(&())).expect("decodes");
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        // A real mismatch still fails.
        let err = decode::<Pod>(
            r#"{"apiVersion":"v1","kind":"Pod","spec":42}"#,
            &ApiResource::erase::<Pod>(&()),
        );
        assert!(err.is_err());
    }

    #[test]
    fn dynamic_objects_round_trip() {
        let res =
            ApiResource::from_gvk(&GroupVersionKind::gvk("samplecrd.k8s.io", "v1", "Network"));
        let obj = DynamicObject::new("n", &res).data(serde_json::json!({"spec": {"cidr": "x"}}));
        let json = encode(&obj, &res).expect("encodes");
        let back: DynamicObject = decode(&json, &res).expect("decodes");
        assert_eq!(back, obj);
        assert_eq!(back.types.map(|t| t.kind).as_deref(), Some("Network"));
    }

    #[test]
    fn partial_object_meta_reads_any_form() {
        let res = ApiResource::erase::<Pod>(&());
        for json in [
            r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"p"}}"#,
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[]}}"#,
        ] {
            let meta: PartialObjectMeta<Pod> = decode(json, &res).expect(json);
            assert_eq!(meta.metadata.name.as_deref(), Some("p"));
        }
        // Sent, a metadata-only object carries its kind's type, never the erased one of a read.
        for partial in [
            ObjectMeta::default().into_response_partial::<Pod>(),
            ObjectMeta::default().into_request_partial::<Pod>(),
        ] {
            let sent = encode(&partial, &res).expect("encodes");
            let sent: Value = serde_json::from_str(&sent).expect("json");
            assert_eq!(
                sent,
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {}})
            );
        }
    }
}
