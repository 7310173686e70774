//! Lists and watches that carry a `shardSelector` (KEP-5866, issue #28): the API server then sends
//! only the objects whose hash falls in the selected ranges, so a replica caches only its share.
//!
//! kube-runtime's watcher has no field for it, so the informer of a sharded plugin gets a client of
//! its own whose GET requests (its list and its watch, the only requests it makes) carry the
//! parameter. The selector is the host's own text ([`crate::engine::shard::selector`]), never a
//! plugin's. An API server without the gate ignores the parameter and sends every object: the
//! host-side filter still divides the work, and [`ignored`] tells the operator.

use http::{Method, Request, Uri};
use kube::client::Body;

use crate::engine::shard::{Range, ShardBy, hash_of};

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

/// Whether a listed object lies outside `ranges`: the API server ignored the selector (its
/// `ShardedListAndWatch` gate is off).
pub fn ignored(by: ShardBy, ranges: &[Range], uid: &str, namespace: Option<&str>) -> bool {
    let h = hash_of(by, uid, namespace);
    !ranges.iter().any(|r| r.contains(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::shard::{selector, split};

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

    #[test]
    fn an_object_outside_the_ranges_shows_the_selector_was_ignored() {
        let halves = split(2);
        let uid = "0b5e6c1a-0000-4000-8000-00000000f00f";
        let inside = halves
            .iter()
            .position(|r| r.contains(hash_of(ShardBy::Uid, uid, None)))
            .expect("one half holds it");
        assert!(!ignored(ShardBy::Uid, &halves[inside..=inside], uid, None));
        assert!(ignored(
            ShardBy::Uid,
            &halves[1 - inside..=1 - inside],
            uid,
            None
        ));
    }
}
