//! Which layout of each sharded plugin the replicas run (issue #28): one layout at a time.
//!
//! A sharded plugin's layout is its `shards` and `shard_by` (`12/uid`). Two layouts name other
//! Leases over overlapping ranges, so replicas on two layouts could reconcile the same key at
//! once. Each replica announces, on its membership Lease (the annotation [`ANNOTATION`], written
//! at every renewal), the layouts of the sharded plugins it runs; each reads the peers' at every
//! count. A replica takes keys of a plugin's ranges only while:
//!
//! - it runs one layout of the plugin (a reload to another layout stops both at once), and
//! - its last count of the peers began after its current layouts of the plugin were written, and
//!   saw every live peer that runs the plugin on that same layout.
//!
//! An agreement lasts a lease duration from the send of the renewal it rests on: a replica whose
//! membership is not renewed (stalled, cut off) stops taking the keys and gives its ranges up
//! before its peers stop reading its announcement, which they keep for
//! `2 × (lease duration + renew deadline)` after its last change, whether its Lease expired or
//! was deleted (an expired membership Lease that announces layouts is deleted only after that
//! hold, so a replica started meanwhile reads it too). A replica not agreed takes no range Lease
//! and gives up those it holds, through the usual hand-over (in-flight reconciles, then writes,
//! then the release): at once when a peer runs another layout, half a renew deadline after a
//! lapse (a slow round). A range given up so is not renewed while its reconciles finish, so its
//! writes end a renew deadline after its last renewal, within the peers' hold. A layout leaves the
//! announcement only once its range Leases are released with their writes ended, or a lease
//! duration after a release that left writes in flight. So of two replicas on two layouts, the
//! one whose count came later saw the other's layout (each wrote before it read): neither takes
//! keys until they agree, and then one layout does. While they disagree the plugin waits (its
//! keys are not reconciled), and the replicas say so in `/debug/controllers` and in the log.
//!
//! The announcement also says which peers run the plugin at all, so a plugin's ranges are shared
//! among the replicas that run it, not among every member.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::shard::{MAX_SHARDS, ShardBy};

/// The annotation on a membership Lease: `PLUGIN=N/BY` for each sharded plugin layout the
/// replica runs, comma-separated, in order.
pub const ANNOTATION: &str = "wasm-controller-manager.io/sharded-layouts";

/// The most entries read from one peer's annotation (anything past is ignored).
const MAX_ENTRIES: usize = 512;
/// The longest annotation read from a peer.
const MAX_TEXT: usize = 64 * 1024;

/// A layout's text: `N/BY`.
pub fn layout(n: u32, by: ShardBy) -> String {
    format!("{n}/{by}")
}

/// One entry of a peer's annotation, if it is well-formed: a plugin name (a DNS label) and a
/// layout of 2..=MAX_SHARDS ranges by `uid` or `namespace`. Anything else is ignored.
fn entry(s: &str) -> Option<(String, String)> {
    let (plugin, l) = s.split_once('=')?;
    let (digits, by) = l.split_once('/')?;
    wcm_validate::dns_label(plugin).ok()?;
    let n: u32 = digits.parse().ok()?;
    if !(2..=MAX_SHARDS).contains(&n) || n.to_string() != digits {
        return None;
    }
    let by = match by {
        "uid" => ShardBy::Uid,
        "namespace" => ShardBy::Namespace,
        _ => return None,
    };
    Some((plugin.to_string(), layout(n, by)))
}

/// A peer's announcement as read: by plugin, its layouts.
pub type Announced = BTreeMap<String, BTreeSet<String>>;

/// A peer's announcement, read strictly: by plugin, its layouts. An entry of another form is
/// ignored (a later version may announce more); one past the bounds makes the whole announcement
/// unreadable (None), which agrees with no layout.
pub fn parse(text: &str) -> Option<Announced> {
    if text.len() > MAX_TEXT || text.split(',').nth(MAX_ENTRIES).is_some() {
        return None;
    }
    let mut out = Announced::new();
    for (plugin, l) in text.split(',').filter_map(entry) {
        out.entry(plugin).or_default().insert(l);
    }
    Some(out)
}

/// Whether an agreement sent on the channel holds at `now`.
pub fn holds(until: Option<Instant>, now: Instant) -> bool {
    until.is_some_and(|u| now < u)
}

