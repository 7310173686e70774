//! Who may reconcile which plugin: the gate every controller follows.
//!
//! - **No election**: every gate is always open.
//! - **Whole manager** (kube-controller-manager's way): one Lease; every plugin follows it.
//! - **Per plugin**: one Lease per plugin (`LEASE-plugin-PLUGIN`), so replicas share the plugins. Each
//!   replica also renews a membership Lease (`LEASE-member-HASH`, labelled with the election's
//!   name); from the live members it knows its fair share, `ceil(plugins / members)`. It takes a
//!   free or expired plugin Lease only below its share, and gives up the Leases above it (last
//!   by name first) once their in-flight reconciles are done. A replica that dies stops renewing
//!   both kinds of Lease, so its plugins are taken over once its leases expire, when the
//!   survivors' shares have grown.
//! - **Sharded plugins** (`shards` in NAME.toml, per-plugin mode only): each of the plugin's
//!   ranges of the hash space is a unit with a Lease of its own (`LEASE-plugin-PLUGIN-shard-BY-K-of-N`),
//!   shared among the replicas by the same rule, within the plugin: a replica holds about
//!   `ceil(N / members)` of them ([`super::shards`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use sha2::Digest;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::leader::{LeaderSettings, Leadership, LeasePolicy};
use super::tenure::Tenure;
use crate::metrics::Metrics;

/// The label on membership Leases; its value is the election's (base Lease) name.
pub const MEMBER_LABEL: &str = "wasm-controller-manager.io/members-of";

/// `--leader-elect-mode`: one Lease for the manager, or one per plugin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaderMode {
    /// kube-controller-manager's way: the leader reconciles every plugin.
    #[default]
    Manager,
    /// Replicas share the plugins, each leading about its fair share.
    PerPlugin,
}

/// What one plugin's controller follows.
#[derive(Clone)]
pub struct Gate {
    /// True while its workers may take keys.
    pub taking: watch::Receiver<bool>,
    /// When its writes may go: while the Lease is held (it stays held while in-flight reconciles
    /// finish during a hand-off or shutdown), each write cut at the end of the tenure it started
    /// in, and the Lease released only once the writes in flight have ended.
    pub tenure: Arc<Tenure>,
    /// Reconciles running now.
    pub in_flight: Arc<AtomicUsize>,
    /// The holder of the Lease this plugin follows, when an election is held.
    pub leader: Option<watch::Receiver<Option<String>>>,
    /// Per plugin: keeps the plugin's elector running while a controller uses it.
    pub(super) _lease: Option<Arc<PluginLease>>,
    /// A sharded plugin's ranges, each with its own Lease; `None`: the plugin is one unit.
    pub sharding: Option<Arc<super::shards::Sharding>>,
}

impl Gate {
    /// Whether this replica leads the plugin now.
    pub fn is_taking(&self) -> bool {
        *self.taking.borrow()
    }

    /// Who leads it (the Lease holder's identity), if an election is held and someone does.
    pub fn leader(&self) -> Option<String> {
        self.leader.as_ref().and_then(|l| l.borrow().clone())
    }
}

/// The election of a running manager.
pub enum Election {
    /// Every plugin follows the same gate: always open, or one Lease for the manager.
    Shared {
        taking: watch::Receiver<bool>,
        tenure: Arc<Tenure>,
        leader: Option<watch::Receiver<Option<String>>>,
    },
    PerPlugin(Arc<PluginLeases>),
}

impl Election {
    /// The gate of plugin `plugin`. Per plugin, the first gate joins the plugin's election and
    /// the Lease is released when the last gate of that plugin is dropped. `sharded` (per-plugin
    /// mode only) splits it into that many ranges by that hash, each a unit of its own.
    pub fn gate(
        &self,
        plugin: &str,
        sharded: Option<(u32, crate::engine::shard::ShardBy)>,
    ) -> Gate {
        if let (Election::PerPlugin(leases), Some((n, by))) = (self, sharded) {
            return super::shards::sharded_gate(leases, plugin, n, by);
        }
        match self {
            Election::Shared {
                taking,
                tenure,
                leader,
            } => Gate {
                taking: taking.clone(),
                tenure: tenure.clone(),
                in_flight: Arc::default(),
                leader: leader.clone(),
                _lease: None,
                sharding: None,
            },
            Election::PerPlugin(leases) => PluginLeases::gate(leases, plugin),
        }
    }

    /// Whether this replica leads the whole manager (per plugin: whether it leads any plugin).
    pub fn leads_any(&self) -> bool {
        match self {
            Election::Shared { taking, .. } => *taking.borrow(),
            Election::PerPlugin(leases) => leases.held() > 0,
        }
    }

