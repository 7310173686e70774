//! Shares of the instance pool: how the `--max-instances` component instances wasmtime's pooling
//! allocator holds are divided between the plugins, so that no plugin, nor a few, can take every
//! slot from the rest.
//!
//! - **Per-component size.** A component may hold at most [`MAX_CORE_INSTANCES`] core instances,
//!   [`MAX_MEMORIES`] linear memories and [`MAX_TABLES`] tables. The pool is sized for
//!   `--max-instances` component instances at that size (`Runtime::new`), so only component-instance
//!   slots are ever scarce: a component made of many tiny core modules cannot run the pool out of
//!   core instances, memories or tables. One over the caps is refused when it is compiled, with
//!   the cap in the message (it does not change until the file does).
//! - **Slots.** Of the `--max-instances` slots, [`describe_slots`] are kept for `describe`; each
//!   loaded plugin version has one slot of its own, reserved at load ([`InstancePool::reserve`])
//!   and given back when the version is dropped; the rest is shared. A plugin's first instance
//!   takes its own slot, further ones (up to its `max_instances`, a semaphore of its own) come
//!   from the shared part. So a plugin whose instances sleep up to their wall timeout can hold the
//!   shared part, but never another plugin's own slot, nor `describe`'s.
//! - **Room for the next plugin.** The last [`spare_slots`] of the shared part are not handed out
//!   as shared slots: a plugin loaded while the rest is all in use gets its first instance at once.
//! - **Waiting.** A call that finds no slot waits for one (its caller bounds the wait); it never
//!   fails the file. A reservation shrinks the shared part at once, even while it is all in use
//!   (more plugins loaded at once than there are spare slots): the shared slots then freed go to
//!   the plugins' own slots first, so such a plugin waits for its first instance at most until one
//!   shared instance ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Core instances one component may hold (every plugin built so far holds 3; the Python one 14).
pub const MAX_CORE_INSTANCES: u32 = 32;
/// Linear memories one component may hold (every plugin built so far holds 1).
pub const MAX_MEMORIES: u32 = 2;
/// Tables one component may hold (every plugin built so far holds 2).
pub const MAX_TABLES: u32 = 16;
/// Slots kept for `describe` (the loader describes at most this many files at once).
pub const DESCRIBE_SLOTS: u32 = 2;

/// Slots kept for `describe` out of `total`: two, but never more than half the pool.
pub fn describe_slots(total: u32) -> u32 {
    (total / 2).min(DESCRIBE_SLOTS)
}

/// Spare slots of the shared part kept free for plugins about to load: two, at most a quarter.
pub const SPARE_SLOTS: u32 = 2;

/// The spare slots of a shared part of `shared` slots.
pub fn spare_slots(shared: u32) -> u32 {
    (shared / 4).min(SPARE_SLOTS)
}

/// A compile error made clear when it is a per-component cap: the component is refused until the
/// file changes, and the message names the cap.
pub fn too_large(e: anyhow::Error) -> anyhow::Error {
    let text = format!("{e:#}");
    if text.contains("which exceeds the configured maximum")
        && text.contains("in the pooling allocator")
    {
        return anyhow::anyhow!(
            "the component is larger than a plugin may be ({MAX_CORE_INSTANCES} core instances, {MAX_MEMORIES} linear memories, {MAX_TABLES} tables at most): {text}"
        );
    }
    e
}

/// The host-wide accounting of instance slots.
pub struct InstancePool {
    total: u32,
    describe: u32,
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct State {
    /// Plugin versions holding a slot of their own.
    reserved: u32,
    /// Own slots in use.
    own: u32,
    /// Shared slots in use.
    shared: u32,
    /// `describe` slots in use.
    describing: u32,
}

/// How the pool is used now (for `/debug/controllers` and the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolUse {
    pub total: u32,
    pub describe_slots: u32,
    /// Plugin versions with a slot of their own.
    pub reserved: u32,
    pub own_in_use: u32,
    /// The shared part: what is neither `describe`'s nor a plugin's own.
    pub shared: u32,
    /// Of the shared part, kept free for plugins about to load.
    pub spare: u32,
    pub shared_in_use: u32,
    pub describing: u32,
}

