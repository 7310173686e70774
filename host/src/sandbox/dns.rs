//! DNS lookups for plugins' outbound HTTP, bounded in number.
//!
//! A lookup is the system resolver's `getaddrinfo` (so `/etc/hosts`, `nsswitch.conf` and the
//! cluster's search domains apply as for any program) on tokio's blocking pool. A blocking lookup
//! cannot be cancelled: when the request that asked for it times out, the thread goes on waiting
//! for the resolver. So each lookup holds two permits until it returns, not until its request
//! gives up: one of its plugin's ([`LOOKUPS_PER_PLUGIN`]) and one of the host's
//! ([`LOOKUPS_OVERALL`]). A plugin whose names never answer has at most
//! [`LOOKUPS_PER_PLUGIN`] threads and resolver queries in flight; its further requests wait for a
//! permit within their connect timeout. All plugins together hold at most [`LOOKUPS_OVERALL`]
//! threads of the blocking pool (512 by default), which the loader and the compile cache use too.
//! See docs/decisions.md (an async resolver was considered).

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::sync::Semaphore;
use wasmtime_wasi_http::Error;

use super::http::{Host, Target};

/// DNS lookups one plugin may have in flight.
pub const LOOKUPS_PER_PLUGIN: usize = 4;
/// DNS lookups all plugins together may have in flight.
pub const LOOKUPS_OVERALL: usize = 32;
/// Addresses of one name that are checked and tried; a name with more is cut short.
pub const MAX_ADDRESSES: usize = 32;

static OVERALL: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(LOOKUPS_OVERALL)));

/// A blocking lookup: the system resolver, or a stand-in in tests.
pub type Lookup = fn(&str, u16) -> std::io::Result<Vec<IpAddr>>;

/// The system resolver (`getaddrinfo`).
pub fn system_lookup(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    Ok((name, port)
        .to_socket_addrs()?
        .take(MAX_ADDRESSES)
        .map(|a| a.ip())
        .collect())
}

/// The addresses of the target, resolved once (the connection uses these, and only these), with
/// the system resolver; `plugin` holds the plugin's lookup permits. Waiting for a permit and the
/// lookup itself fall within `timeout`.
pub async fn resolve(
    target: &Target,
    timeout: Duration,
    plugin: &Arc<Semaphore>,
) -> Result<Vec<IpAddr>, Error> {
    resolve_with(target, timeout, plugin, &OVERALL, system_lookup).await
}

/// [`resolve`] with the host-wide permits and the lookup given.
pub async fn resolve_with(
    target: &Target,
    timeout: Duration,
    plugin: &Arc<Semaphore>,
    overall: &Arc<Semaphore>,
    lookup: Lookup,
) -> Result<Vec<IpAddr>, Error> {
    let name = match &target.host {
        Host::Ip(ip) => return Ok(vec![*ip]),
        Host::Name(n) => n.clone(),
    };
    let port = target.port;
    let (plugin, overall) = (plugin.clone(), overall.clone());
    let found = tokio::time::timeout(timeout, async move {
        let closed = || Error::InternalError(Some("DNS lookups are shut down".into()));
        let own = plugin.acquire_owned().await.map_err(|_| closed())?;
        let all = overall.acquire_owned().await.map_err(|_| closed())?;
        tokio::task::spawn_blocking(move || {
            // Held until the resolver answers, whether or not anyone still waits for it.
            let _held = (own, all);
            lookup(&name, port)
        })
        .await
        .map_err(|_| Error::InternalError(Some("the DNS lookup failed".into())))
    })
    .await
    .map_err(|_| Error::DnsTimeout)??
    .map_err(|_| Error::DnsError {
        rcode: None,
        info_code: None,
    })?;
    if found.is_empty() {
        return Err(Error::DestinationNotFound);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
    static MOST: AtomicUsize = AtomicUsize::new(0);
    static STARTED: AtomicUsize = AtomicUsize::new(0);

    /// A resolver that takes 400 ms to answer, counting lookups in flight.
    fn slow_lookup(_name: &str, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        STARTED.fetch_add(1, Ordering::SeqCst);
        let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
        MOST.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(400));
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        Ok(vec!["10.0.0.1".parse().expect("static address")])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lookup_that_timed_out_keeps_its_permit_until_the_resolver_returns() {
        let target = Target {
            host: Host::Name("slow.example".into()),
            port: 80,
            tls: false,
        };
        let plugin = Arc::new(Semaphore::new(LOOKUPS_PER_PLUGIN));
        let overall = Arc::new(Semaphore::new(LOOKUPS_OVERALL));
        // 50 requests at once, each giving up after 50 ms: every one times out.
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let (t, p, o) = (target.clone(), plugin.clone(), overall.clone());
                tokio::spawn(async move {
                    resolve_with(&t, Duration::from_millis(50), &p, &o, slow_lookup).await
                })
            })
            .collect();
        for t in tasks {
            let r = t.await.expect("task");
            assert!(matches!(r, Err(Error::DnsTimeout)), "{r:?}");
        }
        // The requests are gone; their lookups are not, and still hold the permits.
        assert_eq!(plugin.available_permits(), 0);
        assert_eq!(
            overall.available_permits(),
            LOOKUPS_OVERALL - LOOKUPS_PER_PLUGIN
        );
        // A new request of the plugin cannot start a fifth lookup meanwhile.
        let r = resolve_with(
            &target,
            Duration::from_millis(50),
            &plugin,
            &overall,
            slow_lookup,
        )
        .await;
        assert!(matches!(r, Err(Error::DnsTimeout)), "{r:?}");
        assert_eq!(STARTED.load(Ordering::SeqCst), LOOKUPS_PER_PLUGIN);
        assert!(MOST.load(Ordering::SeqCst) <= LOOKUPS_PER_PLUGIN);
        // Once the resolver has answered, the permits are back, and a patient request succeeds.
        let r = resolve_with(
            &target,
            Duration::from_secs(5),
            &plugin,
            &overall,
            slow_lookup,
        )
        .await;
        assert_eq!(
            r.expect("resolved"),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(plugin.available_permits(), LOOKUPS_PER_PLUGIN);
        assert_eq!(overall.available_permits(), LOOKUPS_OVERALL);
        assert!(MOST.load(Ordering::SeqCst) <= LOOKUPS_PER_PLUGIN);
    }

    #[tokio::test]
    async fn addresses_need_no_lookup_and_names_use_the_system_resolver() {
        let plugin = Arc::new(Semaphore::new(1));
        let ip = Target {
            host: Host::Ip("127.0.0.1".parse().unwrap()),
            port: 80,
            tls: false,
        };
        assert_eq!(
            resolve(&ip, Duration::from_secs(1), &plugin).await.unwrap(),
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        // `localhost` is in /etc/hosts: loopback, no query leaves the machine.
        let name = Target {
            host: Host::Name("localhost".into()),
            port: 80,
            tls: false,
        };
        let found = resolve(&name, Duration::from_secs(5), &plugin)
            .await
            .unwrap();
        assert!(found.iter().all(|a| a.is_loopback()), "{found:?}");
        assert_eq!(plugin.available_permits(), 1);
    }
}