    /// "manager", "per-plugin", or "none".
    pub fn mode(&self) -> &'static str {
        match self {
            Election::Shared { leader: None, .. } => "none",
            Election::Shared { .. } => "manager",
            Election::PerPlugin(_) => "per-plugin",
        }
    }
}

/// One Lease per plugin, and this replica's membership.
pub struct PluginLeases {
    client: kube::Client,
    settings: LeaderSettings,
    metrics: Arc<Metrics>,
    /// False once the manager stops: no gate opens again.
    pub(super) open: watch::Receiver<bool>,
    pub(super) shares: Arc<Shares>,
    /// The live elections, by unit (a plugin, or one shard of a sharded plugin): the gates'
    /// handle, and the elector (released when the last gate goes, or all together at shutdown).
    pub(super) leases: Mutex<HashMap<String, Weak<PluginLease>>>,
    electors: Mutex<HashMap<String, (u64, Leadership)>>,
    /// Each election of a plugin on this replica gets a new generation (and identity), so the
    /// release of a stopped one can never touch its successor's Lease or entries.
    generations: std::sync::atomic::AtomicU64,
    /// The membership task, and its stop (true: delete the membership Lease on the way out).
    member: Mutex<Option<(JoinHandle<()>, tokio::sync::oneshot::Sender<bool>)>>,
}

/// What the fair share is computed from.
pub(super) struct Shares {
    /// Live replicas (at least this one).
    members: AtomicUsize,
    /// Every unit with an election on this replica: whether it holds the unit's Lease, and its
    /// in-flight reconciles.
    plugins: Mutex<BTreeMap<String, Member>>,
    /// The sharded plugins' layouts, here and on the peers.
    pub(super) layouts: Mutex<super::layouts::Layouts>,
    /// Range releases that left writes in flight and still announce their layout: a stop does
    /// not delete the membership Lease (and its announcement) while any is pending.
    dirty_releases: AtomicUsize,
}

/// A unit in the shares.
struct Member {
    /// The generation of its election on this replica.
    generation: u64,
    /// Whether this replica holds its Lease.
    holds: watch::Receiver<bool>,
    /// Its elector is trying to take its Lease, with a place in the share kept for it
    /// ([`LeasePolicy::may_acquire`] to [`LeasePolicy::attempted`]).
    reserved: Arc<AtomicBool>,
    /// Its in-flight reconciles.
    in_flight: Arc<AtomicUsize>,
    /// Units are shared out within their pool: "" for whole plugins, a sharded plugin's name
    /// for its shards.
    pool: String,
}

impl Shares {
    /// The replicas `pool` is shared out among: a sharded plugin's ranges among the replicas
    /// that run it, whole plugins among every replica.
    fn members_of(&self, pool: &str) -> usize {
        if pool.is_empty() {
            self.members.load(Ordering::Relaxed).max(1)
        } else {
            1 + self.layouts().peers_running(pool)
        }
    }

    /// How many of `pool`'s units this replica should hold, among `members` replicas.
    fn share(plugins: &BTreeMap<String, Member>, pool: &str, members: usize) -> usize {
        plugins
            .values()
            .filter(|m| m.pool == pool)
            .count()
            .div_ceil(members)
    }

    /// How many Leases of `pool` this replica should hold, and which it holds.
    fn counts(&self, pool: &str) -> (usize, Vec<String>) {
        let members = self.members_of(pool);
        let plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        let held: Vec<String> = plugins
            .iter()
            .filter(|(_, m)| m.pool == pool && *m.holds.borrow())
            .map(|(p, _)| p.clone())
            .collect();
        (Self::share(&plugins, pool, members), held)
    }

    pub(super) fn layouts(&self) -> std::sync::MutexGuard<'_, super::layouts::Layouts> {
        self.layouts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One unit's policy under the shares of its pool.
struct Share {
    plugin: String,
    pool: String,
    /// A range of the sharded plugin `pool` on this layout: held only while the replicas agree
    /// on it ([`super::layouts`]).
    layout: Option<String>,
    shares: Arc<Shares>,
    /// How long a lapsed agreement still keeps the range Leases (half a renew deadline).
    grace: Duration,
    /// Shared with this unit's [`Member`]: a place in the share kept while the Lease is being
    /// taken.
    reserved: Arc<AtomicBool>,
}

impl Share {
    fn agreed(&self) -> bool {
        self.layout
            .as_ref()
            .is_none_or(|l| self.shares.layouts().agreed(&self.pool, l))
    }