/// One plugin version's own slot, reserved while it is loaded.
pub struct PluginShare(Arc<ShareInner>);

struct ShareInner {
    pool: Arc<InstancePool>,
    /// Changed only under the pool's lock.
    busy: AtomicBool,
}

impl Drop for ShareInner {
    fn drop(&mut self) {
        self.pool
            .change(|s| s.reserved = s.reserved.saturating_sub(1));
    }
}

/// A slot held for one instance's life.
pub struct InstanceSlot {
    pool: Arc<InstancePool>,
    source: Source,
}

enum Source {
    Own(Arc<ShareInner>),
    Shared,
    Describe,
}

impl InstanceSlot {
    /// Whether the slot is one of the shared part's (not the plugin's own, nor `describe`'s).
    pub fn is_shared(&self) -> bool {
        matches!(self.source, Source::Shared)
    }
}

impl Drop for InstanceSlot {
    fn drop(&mut self) {
        match &self.source {
            Source::Own(share) => self.pool.change(|s| {
                share.busy.store(false, Ordering::Relaxed);
                s.own = s.own.saturating_sub(1);
            }),
            Source::Shared => self.pool.change(|s| s.shared = s.shared.saturating_sub(1)),
            Source::Describe => self
                .pool
                .change(|s| s.describing = s.describing.saturating_sub(1)),
        }
    }
}