/// What this replica knows of the layouts: its own, what it wrote, and what its peers announce.
pub struct Layouts {
    /// How long an agreement lasts after the send of the renewal it rests on.
    validity: Duration,
    /// This replica's layouts by plugin: how many range elections of each are alive.
    local: BTreeMap<String, BTreeMap<String, usize>>,
    /// By plugin, a number that changes whenever its set of local layouts does.
    generation: BTreeMap<String, u64>,
    next: u64,
    /// The generations of the last announcement written, and when its renewal was sent.
    written: (BTreeMap<String, u64>, Option<Instant>),
    /// The generations written before the last count of the peers began, and until when that
    /// count's view holds.
    counted: (BTreeMap<String, u64>, Option<Instant>),
    /// By plugin, the live peers that run it and the layouts of every peer announcing it (live,
    /// or gone within the hold).
    peers: BTreeMap<String, (usize, BTreeSet<String>)>,
    /// A peer's announcement past the bounds: no layout is agreed.
    unreadable: bool,
    /// Until when each local (plugin, layout) may take keys (None: it may not), as its
    /// controllers follow it.
    agreement: HashMap<(String, String), watch::Sender<Option<Instant>>>,
}

/// What one count saw of a peer.
pub struct Peer<'a> {
    /// Its announcement, as read (None: past the bounds).
    pub announced: Option<&'a Announced>,
    /// Its membership is live (it counts in the shares); else it is only held.
    pub live: bool,
}

impl Layouts {
    /// Agreements last `validity` (the lease duration) after the renewal they rest on.
    pub fn new(validity: Duration) -> Layouts {
        Layouts {
            validity,
            local: BTreeMap::new(),
            generation: BTreeMap::new(),
            next: 0,
            written: (BTreeMap::new(), None),
            counted: (BTreeMap::new(), None),
            peers: BTreeMap::new(),
            unreadable: false,
            agreement: HashMap::new(),
        }
    }

    /// A range election of `plugin` on `layout` joined here.
    pub fn register(&mut self, plugin: &str, layout: &str) {
        let n = self
            .local
            .entry(plugin.to_string())
            .or_default()
            .entry(layout.to_string())
            .or_default();
        *n += 1;
        if *n == 1 {
            self.changed(plugin);
        }
    }

    /// A range election of `plugin` on `layout` ended here (its Lease released, or left).
    pub fn unregister(&mut self, plugin: &str, layout: &str) {
        let Some(layouts) = self.local.get_mut(plugin) else {
            return;
        };
        let Some(n) = layouts.get_mut(layout) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n > 0 {
            return;
        }
        layouts.remove(layout);
        if layouts.is_empty() {
            self.local.remove(plugin);
        }
        self.changed(plugin);
    }

    fn changed(&mut self, plugin: &str) {
        self.next += 1;
        self.generation.insert(plugin.to_string(), self.next);
        self.generation
            .retain(|p, _| self.local.contains_key(p) || p == plugin);
        self.recompute();
    }

    /// The announcement to write, and the generations it carries.
    pub fn announcement(&self) -> (String, BTreeMap<String, u64>) {
        let text = self
            .local
            .iter()
            .flat_map(|(p, ls)| ls.keys().map(move |l| format!("{p}={l}")))
            .collect::<Vec<_>>()
            .join(",");
        (text, self.generation.clone())
    }

    /// The announcement with these generations was written by a renewal sent at `sent`.
    pub fn written(&mut self, generations: BTreeMap<String, u64>, sent: Instant) {
        self.written = (generations, Some(sent));
    }

    /// What a count of the peers is based on: what was written before it began.
    pub fn count_basis(&self) -> (BTreeMap<String, u64>, Option<Instant>) {
        self.written.clone()
    }