    /// A range's Lease is kept through a slow membership round, not through a disagreement.
    fn kept(&self) -> bool {
        self.layout
            .as_ref()
            .is_none_or(|l| self.shares.layouts().keeps(&self.pool, l, self.grace))
    }
}

impl LeasePolicy for Share {
    /// Under the share counting the Leases held and those being taken, checked and kept in one
    /// step: the electors of a pool decide at the same moment (a peer's Leases freed at once),
    /// and each alone would see room for every free one. Taking past the share and giving the
    /// extra back moves ranges twice, and a sharded stream lists the ones given back for
    /// nothing.
    fn may_acquire(&self) -> bool {
        if !self.agreed() {
            return false;
        }
        let members = self.shares.members_of(&self.pool);
        let plugins = self
            .shares
            .plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let taken = plugins
            .values()
            .filter(|m| {
                m.pool == self.pool && (*m.holds.borrow() || m.reserved.load(Ordering::SeqCst))
            })
            .count();
        let room = taken < Shares::share(&plugins, &self.pool, members);
        if room {
            self.reserved.store(true, Ordering::SeqCst);
        }
        room
    }

    fn attempted(&self) {
        self.reserved.store(false, Ordering::SeqCst);
    }

    fn should_release(&self) -> bool {
        let (share, names) = self.shares.counts(&self.pool);
        // The Leases past the share, by name: every replica picks the same ones to give up.
        (names.len() > share && names.iter().skip(share).any(|p| *p == self.plugin)) || !self.kept()
    }

    /// A range given up because its layout is no longer agreed is not renewed meanwhile: its
    /// writes end by the renew deadline after the last renewal, within the peers' hold.
    fn renews_while_shedding(&self) -> bool {
        self.kept()
    }