impl InstancePool {
    pub fn new(total: u32) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(InstancePool {
            total,
            describe: describe_slots(total),
            state: Mutex::new(State::default()),
            freed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the state and wakes every waiter to look again.
    fn change(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.freed.notify_waiters();
    }

    fn shared_size(&self, s: &State) -> u32 {
        self.total.saturating_sub(self.describe + s.reserved)
    }

    /// Reserves a slot of its own for a plugin version being loaded. Refused (the plugin waits,
    /// and is tried again) when every slot but `describe`'s is someone's own already.
    pub fn reserve(self: &Arc<Self>) -> Result<PluginShare, String> {
        let mut s = self.lock();
        if s.reserved + self.describe >= self.total {
            return Err(format!(
                "no instance slot left to reserve for it: --max-instances {} keeps {} for describe and one for each of the {} plugin versions loaded; raise --max-instances",
                self.total, self.describe, s.reserved
            ));
        }
        s.reserved += 1;
        Ok(PluginShare(Arc::new(ShareInner {
            pool: self.clone(),
            busy: AtomicBool::new(false),
        })))
    }

    /// A slot for one instance: the plugin's own if free, else a shared one (`describe`: one of
    /// its own, else a shared one). Waits until there is one; the caller bounds the wait.
    pub async fn slot(self: &Arc<Self>, share: Option<&PluginShare>) -> InstanceSlot {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a slot freed in between is not missed.
            freed.as_mut().enable();
            if let Some(source) = self.try_take(share) {
                return InstanceSlot {
                    pool: self.clone(),
                    source,
                };
            }
            freed.await;
        }
    }

    fn try_take(&self, share: Option<&PluginShare>) -> Option<Source> {
        let mut s = self.lock();
        // Never more live instances outside `describe`'s slots than the rest of the pool, even
        // while a reservation made when the shared part was full has shrunk it below its use.
        let room = s.own + s.shared < self.total - self.describe;
        match share {
            Some(PluginShare(inner)) if room && !inner.busy.load(Ordering::Relaxed) => {
                inner.busy.store(true, Ordering::Relaxed);
                s.own += 1;
                return Some(Source::Own(inner.clone()));
            }
            None if s.describing < self.describe => {
                s.describing += 1;
                return Some(Source::Describe);
            }
            _ => {}
        }
        let shared = self.shared_size(&s);
        if room && s.shared < shared - spare_slots(shared) {
            s.shared += 1;
            return Some(Source::Shared);
        }
        None
    }

    /// How the pool is used now.
    pub fn usage(&self) -> PoolUse {
        let s = *self.lock();
        PoolUse {
            total: self.total,
            describe_slots: self.describe,
            reserved: s.reserved,
            own_in_use: s.own,
            shared: self.shared_size(&s),
            spare: spare_slots(self.shared_size(&s)),
            shared_in_use: s.shared,
            describing: s.describing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn within(pool: &Arc<InstancePool>, share: Option<&PluginShare>) -> Option<InstanceSlot> {
        tokio::time::timeout(Duration::from_millis(50), pool.slot(share))
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_plugin_holding_every_shared_slot_leaves_the_others_own_slot_and_describe() {
        let pool = InstancePool::new(8);
        let hog = pool.reserve().expect("reserve");
        let honest = pool.reserve().expect("reserve");
        // 8 = 2 for describe + 2 own + 4 shared (1 of them spare): the hog takes its own and
        // every shared slot it may.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(within(&pool, Some(&hog)).await.expect("a slot for the hog"));
        }
        assert!(
            within(&pool, Some(&hog)).await.is_none(),
            "{:?}",
            pool.usage()
        );
        let own = within(&pool, Some(&honest)).await;
        assert!(
            own.is_some(),
            "the honest plugin's own slot: {:?}",
            pool.usage()
        );
        assert!(
            within(&pool, Some(&honest)).await.is_none(),
            "a second instance would be shared"
        );
        let d1 = within(&pool, None).await.expect("describe");
        let d2 = within(&pool, None).await.expect("describe");
        assert!(within(&pool, None).await.is_none(), "{:?}", pool.usage());
        drop((d1, d2, own));
        // One hog instance ends: the freed slot is a shared one, and goes to whoever waits.
        held.pop();
        assert!(within(&pool, Some(&honest)).await.is_some());
    }

    #[tokio::test]
    async fn a_reservation_made_while_the_shared_part_is_full_gets_the_next_freed_slot() {
        let pool = InstancePool::new(6);
        let hog = pool.reserve().expect("reserve");
        let mut held = Vec::new();
        // 6 = 2 describe + 1 own + 3 shared (none spare: a quarter of 3 is 0).
        for _ in 0..4 {
            held.push(within(&pool, Some(&hog)).await.expect("slot"));
        }
        let late = pool
            .reserve()
            .expect("a reservation does not wait for a free slot");
        assert_eq!(pool.usage().shared, 2);
        // Every non-describe slot is in use: the newcomer waits, and so does the hog.
        assert!(within(&pool, Some(&late)).await.is_none());
        // Describe still has its own.
        assert!(within(&pool, None).await.is_some());
        let waiting = tokio::spawn({
            let pool = pool.clone();
            async move {
                let late = late;
                let slot = pool.slot(Some(&late)).await;
                drop(slot);
                late
            }
        });
        tokio::task::yield_now().await;
        held.pop();
        // The freed slot may not go back to the hog (its shared part is over its size now)...
        assert!(
            within(&pool, Some(&hog)).await.is_none(),
            "{:?}",
            pool.usage()
        );
        // ...so the newcomer gets it.
        let late = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the newcomer got a slot")
            .expect("task");
        drop(late);
    }

    #[tokio::test]
    async fn a_plugin_loaded_while_two_hogs_hold_all_they_may_gets_its_first_instance_at_once() {
        let pool = InstancePool::new(16);
        let hogs = [pool.reserve().expect("a"), pool.reserve().expect("b")];
        // 16 = 2 describe + 2 own + 12 shared, 2 of them spare.
        let mut held = Vec::new();
        for hog in &hogs {
            while let Some(slot) = within(&pool, Some(hog)).await {
                held.push(slot);
            }
        }
        assert_eq!(held.len(), 12, "{:?}", pool.usage());
        let newcomer = pool.reserve().expect("reserve");
        let first = within(&pool, Some(&newcomer)).await;
        assert!(first.is_some(), "{:?}", pool.usage());
        // The hogs get nothing more, however long they wait.
        for hog in &hogs {
            assert!(within(&pool, Some(hog)).await.is_none());
        }
    }

    #[tokio::test]
    async fn reservations_stop_short_of_describe_and_come_back_when_a_plugin_goes() {
        let pool = InstancePool::new(4);
        let a = pool.reserve().expect("first");
        let b = pool.reserve().expect("second");
        let refused = pool.reserve().err().expect("no third: 2 are describe's");
        assert!(refused.contains("--max-instances 4"), "{refused}");
        drop(a);
        let c = pool.reserve().expect("a slot given back is reserved again");
        assert_eq!(pool.usage().reserved, 2);
        drop((b, c));
        assert_eq!(pool.usage().reserved, 0);
        assert_eq!(pool.usage().shared, 2);
    }

    #[tokio::test]
    async fn an_own_slot_held_by_an_instance_outlives_its_share_until_the_instance_ends() {
        let pool = InstancePool::new(4);
        let share = pool.reserve().expect("reserve");
        let slot = within(&pool, Some(&share)).await.expect("own");
        drop(share);
        // The version is gone but its instance (a warm one, say) still runs in its own slot.
        assert_eq!(pool.usage().reserved, 1);
        assert_eq!(pool.usage().own_in_use, 1);
        drop(slot);
        assert_eq!(pool.usage().reserved, 0);
        assert_eq!(pool.usage().own_in_use, 0);
    }

    /// A component instantiating `count` times a core module that has one table (or none).
    fn component_of(count: u8, with_table: bool) -> Vec<u8> {
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        if with_table {
            // Table section: one funcref table of at least 1 element.
            module.extend([0x04, 0x04, 0x01, 0x70, 0x00, 0x01]);
        }
        let mut out = b"\0asm\x0d\0\x01\0".to_vec();
        out.push(0x01); // core module section
        out.push(u8::try_from(module.len()).expect("small"));
        out.extend(module);
        // Core instance section: `count` instantiations of module 0 without arguments.
        let size = 1 + 3 * usize::from(count);
        assert!(count < 128 && size < 128, "one-byte LEB128 only");
        out.push(0x02);
        out.push(u8::try_from(size).expect("small"));
        out.push(count);
        for _ in 0..count {
            out.extend([0x00, 0x00, 0x00]);
        }
        out
    }

    fn compile_error(wasm: &[u8]) -> String {
        let runtime = crate::sandbox::Runtime::new(crate::sandbox::RuntimeSettings {
            max_instances: 4,
            ..Default::default()
        })
        .expect("runtime");
        match runtime.compile(wasm) {
            Ok(_) => "compiled".into(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_component_over_the_per_component_caps_is_refused_naming_them() {
        let many = compile_error(&component_of(33, false));
        assert!(
            many.contains("larger than a plugin may be (32 core instances")
                && many.contains("33 core module instances"),
            "{many}"
        );
        let tables = compile_error(&component_of(17, true));
        assert!(
            tables.contains("larger than a plugin may be") && tables.contains("17 tables"),
            "{tables}"
        );
        // At the caps the size is fine: what refuses it then is that it is no plugin.
        let at_cap = compile_error(&component_of(16, true));
        assert!(
            at_cap.contains("not a plugin of world") && !at_cap.contains("larger than"),
            "{at_cap}"
        );
    }

    #[test]
    fn describe_keeps_two_slots_but_never_more_than_half() {
        assert_eq!(describe_slots(1), 0);
        assert_eq!(describe_slots(2), 1);
        assert_eq!(describe_slots(3), 1);
        assert_eq!(describe_slots(4), 2);
        assert_eq!(describe_slots(128), 2);
    }
}