    /// A count of the peers, begun after `basis` was written: each peer's announcement.
    pub fn counted<'a>(
        &mut self,
        basis: (BTreeMap<String, u64>, Option<Instant>),
        peers: impl IntoIterator<Item = Peer<'a>>,
    ) {
        let mut view: BTreeMap<String, (usize, BTreeSet<String>)> = BTreeMap::new();
        self.unreadable = false;
        for peer in peers {
            let Some(announced) = peer.announced else {
                self.unreadable = true;
                continue;
            };
            for (plugin, layouts) in announced {
                let v = view.entry(plugin.clone()).or_default();
                v.0 += usize::from(peer.live);
                v.1.extend(layouts.iter().cloned());
            }
        }
        self.peers = view;
        self.counted = (basis.0, basis.1.map(|sent| sent + self.validity));
        self.recompute();
    }

    /// The sharded plugins this replica runs.
    pub fn plugins(&self) -> Vec<String> {
        self.local.keys().cloned().collect()
    }

    /// The live peers that run `plugin` (on any layout), as last counted.
    pub fn peers_running(&self, plugin: &str) -> usize {
        self.peers.get(plugin).map_or(0, |v| v.0)
    }

    /// Until when this replica may take keys of `plugin` on `layout` (None: it may not).
    pub fn agreed_until(&self, plugin: &str, layout: &str) -> Option<Instant> {
        let local = self.local.get(plugin)?;
        let only_this = local.len() == 1 && local.contains_key(layout);
        let seen_after_written = self.generation.contains_key(plugin)
            && self.counted.0.get(plugin) == self.generation.get(plugin);
        let peers_agree = self
            .peers
            .get(plugin)
            .is_none_or(|(_, ls)| ls.iter().all(|l| l == layout));
        (only_this && seen_after_written && peers_agree && !self.unreadable)
            .then_some(self.counted.1)
            .flatten()
    }

    /// Whether this replica may take keys of `plugin` on `layout` now.
    pub fn agreed(&self, plugin: &str, layout: &str) -> bool {
        self.keeps(plugin, layout, Duration::ZERO)
    }

    /// Whether this replica keeps its range Leases of `plugin` on `layout`: agreed, or an
    /// agreement that lapsed less than `grace` ago (a slow round; no key is taken meanwhile). A
    /// layout the peers disagree with is given up at once.
    pub fn keeps(&self, plugin: &str, layout: &str, grace: Duration) -> bool {
        holds(
            self.agreed_until(plugin, layout).map(|u| u + grace),
            Instant::now(),
        )
    }

    /// Follows until when this replica may take keys of `plugin` on `layout`. Its receivers are
    /// told when that starts or stops holding at the moment of a change (not when it lapses).
    pub fn agreement(&mut self, plugin: &str, layout: &str) -> watch::Receiver<Option<Instant>> {
        let now = self.agreed_until(plugin, layout);
        self.agreement
            .entry((plugin.to_string(), layout.to_string()))
            .or_insert_with(|| watch::channel(now).0)
            .subscribe()
    }

    /// The layouts the live peers run `plugin` on, when they differ from this replica's.
    pub fn disagreement(&self, plugin: &str) -> Option<(Vec<String>, Vec<String>)> {
        let local: Vec<String> = self.local.get(plugin)?.keys().cloned().collect();
        let peers: Vec<String> = self
            .peers
            .get(plugin)
            .map(|(_, ls)| ls.iter().cloned().collect())
            .unwrap_or_default();
        let differ = local.len() > 1 || peers.iter().any(|l| !local.contains(l));
        differ.then_some((local, peers))
    }

    /// Whether a peer's announcement could not be read (past the bounds).
    pub fn unreadable(&self) -> bool {
        self.unreadable
    }

    fn recompute(&mut self) {
        let at = Instant::now();
        let keys: Vec<(String, String)> = self.agreement.keys().cloned().collect();
        for (p, l) in keys {
            let until = self.agreed_until(&p, &l);
            if let Some(tx) = self.agreement.get(&(p, l)) {
                // Every value is kept (an agreement renewed moves its end on); receivers are
                // told only when whether it holds changes.
                tx.send_if_modified(|v| {
                    let told = holds(*v, at) != holds(until, at);
                    *v = until;
                    told
                });
            }
        }
        self.agreement.retain(|_, tx| tx.receiver_count() > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes this replica's announcement (sent now), then counts the peers: each announcement
    /// and whether it is live.
    fn round(l: &mut Layouts, peers: &[(&str, bool)]) {
        let (_, generations) = l.announcement();
        l.written(generations, Instant::now());
        count(l, peers);
    }

    fn count(l: &mut Layouts, peers: &[(&str, bool)]) {
        let read: Vec<(Option<Announced>, bool)> =
            peers.iter().map(|(t, live)| (parse(t), *live)).collect();
        l.counted(
            l.count_basis(),
            read.iter().map(|(a, live)| Peer {
                announced: a.as_ref(),
                live: *live,
            }),
        );
    }

    #[test]
    fn a_peers_announcement_is_read_strictly() {
        let p = parse("a=12/uid,b=4/namespace,a=4/uid").expect("readable");
        assert_eq!(
            p["a"],
            BTreeSet::from(["12/uid".to_string(), "4/uid".to_string()])
        );
        assert_eq!(p["b"], BTreeSet::from(["4/namespace".to_string()]));
        for other in [
            "A=12/uid",
            "a=1/uid",
            "a=65/uid",
            "a=012/uid",
            "a=+4/uid",
            "a=4/name",
            "a=4",
            "a/4=uid",
            "=4/uid",
            "a=4/uid/x",
        ] {
            assert_eq!(parse(other), Some(BTreeMap::new()), "{other}: ignored");
        }
        assert_eq!(parse(&"a=4/uid,".repeat(MAX_TEXT)), None, "too long");
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("p{i}=4/uid")).collect();
        assert_eq!(parse(&many.join(",")), None, "too many entries");
        assert_eq!(
            parse(&many[1..].join(",")).map(|p| p.len()),
            Some(MAX_ENTRIES)
        );
    }

    #[test]
    fn keys_are_taken_only_on_one_layout_seen_by_every_peer_after_it_was_written() {
        let mut l = Layouts::new(Duration::from_secs(15));
        l.register("p", "12/uid");
        l.register("p", "12/uid");
        let agreed = l.agreement("p", "12/uid");
        let now = || holds(*agreed.borrow(), Instant::now());
        assert!(!now(), "not written yet");
        let (text, generations) = l.announcement();
        assert_eq!(text, "p=12/uid");
        // A count that began before the write does not count.
        let basis = l.count_basis();
        l.written(generations, Instant::now());
        let a = parse("p=12/uid");
        l.counted(
            basis,
            [Peer {
                announced: a.as_ref(),
                live: true,
            }],
        );
        assert!(!now());
        count(&mut l, &[("p=12/uid", true), ("q=4/uid", true)]);
        assert!(now(), "written, then every peer seen on it");
        assert!(l.agreed("p", "12/uid"));
        assert_eq!(l.peers_running("p"), 1);
        assert_eq!(l.peers_running("q"), 1);
        assert_eq!(l.disagreement("p"), None);

        // A peer on another layout: no keys here until it moves.
        round(&mut l, &[("p=4/uid", true)]);
        assert!(!now());
        assert_eq!(
            l.disagreement("p"),
            Some((vec!["12/uid".into()], vec!["4/uid".into()]))
        );
        round(&mut l, &[("p=12/uid", true), ("other=4/uid", true)]);
        assert!(now());

        // A peer gone (its membership expired or deleted) but still held: its layout still
        // counts, though it no longer runs the plugin in the shares.
        round(&mut l, &[("p=4/uid", false)]);
        assert!(!now());
        assert_eq!(l.peers_running("p"), 0);
        // An unreadable announcement agrees with nothing.
        round(&mut l, &[(&"p=12/uid,".repeat(MAX_TEXT), true)]);
        assert!(!now());
        assert!(l.unreadable());
        round(&mut l, &[("p=12/uid", true)]);
        assert!(now());

        // This replica reloads onto 4/uid: both of its layouts stop at once, and the new one
        // waits for its announcement to be written and a count after it.
        l.register("p", "4/uid");
        let new = l.agreement("p", "4/uid");
        let new_now = || holds(*new.borrow(), Instant::now());
        assert!(!now() && !new_now());
        l.unregister("p", "12/uid");
        assert!(!now(), "one of two elections of 12/uid is left");
        l.unregister("p", "12/uid");
        assert_eq!(l.announcement().0, "p=4/uid");
        count(&mut l, &[("", true)]);
        assert!(!new_now(), "the new layout is not written yet");
        round(&mut l, &[("p=12/uid", true)]);
        assert!(!new_now(), "the peer is still on the old layout");
        round(&mut l, &[("p=4/uid", true), ("", true)]);
        assert!(new_now());

        // Another plugin's change does not stop this one.
        l.register("q", "4/uid");
        assert!(new_now());
        assert_eq!(l.announcement().0, "p=4/uid,q=4/uid");
    }

    #[test]
    fn an_agreement_lapses_a_lease_duration_after_the_renewal_it_rests_on() {
        let mut l = Layouts::new(Duration::from_secs(15));
        l.register("p", "4/uid");
        let agreed = l.agreement("p", "4/uid");
        let (_, generations) = l.announcement();
        // A renewal sent 16 s ago: the count after it agrees, but not now.
        l.written(
            generations.clone(),
            Instant::now() - Duration::from_secs(16),
        );
        count(&mut l, &[("p=4/uid", true)]);
        assert!(
            agreed.borrow().is_some(),
            "agreed until a moment in the past"
        );
        assert!(!holds(*agreed.borrow(), Instant::now()));
        assert!(!l.agreed("p", "4/uid"));
        assert!(!l.keeps("p", "4/uid", Duration::from_millis(500)));
        assert!(
            l.keeps("p", "4/uid", Duration::from_secs(2)),
            "within the grace"
        );
        // A renewal sent 10 s ago: it holds for 5 s more.
        l.written(generations, Instant::now() - Duration::from_secs(10));
        count(&mut l, &[("p=4/uid", true)]);
        let until = agreed.borrow().expect("agreed");
        assert!(until > Instant::now() + Duration::from_secs(4));
        assert!(until <= Instant::now() + Duration::from_secs(5));
    }
}
