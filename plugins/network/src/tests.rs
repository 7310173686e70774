//! Native unit tests with the SDK's MockHost; HTTP answered by a small model of the Neutron and
//! Keystone calls this plugin makes. The plugin is also tested against the real Neutron and
//! Keystone in `host/tests/network.rs`.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::{Value, json};
use wcm_sdk::http::{HttpRequest, HttpResponse, Method};
use wcm_sdk::testing::MockHost;
use wcm_sdk::{Action, ObjectKey, Reconciler};

use super::*;

#[derive(Default)]
struct Cloud {
    networks: Vec<Value>,
    subnets: Vec<Value>,
    tokens: usize,
    next: usize,
    /// Neutron answers 401 to this token (revoked, or expired early).
    revoked: Option<String>,
    /// Subnet creates fail with 503 (Neutron going down mid-change).
    subnet_creates_fail: bool,
    /// Lists come back without their array.
    lists_broken: bool,
}

fn host() -> (MockHost, Rc<RefCell<Cloud>>) {
    let host = MockHost::new();
    host.set_config("keystone-url", "http://keystone.test:5000/v3")
        .set_config("neutron-url", "http://neutron.test:9696")
        .set_secret("application-credential-id", "id")
        .set_secret("application-credential-secret", "s");
    host.declare(NetworkPlugin::describe());
    let cloud = Rc::new(RefCell::new(Cloud::default()));
    let c = cloud.clone();
    host.on_http(move |req: &HttpRequest| Ok(answer(&mut c.borrow_mut(), req)));
    (host, cloud)
}

fn answer(c: &mut Cloud, req: &HttpRequest) -> HttpResponse {
    let path = req.path_and_query().to_string();
    if path == "/v3/auth/tokens" {
        c.tokens += 1;
        let token = if c.tokens == 1 {
            "tok".to_string()
        } else {
            format!("tok-{}", c.tokens)
        };
        return HttpResponse::json(
            201,
            &json!({"token": {"expires_at": "2999-01-01T00:00:00Z"}}),
        )
        .with_header("X-Subject-Token", &token);
    }
    let token = req.header("x-auth-token").unwrap_or_default();
    assert!(token.starts_with("tok"), "{token}");
    if c.revoked.as_deref() == Some(token) {
        return HttpResponse::new(401);
    }
    let body: Value = req.body_json().unwrap_or(Value::Null);
    if c.subnet_creates_fail && req.method == Method::Post && path == "/v2.0/subnets" {
        return HttpResponse::new(503);
    }
    if c.lists_broken && req.method == Method::Get {
        return HttpResponse::json(200, &json!({}));
    }
    c.next += 1;
    let id = format!("{:08x}-0000-4000-8000-000000000000", c.next);
    match (req.method, path.as_str()) {
        (Method::Get, p) if p.starts_with("/v2.0/networks?tags=") => {
            let tag = &p["/v2.0/networks?tags=".len()..];
            let found: Vec<_> = c
                .networks
                .iter()
                .filter(|n| n["tags"][0] == tag)
                .cloned()
                .collect();
            HttpResponse::json(200, &json!({"networks": found}))
        }
        (Method::Get, p) if p.starts_with("/v2.0/networks?description=") => {
            let d = &p["/v2.0/networks?description=".len()..];
            let found: Vec<_> = c
                .networks
                .iter()
                .filter(|n| n["description"] == d)
                .cloned()
                .collect();
            HttpResponse::json(200, &json!({"networks": found}))
        }
        // As the real Neutron: no tags in a network create.
        (Method::Post, "/v2.0/networks") if body["network"].get("tags").is_some() => {
            HttpResponse::json(400, &json!({"NeutronError": {"type": "HTTPBadRequest"}}))
        }
        (Method::Post, "/v2.0/networks") => {
            let mut n = body["network"].clone();
            n["id"] = json!(id);
            n["tags"] = json!([]);
            c.networks.push(n.clone());
            HttpResponse::json(201, &json!({"network": n}))
        }
        (Method::Put, p) if p.starts_with("/v2.0/networks/") && p.contains("/tags/") => {
            let rest = &p["/v2.0/networks/".len()..];
            let (nid, tag) = rest.split_once("/tags/").unwrap_or_default();
            for n in c.networks.iter_mut().filter(|n| n["id"] == nid) {
                n["tags"] = json!([tag]);
            }
            HttpResponse::new(201)
        }
        (Method::Get, p) if p.starts_with("/v2.0/subnets?network_id=") => {
            let net = &p["/v2.0/subnets?network_id=".len()..];
            let found: Vec<_> = c
                .subnets
                .iter()
                .filter(|s| s["network_id"] == net)
                .cloned()
                .collect();
            HttpResponse::json(200, &json!({"subnets": found}))
        }
        (Method::Post, "/v2.0/subnets") => {
            let mut s = body["subnet"].clone();
            s["id"] = json!(id);
            c.subnets.push(s.clone());
            HttpResponse::json(201, &json!({"subnet": s}))
        }
        (Method::Put, p) if p.starts_with("/v2.0/subnets/") => {
            let sid = &p["/v2.0/subnets/".len()..];
            for s in c.subnets.iter_mut().filter(|s| s["id"] == sid) {
                s["gateway_ip"] = body["subnet"]["gateway_ip"].clone();
            }
            HttpResponse::json(200, &json!({}))
        }
        (Method::Delete, p) => {
            let id = p.rsplit('/').next().unwrap_or_default().to_string();
            c.subnets.retain(|s| s["id"] != id.as_str());
            c.networks.retain(|n| n["id"] != id.as_str());
            HttpResponse::new(204)
        }
        _ => panic!("unexpected request {:?} {path}", req.method),
    }
}

