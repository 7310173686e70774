//! Lists and watches that carry a `shardSelector` (KEP-5866, issue #28): the API server then sends
//! only the objects whose hash falls in the selected ranges, so a replica caches only its share.
//!
//! kube-runtime's watcher has no field for it, so the informer of a sharded plugin gets a client of
//! its own whose GET requests (its list and its watch, the only requests it makes) carry the
//! parameter. The selector is the host's own text ([`crate::engine::shard::selector`]), never a
//! plugin's. An API server without the gate ignores the parameter and sends every object:
//! [`served`] tells the two apart before a plugin's stream is chosen, and the host-side filter
//! still divides the work where the API server does not.

use http::{Method, Request, Uri};
use kube::client::Body;

use crate::engine::cache::Key;
use crate::engine::informer::InformerKey;
use crate::engine::shard::{ShardBy, selector, split};

/// `uri` with `shardSelector=SELECTOR` added to its query.
pub fn with_selector(uri: &Uri, selector: &str) -> Option<Uri> {
    let encoded: String = form_urlencoded::byte_serialize(selector.as_bytes()).collect();
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    let sep = if pq.contains('?') { '&' } else { '?' };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(format!("{pq}{sep}shardSelector={encoded}").parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// A client like `client` whose GET requests carry `shardSelector=SELECTOR`.
pub fn client(client: kube::Client, selector: String) -> kube::Client {
    let ns = client.default_namespace().to_string();
    let service = tower::service_fn(move |mut req: Request<Body>| {
        let client = client.clone();
        if req.method() == Method::GET
            && let Some(uri) = with_selector(req.uri(), &selector)
        {
            *req.uri_mut() = uri;
        }
        async move { client.send(req).await }
    });
    kube::Client::new(service, ns)
}

/// Whether the API server filters `key`'s kind by `shardSelector` (its `ShardedListAndWatch`
/// gate is on): a list of at most one object, asked for the whole hash space, comes back with
/// `metadata.shardInfo` then, and without it when the parameter is ignored, however many objects
/// there are.
pub async fn served(client: &kube::Client, key: &InformerKey, by: ShardBy) -> anyhow::Result<bool> {
    let ar = key.api_resource();
    let api: kube::Api<kube::api::DynamicObject> = match &key.namespace {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &ar),
        None => kube::Api::all_with(client.clone(), &ar),
    };
    let mut req = kube::core::Request::new(api.resource_url())
        .list(&kube::api::ListParams::default().limit(1))?;
    let uri = with_selector(req.uri(), &selector(by, &split(1)))
        .ok_or_else(|| anyhow::anyhow!("cannot add a shardSelector to {}", req.uri()))?;
    *req.uri_mut() = uri;
    let text = client.request_text(req).await?;
    let list: serde_json::Value = serde_json::from_str(&text)?;
    Ok(list.pointer("/metadata/shardInfo/selector").is_some())
}

/// How long the host waits for the API server to say whether a deleted primary was made again.
const LIVE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the host asks about `key` for `stream`: a name from an owner reference is anyone's
/// text, so only a name of letters, digits and `-._:` (the rule of most kinds' names; it cannot
/// alter a field selector) in a valid namespace, the stream's when it has one. A key refused here
/// is reconciled as deleted without the read, as before the read existed (a kind whose names may
/// hold other characters, such as RBAC's, keeps that limit).
pub fn may_name(stream: &InformerKey, key: &Key) -> bool {
    wcm_validate::name(&key.name).is_ok()
        && key
            .namespace
            .as_deref()
            .is_none_or(|n| wcm_validate::namespace(n).is_ok())
        && stream
            .namespace
            .as_ref()
            .is_none_or(|ns| key.namespace.as_ref() == Some(ns))
}

/// The UID of the object of `stream` named by `key` as the API server has it now (None: there is
/// none, or `key` cannot name one: [`may_name`]). Listed by name with the stream's label selector
/// (an object outside it is none of the stream's), every range at once, as `client` (the host,
/// which lists and watches the kind and may not be granted `get`); at most
/// [`LIVE_READ_TIMEOUT`].
pub async fn live_uid(
    client: &kube::Client,
    stream: &InformerKey,
    key: &Key,
) -> Result<Option<String>, kube::Error> {
    if !may_name(stream, key) {
        return Ok(None);
    }
    let ar = stream.api_resource();
    let api: kube::Api<kube::api::DynamicObject> = match &key.namespace {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &ar),
        None => kube::Api::all_with(client.clone(), &ar),
    };
    let mut by_name =
        kube::api::ListParams::default().fields(&format!("metadata.name={}", key.name));
    if let Some(sel) = &stream.label_selector {
        by_name = by_name.labels(sel);
    }
    let listed = tokio::time::timeout(LIVE_READ_TIMEOUT, api.list_metadata(&by_name))
        .await
        .map_err(|_| {
            kube::Error::Service(format!("no answer within {LIVE_READ_TIMEOUT:?}").into())
        })??;
    Ok(listed
        .items
        .into_iter()
        .find(|o| {
            o.metadata.name.as_deref() == Some(key.name.as_str())
                && o.metadata.namespace == key.namespace
        })
        .and_then(|o| o.metadata.uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_is_added_to_the_query_encoded() {
        let sel = selector(ShardBy::Uid, &split(2)[..1]);
        let uri: Uri =
            "https://127.0.0.1:6443/api/v1/namespaces/a/configmaps?watch=true&resourceVersion=5"
                .parse()
                .expect("uri");
        let out = with_selector(&uri, &sel).expect("a uri");
        assert_eq!(out.host(), Some("127.0.0.1"));
        assert_eq!(out.path(), "/api/v1/namespaces/a/configmaps");
        let query = out.query().expect("query");
        assert!(
            query.starts_with("watch=true&resourceVersion=5&shardSelector="),
            "{query}"
        );
        let (_, value) = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "shardSelector")
            .expect("the parameter");
        assert_eq!(value, sel, "decodes to the selector");
        let bare: Uri = "/api/v1/pods".parse().expect("uri");
        assert!(
            with_selector(&bare, &sel)
                .expect("a uri")
                .to_string()
                .starts_with("/api/v1/pods?shardSelector=shardRange%28")
        );
    }
}