    fn busy(&self) -> bool {
        let plugins = self
            .shares
            .plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        plugins
            .get(&self.plugin)
            .is_some_and(|m| m.in_flight.load(Ordering::SeqCst) > 0)
    }
}

/// One unit's election on this replica, shared by its gates. When the last goes (the plugin
/// stopped), the plugin's Lease is released, unless the manager is stopping: then
/// [`PluginLeases::release_all`] releases every Lease once in-flight work is done.
pub struct PluginLease {
    plugin: String,
    /// The name of its Lease.
    lease: String,
    generation: u64,
    owner: Weak<PluginLeases>,
    pub(super) taking: watch::Receiver<bool>,
    pub(super) tenure: Arc<Tenure>,
    pub(super) leader: watch::Receiver<Option<String>>,
    pub(super) in_flight: Arc<AtomicUsize>,
    /// A range of a sharded plugin: the plugin and its layout (announced while the election
    /// lives, and until its Lease is released).
    layout: Option<(String, String)>,
}

impl Drop for PluginLease {
    fn drop(&mut self) {
        let Some(owner) = self.owner.upgrade() else {
            return;
        };
        if !*owner.open.borrow() {
            return;
        }
        // A range's layout is announced until its Lease is released with its writes ended.
        let unannounce = {
            let layout = self.layout.clone();
            move |owner: &PluginLeases| {
                if let Some((plugin, layout)) = &layout {
                    owner.shares.layouts().unregister(plugin, layout);
                }
            }
        };
        let tenure = self.tenure.clone();
        // Only this generation's entries: a successor may have joined already.
        let mine = |g: u64| g == self.generation;
        {
            let mut plugins = owner
                .shares
                .plugins
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if plugins
                .get(&self.plugin)
                .is_some_and(|m| mine(m.generation))
            {
                plugins.remove(&self.plugin);
            }
        }
        let elector = {
            let mut electors = owner.electors.lock().unwrap_or_else(|p| p.into_inner());
            match electors.get(&self.plugin) {
                Some((g, _)) if mine(*g) => electors.remove(&self.plugin).map(|(_, l)| l),
                _ => None,
            }
        };
        match (elector, tokio::runtime::Handle::try_current()) {
            (Some(l), Ok(rt)) => {
                let lease = self.lease.clone();
                let plugin = self.plugin.clone();
                let owner = self.owner.clone();
                rt.spawn(async move {
                    l.release().await;
                    // Writes still in flight (the Lease left to expire instead): the layout
                    // stays announced until the Lease has expired.
                    if tenure.writes() > 0
                        && let Some(o) = owner.upgrade()
                    {
                        let wait = o.settings.lease_duration;
                        o.shares.dirty_releases.fetch_add(1, Ordering::SeqCst);
                        drop(o);
                        tokio::time::sleep(wait).await;
                        if let Some(o) = owner.upgrade() {
                            o.shares.dirty_releases.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    // The plugin's status series goes with its election, unless a successor
                    // joined meanwhile (it sets its series once it is in the map: both under
                    // this lock).
                    if let Some(owner) = owner.upgrade() {
                        unannounce(&owner);
                        let electors = owner.electors.lock().unwrap_or_else(|p| p.into_inner());
                        if !electors.contains_key(&plugin) {
                            owner.metrics.forget_leader(&lease);
                        }
                    }
                });
            }
            // Replaced by a successor of the same unit (same layout), or never elected.
            _ => unannounce(&owner),
        }
    }
}

impl PluginLeases {
    /// Starts this replica's membership; plugins join as their controllers start.
    pub fn start(
        client: kube::Client,
        settings: LeaderSettings,
        metrics: Arc<Metrics>,
        open: watch::Receiver<bool>,
    ) -> Result<Arc<PluginLeases>> {
        settings.check()?;
        let shares = Arc::new(Shares {
            members: AtomicUsize::new(1),
            plugins: Mutex::default(),
            layouts: Mutex::new(super::layouts::Layouts::new(settings.lease_duration)),
            dirty_releases: AtomicUsize::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let member = Membership {
            leases: Api::namespaced(client.clone(), &settings.namespace),
            name: member_lease_name(&settings),
            settings: settings.clone(),
            shares: shares.clone(),
            seen: HashMap::new(),
            renewing: Trouble::default(),
            counting: Trouble::default(),
            disagreeing: BTreeMap::new(),
            unreadable: false,
            announced: HashMap::new(),
        };
        let task = tokio::spawn(member.run(stopped));
        Ok(Arc::new(PluginLeases {
            client,
            settings,
            metrics,
            open,
            shares,
            leases: Mutex::default(),
            electors: Mutex::default(),
            generations: std::sync::atomic::AtomicU64::new(0),
            member: Mutex::new(Some((task, stop))),
        }))
    }

    /// How many Leases (of plugins and of shards) this replica holds.
    pub fn held(&self) -> usize {
        let plugins = self
            .shares
            .plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        plugins.values().filter(|m| *m.holds.borrow()).count()
    }

    fn gate(self: &Arc<Self>, plugin: &str) -> Gate {
        let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        leases.retain(|_, l| l.strong_count() > 0);
        let lease = self.unit_lease(&mut leases, plugin, "", &self.lease_name(plugin), None);
        Gate {
            taking: all_of(lease.taking.clone(), self.open.clone()),
            tenure: lease.tenure.clone(),
            in_flight: lease.in_flight.clone(),
            leader: Some(lease.leader.clone()),
            _lease: Some(lease),
            sharding: None,
        }
    }

    /// The live election of unit `unit` (a plugin, or a range of one) in `pool`, on Lease
    /// `lease_name`: the one its gates share, joined if no gate holds it. `layout`: a range of
    /// the sharded plugin `pool` on that layout.
    pub(super) fn unit_lease(
        self: &Arc<Self>,
        leases: &mut HashMap<String, Weak<PluginLease>>,
        unit: &str,
        pool: &str,
        lease_name: &str,
        layout: Option<&str>,
    ) -> Arc<PluginLease> {
        if let Some(l) = leases.get(unit).and_then(Weak::upgrade) {
            return l;
        }
        let l = Arc::new(self.join(unit, pool, lease_name, layout));
        leases.insert(unit.to_string(), Arc::downgrade(&l));
        l
    }

    /// The name of `plugin`'s Lease.
    pub(super) fn lease_name(&self, plugin: &str) -> String {
        format!("{}-plugin-{plugin}", self.settings.lease_name)
    }

    /// Joins the election of unit `plugin` (a plugin, or a shard) in `pool`, on Lease
    /// `lease_name`; `layout`: a range of the sharded plugin `pool` on that layout.
    fn join(
        self: &Arc<Self>,
        plugin: &str,
        pool: &str,
        lease_name: &str,
        layout: Option<&str>,
    ) -> PluginLease {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        if let Some(layout) = layout {
            self.shares.layouts().register(pool, layout);
        }
        let lease_name = lease_name.to_string();
        let settings = LeaderSettings {
            lease_name: lease_name.clone(),
            identity: format!("{}-{generation}", self.settings.identity),
            ..self.settings.clone()
        };
        let in_flight = Arc::new(AtomicUsize::new(0));
        let reserved = Arc::new(AtomicBool::new(false));
        let policy = Arc::new(Share {
            reserved: reserved.clone(),
            plugin: plugin.to_string(),
            pool: pool.to_string(),
            layout: layout.map(str::to_string),
            shares: self.shares.clone(),
            grace: self.settings.renew_deadline / 2,
        });
        // The settings were checked when the leases started; a failure here cannot happen, but
        // if it did the plugin would stay a standby rather than take the manager down.
        let leadership = Leadership::join_with(
            self.client.clone(),
            settings,
            self.metrics.clone(),
            Some(policy),
        )
        .map_err(|e| tracing::error!(plugin, "cannot join the plugin's election: {e:#}"))
        .ok();
        let (taking, holds, tenure, leader) = match &leadership {
            Some(l) => (l.taking(), l.subscribe(), l.tenure(), l.holder()),
            None => (
                watch::channel(false).1,
                watch::channel(false).1,
                Tenure::closed(),
                watch::channel(None).1,
            ),
        };
        self.shares
            .plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                plugin.to_string(),
                Member {
                    generation,
                    holds: holds.clone(),
                    reserved,
                    in_flight: in_flight.clone(),
                    pool: pool.to_string(),
                },
            );
        if let Some(l) = leadership {
            // A previous elector of this plugin (its gates just went) is replaced, not leaked.
            let mut electors = self.electors.lock().unwrap_or_else(|p| p.into_inner());
            // Set again under the lock: a predecessor's release may have removed the series. The
            // borrow holds the elector's next change (and its own metric write) until this one.
            let holds = l.subscribe();
            let leading = holds.borrow();
            self.metrics.leader(&lease_name, *leading);
            drop(leading);
            let old = electors.insert(plugin.to_string(), (generation, l));
            drop(electors);
            if let Some((_, old)) = old {
                tokio::spawn(old.release());
            }
        }
        PluginLease {
            plugin: plugin.to_string(),
            lease: lease_name,
            generation,
            owner: Arc::downgrade(self),
            taking,
            tenure,
            leader,
            in_flight,
            layout: layout.map(|l| (pool.to_string(), l.to_string())),
        }
    }

    /// Releases every plugin Lease this replica holds and leaves the membership, so peers take
    /// the plugins over at their next look. Call it once in-flight work is done.
    pub async fn release_all(&self) {
        let electors: Vec<Leadership> = self
            .electors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, (_, l))| l)
            .collect();
        let tenures: Vec<Arc<Tenure>> = electors.iter().map(Leadership::tenure).collect();
        let releases: Vec<_> = electors.into_iter().map(Leadership::release).collect();
        futures::future::join_all(releases).await;
        // Writes still in flight (under any Lease), or a range release that left some: the
        // membership Lease is left to expire, its announcement still read by peers.
        let clean = tenures.iter().all(|t| t.writes() == 0)
            && self.shares.dirty_releases.load(Ordering::SeqCst) == 0;
        let member = self.member.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((task, stop)) = member {
            let _ = stop.send(clean);
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

/// A receiver that is true while both inputs are; it ends with them or when nobody listens.
pub(super) fn all_of(
    mut a: watch::Receiver<bool>,
    mut b: watch::Receiver<bool>,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(*a.borrow_and_update() && *b.borrow_and_update());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = a.changed() => if r.is_err() { break },
                r = b.changed() => if r.is_err() { break },
                _ = tx.closed() => return,
            }
            tx.send_replace(*a.borrow_and_update() && *b.borrow_and_update());
        }
        tx.send_replace(false);
    });
    rx
}

/// The name of this replica's membership Lease: the election's name and a digest of the
/// identity (a Pod name and suffix may be longer than a name allows).
fn member_lease_name(settings: &LeaderSettings) -> String {
    let digest = sha2::Sha256::digest(settings.identity.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{}-member-{hex}", settings.lease_name)
}

/// Renews this replica's membership Lease and counts the live members every retry period.
struct Membership {
    leases: Api<Lease>,
    name: String,
    settings: LeaderSettings,
    shares: Arc<Shares>,
    /// Each member Lease's resourceVersion and when this replica first saw it: a member whose
    /// Lease has not changed for the lease duration (on this replica's clock) is gone.
    seen: HashMap<String, (String, Instant)>,
    renewing: Trouble,
    counting: Trouble,
    /// By sharded plugin, the layouts last warned of as differing between the replicas.
    disagreeing: BTreeMap<String, String>,
    /// Whether an unreadable announcement was last warned of.
    unreadable: bool,
    /// Each peer's announcement of its sharded layouts (read: None when past the bounds), and
    /// when its Lease last changed: kept for [`Membership::hold`] after that, live or not,
    /// listed or not.
    announced: HashMap<String, (Option<super::layouts::Announced>, Instant)>,
}

/// `call`, cut at `limit` (each membership call has half the round), so a call that hangs is a
/// failure reported like any other, not a round cut off before it could say so.
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// The state of one recurring call, so a failure is a warning when it starts (or changes), not
/// at every retry, and its end is said too.
#[derive(Debug, Default)]
struct Trouble {
    failing: Option<String>,
}

impl Trouble {
    /// Notes a failure; true when it is new (not the same error as the previous round).
    fn failed(&mut self, e: impl std::fmt::Display) -> bool {
        let e = e.to_string();
        let new = self.failing.as_deref() != Some(e.as_str());
        self.failing = Some(e);
        new
    }

    /// Notes a success; true when it ends a failure.
    fn worked(&mut self) -> bool {
        self.failing.take().is_some()
    }
}

impl Membership {
    async fn run(mut self, mut stopped: tokio::sync::oneshot::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.settings.retry_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                leave = &mut stopped => {
                    if leave.unwrap_or(true) {
                        break;
                    }
                    // Writes still in flight: the Lease (and any announcement of sharded
                    // layouts) is left to expire, so peers and newcomers still read it.
                    return;
                }
                _ = tick.tick() => {}
            }
            let deadline = self.settings.renew_deadline;
            let round = async {
                self.renew().await;
                self.count().await;
            };
            let _ = tokio::time::timeout(deadline, round).await;
        }
        // Leaving: peers count one member fewer at once.
        if let Err(e) = self
            .leases
            .delete(&self.name, &DeleteParams::default())
            .await
        {
            tracing::debug!(lease = %self.name, "deleting the membership Lease failed: {e}");
        }
    }