fn seed(host: &MockHost, cidr: &str, gateway: &str) {
    host.seed(&json!({
        "apiVersion": "samplecrd.k8s.io/v1", "kind": "Network",
        "metadata": {"name": "blue", "namespace": "team", "uid": "u-1", "generation": 1,
                     "finalizers": [FINALIZER]},
        "spec": {"cidr": cidr, "gateway": gateway},
    }));
}

fn run(host: &MockHost) -> Result<Action, wcm_sdk::Error> {
    host.run::<NetworkPlugin>(ObjectKey::namespaced("team", "blue"))
}

fn status(host: &MockHost) -> NetworkStatus {
    let n: Network = host.object(Some("team"), "blue").expect("exists");
    n.status.unwrap_or_default()
}

#[test]
fn an_invalid_spec_is_marked_and_never_sent() {
    let (host, _) = host();
    seed(&host, "10.0.0.0/24", "10.0.1.1");
    assert_eq!(run(&host), Ok(Action::done()));
    assert!(
        host.http_requests().is_empty(),
        "nothing may reach Neutron or Keystone"
    );
    let s = status(&host);
    assert_eq!(
        s.condition("Invalid").map(|c| c.status.as_str()),
        Some("True")
    );
    assert!(s.condition("Invalid").unwrap().message.contains("outside"));
    let events = host.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, "InvalidSpec");
}

#[test]
fn network_and_subnet_are_created_once_and_then_left_alone() {
    let (host, cloud) = host();
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    run(&host).expect("synced");
    {
        let c = cloud.borrow();
        assert_eq!(c.networks.len(), 1);
        assert_eq!(c.networks[0]["tags"], json!(["k8s-uid-u-1"]));
        assert_eq!(c.networks[0]["description"], "k8s-uid-u-1");
        assert_eq!(c.networks[0]["name"], "team/blue");
        assert_eq!(c.subnets.len(), 1);
        assert_eq!(c.subnets[0]["cidr"], "10.0.0.0/24");
    }
    let s = status(&host);
    assert_eq!(
        s.condition("Ready").map(|c| c.status.as_str()),
        Some("True")
    );
    assert!(s.network_id.is_some() && s.subnet_id.is_some());
    // Again, as after a restart: nothing created, nothing written.
    host.sync_cache().clear_records();
    run(&host).expect("synced");
    let writes: Vec<_> = host
        .http_requests()
        .into_iter()
        .filter(|r| r.method != Method::Get && !r.url.ends_with("/auth/tokens"))
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
    assert!(host.patches().is_empty(), "{:?}", host.patches());
    assert_eq!(cloud.borrow().networks.len(), 1);
}

#[test]
fn a_new_gateway_moves_the_pools_and_a_new_cidr_replaces_the_subnet() {
    let (host, cloud) = host();
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    run(&host).expect("synced");
    seed(&host, "10.0.0.0/24", "10.0.0.100");
    run(&host).expect("gateway moved");
    let put = host
        .http_requests()
        .into_iter()
        .find(|r| r.method == Method::Put && r.url.contains("/subnets/"))
        .expect("a PUT of the subnet");
    let body: Value = put.body_json().unwrap();
    assert_eq!(body["subnet"]["gateway_ip"], "10.0.0.100");
    assert_eq!(
        body["subnet"]["allocation_pools"],
        json!([{"start": "10.0.0.1", "end": "10.0.0.99"}, {"start": "10.0.0.101", "end": "10.0.0.254"}])
    );
    seed(&host, "10.1.0.0/16", "10.1.0.1");
    run(&host).expect("subnet replaced");
    let c = cloud.borrow();
    assert_eq!(c.subnets.len(), 1);
    assert_eq!(c.subnets[0]["cidr"], "10.1.0.0/16");
    assert_eq!(c.networks.len(), 1);
}

