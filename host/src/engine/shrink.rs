//! Containers that give memory back once they drain: a burst of keys (an initial list, a relist)
//! must not leave every plugin's queue and mailbox sized for the burst while it sits idle.

use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// Below this capacity a container is left alone.
const SMALL: usize = 64;

/// The capacity to shrink to, when under a quarter of it is used. Shrinking to twice the length
/// means it takes as many more removals to shrink again, so the cost stays amortised O(1).
fn target(len: usize, capacity: usize) -> Option<usize> {
    (capacity > SMALL && len < capacity / 4).then(|| (len * 2).max(SMALL))
}

pub trait ShrinkWhenSparse {
    /// Frees most of the unused capacity when under a quarter of it is used.
    fn shrink_when_sparse(&mut self);
}

impl<K: Eq + Hash, V> ShrinkWhenSparse for HashMap<K, V> {
    fn shrink_when_sparse(&mut self) {
        if let Some(t) = target(self.len(), self.capacity()) {
            self.shrink_to(t);
        }
    }
}

impl<K: Eq + Hash> ShrinkWhenSparse for HashSet<K> {
    fn shrink_when_sparse(&mut self) {
        if let Some(t) = target(self.len(), self.capacity()) {
            self.shrink_to(t);
        }
    }
}

impl<T> ShrinkWhenSparse for VecDeque<T> {
    fn shrink_when_sparse(&mut self) {
        if let Some(t) = target(self.len(), self.capacity()) {
            self.shrink_to(t);
        }
    }
}

impl<T: Ord> ShrinkWhenSparse for BinaryHeap<T> {
    fn shrink_when_sparse(&mut self) {
        if let Some(t) = target(self.len(), self.capacity()) {
            self.shrink_to(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_container_gives_back_its_burst_capacity() {
        let mut m: HashMap<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        let mut q: VecDeque<u32> = (0..10_000).collect();
        for i in 0..10_000 {
            m.remove(&i);
            m.shrink_when_sparse();
            q.pop_front();
            q.shrink_when_sparse();
        }
        assert!(m.capacity() <= 2 * SMALL, "map kept {}", m.capacity());
        assert!(q.capacity() <= 2 * SMALL, "queue kept {}", q.capacity());
    }

    #[test]
    fn a_busy_container_keeps_its_capacity() {
        let mut m: HashMap<usize, usize> = (0..1_000).map(|i| (i, i)).collect();
        let before = m.capacity();
        // Down to just over a quarter of the capacity: still in use enough to keep it.
        for i in 0..(m.len() - (before / 4 + 1)) {
            m.remove(&i);
            m.shrink_when_sparse();
        }
        // (hashbrown reports a little less capacity as deleted slots pile up; a shrink would at
        // least halve it.)
        assert!(m.capacity() > before / 2, "{} of {before}", m.capacity());
    }
}