    async fn renew(&mut self) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: i32::try_from(self.settings.lease_duration.as_secs()).ok(),
            renew_time: Some(now),
            ..Default::default()
        };
        // The layouts of the sharded plugins this replica runs ([`super::layouts`]).
        let (layouts, generations) = self.shares.layouts().announcement();
        let annotate = |meta: &mut ObjectMeta| {
            let a = meta.annotations.get_or_insert_with(Default::default);
            if layouts.is_empty() {
                a.remove(super::layouts::ANNOTATION);
            } else {
                a.insert(super::layouts::ANNOTATION.to_string(), layouts.clone());
            }
        };
        let sent = Instant::now();
        let write = async {
            match self.leases.get_opt(&self.name).await {
                Ok(Some(mut lease)) => {
                    lease.spec = Some(spec);
                    annotate(&mut lease.metadata);
                    self.leases
                        .replace(&self.name, &PostParams::default(), &lease)
                        .await
                        .map(drop)
                }
                Ok(None) => {
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            labels: Some(
                                [(MEMBER_LABEL.to_string(), self.settings.lease_name.clone())]
                                    .into(),
                            ),
                            ..Default::default()
                        },
                        spec: Some(spec),
                    };
                    annotate(&mut lease.metadata);
                    self.leases
                        .create(&PostParams::default(), &lease)
                        .await
                        .map(drop)
                }
                Err(e) => Err(e),
            }
        };
        let written = within(self.settings.renew_deadline / 2, write).await;
        if written.is_ok() {
            self.shares.layouts().written(generations, sent);
        }
        match written {
            Ok(_) if self.renewing.worked() => {
                tracing::info!(lease = %self.name, "the membership Lease is renewed again");
            }
            Ok(_) => {}
            Err(e) if self.renewing.failed(&e) => tracing::warn!(
                lease = %self.name,
                "renewing this replica's membership Lease failed: {e}; peers stop counting this \
                 replica after the lease duration, so the plugins are not shared evenly until \
                 it works (needs get, create and update on leases)"
            ),
            Err(e) => {
                tracing::debug!(lease = %self.name, "renewing the membership Lease failed: {e}")
            }
        }
    }

    async fn count(&mut self) {
        // Only what was written before the list began counts as seen by the peers.
        let basis = self.shares.layouts().count_basis();
        let selector = format!("{MEMBER_LABEL}={}", self.settings.lease_name);
        let params = ListParams::default().labels(&selector);
        let listed = self.leases.list_metadata(&params);
        let list = match within(self.settings.renew_deadline / 2, listed).await {
            Ok(l) => {
                if self.counting.worked() {
                    tracing::info!("the membership Leases are listed again");
                }
                l
            }
            Err(e) => {
                if self.counting.failed(&e) {
                    tracing::warn!(
                        "listing the membership Leases failed: {e}; this replica keeps its last \
                         count of replicas ({}), so its share of the plugins is not updated, and \
                         its sharded plugins stop once their agreement on a layout lapses (a \
                         lease duration), until it works (needs list on leases)",
                        self.shares.members.load(Ordering::Relaxed)
                    );
                } else {
                    tracing::debug!("listing the membership Leases failed: {e}");
                }
                return;
            }
        };
        let mut live = 1;
        let mut present = Vec::new();
        let mut live_peers = Vec::new();
        let mut gone = Vec::new();
        let hold = self.hold();
        for lease in list.items {
            let (Some(name), Some(rv)) = (lease.metadata.name, lease.metadata.resource_version)
            else {
                continue;
            };
            let layouts = lease
                .metadata
                .annotations
                .and_then(|mut a| a.remove(super::layouts::ANNOTATION))
                .unwrap_or_default();
            present.push(name.clone());
            let entry = self
                .seen
                .entry(name.clone())
                .or_insert_with(|| (rv.clone(), Instant::now()));
            if entry.0 != rv {
                *entry = (rv.clone(), Instant::now());
            }
            let since = entry.1.elapsed();
            if name == self.name {
                continue;
            }
            let announces = !layouts.is_empty();
            self.announced
                .insert(name.clone(), (super::layouts::parse(&layouts), entry.1));
            if since <= self.settings.lease_duration {
                live += 1;
                live_peers.push(name.clone());
            } else if !announces || since > hold {
                // Gone (killed, never left): removed, unless renewed meanwhile, so a replica that
                // joins later does not count it for another lease duration. A member that was
                // only cut off makes its Lease again at its next renewal. One announcing sharded
                // layouts stays for the hold, so a replica that starts meanwhile reads them too.
                gone.push((name.clone(), rv));
            }
        }
        self.seen.retain(|n, _| present.contains(n));
        let before = self.shares.members.swap(live, Ordering::Relaxed);
        if before != live {
            tracing::info!(members = live, "replicas sharing the plugins");
        }
        // A peer's announcement is kept for the hold after its last change, whether its Lease
        // expired or went: until then it may still be reconciling on its layout.
        self.announced
            .retain(|_, (_, changed)| changed.elapsed() <= hold);
        self.agree(basis, &live_peers);
        for (name, rv) in gone {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            let _ = within(
                self.settings.renew_deadline / 4,
                self.leases.delete(&name, &dp),
            )
            .await;
        }
    }

    /// How long a peer's announcement is kept after its Lease last changed. The peer stops taking
    /// keys a lease duration after its last renewal's send; it keeps its range Leases half a
    /// renew deadline more, notices at its next step (a retry period), waits at most half a
    /// renew deadline for reconciles in flight, and its writes end by a renew deadline after its
    /// last range renewal: `lease + 2 × renew + retry`, below this hold by `lease − retry`.
    fn hold(&self) -> Duration {
        2 * (self.settings.lease_duration + self.settings.renew_deadline)
    }

    /// Takes the peers' layouts in, and says when a sharded plugin's replicas start or stop
    /// disagreeing on its layout (its keys wait meanwhile).
    fn agree(&mut self, basis: (BTreeMap<String, u64>, Option<Instant>), live_peers: &[String]) {
        let mut layouts = self.shares.layouts();
        layouts.counted(
            basis,
            self.announced
                .iter()
                .map(|(name, (announced, _))| super::layouts::Peer {
                    announced: announced.as_ref(),
                    live: live_peers.contains(name),
                }),
        );
        let running = layouts.plugins();
        let mut now = BTreeMap::new();
        for plugin in &running {
            if let Some((here, peers)) = layouts.disagreement(plugin) {
                now.insert(
                    plugin.clone(),
                    format!(
                        "{} here, {} on peers",
                        here.join(" and "),
                        peers.join(" and ")
                    ),
                );
            }
        }
        let unreadable = layouts.unreadable();
        drop(layouts);
        if unreadable && !self.unreadable {
            tracing::warn!(
                "a membership Lease announces more sharded layouts than a replica reads (over \
                 512 entries or 64 KiB): no sharded plugin reconciles its keys while it is there"
            );
        }
        self.unreadable = unreadable;
        for (plugin, what) in &now {
            if self.disagreeing.get(plugin) != Some(what) {
                tracing::warn!(
                    plugin,
                    "the replicas run this sharded plugin with different shards or shard_by \
                     ({what}): none reconciles its keys until every replica runs one layout"
                );
            }
        }
        for plugin in self.disagreeing.keys() {
            if !now.contains_key(plugin) && running.contains(plugin) {
                tracing::info!(
                    plugin,
                    "the replicas run one layout of this sharded plugin again"
                );
            }
        }
        self.disagreeing = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `units` units of pool `pool` in shares of `members` replicas, with their policies and the
    /// senders of whether this replica holds each.
    fn pool(
        units: usize,
        members: usize,
        pool: &str,
        layout: Option<&str>,
    ) -> (Arc<Shares>, Vec<(Share, watch::Sender<bool>)>) {
        let shares = Arc::new(Shares {
            members: AtomicUsize::new(members),
            plugins: Mutex::default(),
            layouts: Mutex::new(super::super::layouts::Layouts::new(Duration::from_secs(6))),
            dirty_releases: AtomicUsize::new(0),
        });
        let units = (0..units)
            .map(|i| {
                let (holds_tx, holds) = watch::channel(false);
                let reserved = Arc::new(AtomicBool::new(false));
                let unit = format!("p{i}");
                shares.plugins.lock().unwrap().insert(
                    unit.clone(),
                    Member {
                        generation: 0,
                        holds,
                        reserved: reserved.clone(),
                        in_flight: Arc::default(),
                        pool: pool.to_string(),
                    },
                );
                let share = Share {
                    plugin: unit,
                    pool: pool.to_string(),
                    layout: layout.map(str::to_string),
                    shares: shares.clone(),
                    grace: Duration::from_secs(2),
                    reserved,
                };
                (share, holds_tx)
            })
            .collect();
        (shares, units)
    }

    #[test]
    fn electors_deciding_at_once_take_no_more_than_the_share() {
        // 12 units over 2 replicas; this one holds 4, and the other 8 are free at once.
        let (_shares, units) = pool(12, 2, "", None);
        for (_, holds) in &units[..4] {
            holds.send_replace(true);
        }
        let allowed: Vec<usize> = (4..12).filter(|&i| units[i].0.may_acquire()).collect();
        assert_eq!(allowed, vec![4, 5], "two places left in a share of 6");
        // A take that failed gives its place back; one that worked keeps it as held.
        units[4].0.attempted();
        units[5].1.send_replace(true);
        units[5].0.attempted();
        assert!(
            units[6].0.may_acquire(),
            "the failed take's place is free again"
        );
        assert!(!units[7].0.may_acquire(), "the share is full again");
    }

    #[test]
    fn a_lease_just_taken_counts_once_and_gives_nothing_up() {
        // A share of 2: one held, one being taken.
        let (_shares, units) = pool(4, 2, "", None);
        {
            // A share of 3 with one held and one held and still reserved: room for one more.
            let (_shares, three) = pool(6, 2, "", None);
            three[0].1.send_replace(true);
            assert!(three[1].0.may_acquire());
            three[1].1.send_replace(true);
            assert!(
                three[2].0.may_acquire(),
                "a Lease held and reserved counts once"
            );
            assert!(!three[3].0.may_acquire(), "then full");
        }
        units[0].1.send_replace(true);
        assert!(units[1].0.may_acquire());
        // Taken: held and still reserved until its round ends.
        units[1].1.send_replace(true);
        // A place kept for a Lease not held is never a reason to give one up.
        units[3].0.reserved.store(true, Ordering::SeqCst);
        assert!(
            (0..4).all(|i| !units[i].0.should_release()),
            "exactly the share held: nothing to give up"
        );
        units[3].0.attempted();
        assert!(!units[2].0.may_acquire(), "full");
        units[1].0.attempted();
        assert!(!units[3].0.may_acquire(), "still full once the round ends");
        // Past the share (a third held): the one past it by name goes.
        units[2].1.send_replace(true);
        let giving: Vec<usize> = (0..4).filter(|&i| units[i].0.should_release()).collect();
        assert_eq!(giving, vec![2], "the Leases past the share of 2, by name");
    }

    #[test]
    fn a_sharded_plugins_ranges_are_taken_within_the_share_of_the_replicas_agreeing() {
        use super::super::layouts::{Peer, parse};
        let (shares, units) = pool(12, 1, "stamper", Some("12/uid"));
        for (_, holds) in &units[..4] {
            holds.send_replace(true);
        }
        let count = |peer: &str| {
            let mut l = shares.layouts();
            l.register("stamper", "12/uid");
            let (_, generations) = l.announcement();
            l.written(generations, Instant::now());
            let announced = parse(peer);
            let basis = l.count_basis();
            l.counted(
                basis,
                [Peer {
                    announced: announced.as_ref(),
                    live: true,
                }],
            );
        };
        // A peer on another layout: nothing taken, and no place kept by the refusals.
        count("stamper=4/uid");
        assert!((4..12).all(|i| !units[i].0.may_acquire()));
        // The peer moves: a share of 6 among the two, so two more here.
        count("stamper=12/uid");
        let allowed: Vec<usize> = (4..12).filter(|&i| units[i].0.may_acquire()).collect();
        assert_eq!(allowed, vec![4, 5]);
    }

    #[test]
    fn a_failure_is_new_once_and_its_end_is_noticed() {
        let mut t = Trouble::default();
        assert!(!t.worked(), "nothing failed yet");
        assert!(t.failed("403 forbidden"));
        assert!(
            !t.failed("403 forbidden"),
            "the same failure again is not new"
        );
        assert!(t.failed("timed out"), "another failure is");
        assert!(t.worked());
        assert!(!t.worked());
        assert!(
            t.failed("403 forbidden"),
            "a failure after a success is new again"
        );
    }
}