#[test]
fn a_network_created_but_not_yet_tagged_is_adopted() {
    let (host, cloud) = host();
    // What a stop right after the create leaves: described, untagged, no subnet.
    cloud
        .borrow_mut()
        .networks
        .push(json!({"id": "0000aaaa-0000-4000-8000-000000000000", "description": "k8s-uid-u-1", "tags": []}));
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    run(&host).expect("synced");
    let c = cloud.borrow();
    assert_eq!(c.networks.len(), 1, "{:?}", c.networks);
    assert_eq!(c.networks[0]["tags"], json!(["k8s-uid-u-1"]));
    assert_eq!(c.subnets.len(), 1);
    assert_eq!(
        c.subnets[0]["network_id"],
        "0000aaaa-0000-4000-8000-000000000000"
    );
}

#[test]
fn a_spec_change_that_fails_halfway_is_not_ready() {
    let (host, cloud) = host();
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    run(&host).expect("synced");
    host.sync_cache();
    cloud.borrow_mut().subnet_creates_fail = true;
    let mut n: Network = host.object(Some("team"), "blue").expect("exists");
    n.spec.cidr = "10.1.0.0/16".into();
    n.spec.gateway = "10.1.0.1".into();
    n.metadata.generation = Some(2);
    let mut obj = serde_json::to_value(&n).expect("json");
    obj["apiVersion"] = json!("samplecrd.k8s.io/v1");
    obj["kind"] = json!("Network");
    host.seed(&obj);
    run(&host).expect_err("the new subnet could not be made");
    let s = status(&host);
    assert_eq!(
        s.condition("Ready").map(|c| c.status.as_str()),
        Some("False")
    );
    assert_eq!(
        s.condition("Synced").map(|c| c.reason.as_str()),
        Some("NeutronUnavailable")
    );
    assert_eq!(s.subnet_id, None, "the deleted subnet is not reported");
    assert_eq!(cloud.borrow().subnets.len(), 0);
    // Neutron back: the next try completes it.
    cloud.borrow_mut().subnet_creates_fail = false;
    host.sync_cache();
    run(&host).expect("synced");
    assert_eq!(
        status(&host).condition("Ready").map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(cloud.borrow().subnets.len(), 1);
}

#[test]
fn an_answer_without_its_list_never_creates_a_network() {
    let (host, cloud) = host();
    cloud.borrow_mut().lists_broken = true;
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    run(&host).expect_err("no list, no decision");
    assert!(cloud.borrow().networks.is_empty());
}

#[test]
fn one_token_serves_many_reconciles() {
    let (host, cloud) = host();
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    for _ in 0..5 {
        // The watch brings each reconcile's status write back into the cache (a write from a
        // stale copy would be a 409, as in the cluster).
        host.sync_cache();
        run(&host).expect("synced");
    }
    assert_eq!(cloud.borrow().tokens, 1);
}

#[test]
fn a_refused_token_is_replaced_once() {
    let (host, cloud) = host();
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    run(&host).expect("synced");
    // The cached token stops working (revoked): one new token, the call retried, all well.
    cloud.borrow_mut().revoked = Some("tok".into());
    host.sync_cache().clear_records();
    run(&host).expect("synced with a new token");
    assert_eq!(
        cloud.borrow().tokens,
        2,
        "{:?}",
        host.http_requests()
            .iter()
            .map(|r| (
                r.method,
                r.url.clone(),
                r.header("x-auth-token").map(str::to_string)
            ))
            .collect::<Vec<_>>()
    );
    // A new token refused too: no loop, one retry only, and a retryable error.
    cloud.borrow_mut().revoked = Some("tok-2".into());
    let mut c = cloud.borrow_mut();
    c.tokens = 2;
    drop(c);
    let before = host.http_requests().len();
    let err = {
        // Every token from now on is refused.
        let c2 = cloud.clone();
        host.on_http(move |req: &HttpRequest| {
            let mut c = c2.borrow_mut();
            if req.path_and_query() == "/v3/auth/tokens" {
                c.tokens += 1;
                return Ok(HttpResponse::json(201, &json!({"token": {}}))
                    .with_header("X-Subject-Token", "bad"));
            }
            Ok(HttpResponse::new(401))
        });
        run(&host).expect_err("Neutron refuses every token")
    };
    assert!(!err.is_terminal(), "{err}");
    let sent = host.http_requests().len() - before;
    assert!(
        sent <= 4,
        "one new token and one retry, not a loop: {sent} requests"
    );
}

#[test]
fn missing_configuration_is_terminal() {
    let host = MockHost::new();
    host.declare(NetworkPlugin::describe());
    seed(&host, "10.0.0.0/24", "10.0.0.1");
    let e = run(&host).expect_err("no configuration");
    assert!(e.is_terminal(), "{e}");
    assert!(e.message().contains("keystone-url"), "{e}");
}

#[test]
fn only_the_configured_endpoints_are_declared() {
    let (_host, _) = host();
    let d = NetworkPlugin::describe();
    assert_eq!(
        d.outbound_hosts,
        vec!["keystone.test:5000", "neutron.test:9696"]
    );
}
