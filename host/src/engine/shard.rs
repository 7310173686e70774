//! The hash space one plugin's keys are sharded over (issue #28), as the API server's
//! `ShardedListAndWatch` (KEP-5866) defines it: the 64-bit FNV-1a hash of an object's UID or of
//! its namespace, ranges `[start, end)` over `[0, 2^64)`, and the `shardSelector` that asks a list
//! or watch for those ranges only. The same test decides in the host where the API server cannot
//! (the gate is off: the selector is ignored and every object comes).

/// What an object's shard is computed from (`shard_by` in NAME.toml).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ShardBy {
    /// `metadata.uid`: the most even split; an object's secondaries land elsewhere.
    #[default]
    Uid,
    /// `metadata.namespace`: every object of a namespace lands together (primaries and the
    /// secondaries in their namespace); as even as the namespaces are.
    Namespace,
}

impl ShardBy {
    /// The field path the API server's `shardRange` takes.
    pub fn field_path(self) -> &'static str {
        match self {
            ShardBy::Uid => "object.metadata.uid",
            ShardBy::Namespace => "object.metadata.namespace",
        }
    }
}

impl std::fmt::Display for ShardBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShardBy::Uid => "uid",
            ShardBy::Namespace => "namespace",
        })
    }
}

/// The most shards one plugin may have (each is a Lease renewed every retry period).
pub const MAX_SHARDS: u32 = 64;

/// 64-bit FNV-1a, the API server's shard hash (`k8s.io/apimachinery/pkg/sharding`).
pub fn fnv1a64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The whole hash space's end (exclusive): 2^64.
pub const SPACE: u128 = 1 << 64;

/// `[start, end)` of the hash space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Range {
    pub start: u128,
    pub end: u128,
}

impl Range {
    pub fn contains(&self, hash: u64) -> bool {
        let h = u128::from(hash);
        self.start <= h && h < self.end
    }
}

/// The hash space in `n` contiguous ranges of (nearly) equal width, in order; `n` is at least 1.
pub fn split(n: u32) -> Vec<Range> {
    let n = u128::from(n.max(1));
    (0..n)
        .map(|i| Range {
            start: SPACE * i / n,
            end: SPACE * (i + 1) / n,
        })
        .collect()
}

/// A bound as the API server writes it: `0x` and 16 lowercase hex digits (17 for 2^64).
fn bound(b: u128) -> String {
    format!("0x{b:016x}")
}

/// `ranges` in order, touching ones joined (ranges 0–3 of 12 held are one range to the API
/// server).
pub fn merged(ranges: &[Range]) -> Vec<Range> {
    let mut sorted = ranges.to_vec();
    sorted.sort();
    let mut out: Vec<Range> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// The `shardSelector` of `ranges` in the API server's wire format
/// (`shardRange(object.metadata.uid, '0x…', '0x…') || …`, touching ranges joined); empty for no
/// ranges.
pub fn selector(by: ShardBy, ranges: &[Range]) -> String {
    merged(ranges)
        .iter()
        .map(|r| {
            format!(
                "shardRange({}, '{}', '{}')",
                by.field_path(),
                bound(r.start),
                bound(r.end)
            )
        })
        .collect::<Vec<_>>()
        .join(" || ")
}

/// The hash an object is sharded by: of its UID, or of its namespace ("" when cluster-scoped).
pub fn hash_of(by: ShardBy, uid: &str, namespace: Option<&str>) -> u64 {
    fnv1a64(match by {
        ShardBy::Uid => uid,
        ShardBy::Namespace => namespace.unwrap_or(""),
    })
}

/// Whether an object with this UID and namespace falls in one of `ranges` (the host's own
/// filter, where the API server does not filter). A cluster-scoped object's namespace is "".
pub fn holds(by: ShardBy, ranges: &[Range], uid: &str, namespace: Option<&str>) -> bool {
    let h = hash_of(by, uid, namespace);
    ranges.iter().any(|r| r.contains(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_ranges_are_joined_and_apart_ones_kept() {
        let r = split(12);
        assert_eq!(
            merged(&[r[3], r[0], r[1], r[2]]),
            vec![Range {
                start: 0,
                end: r[3].end
            }]
        );
        assert_eq!(merged(&[r[5], r[0], r[11]]), vec![r[0], r[5], r[11]]);
        assert_eq!(
            merged(&r),
            vec![Range {
                start: 0,
                end: SPACE
            }]
        );
        assert!(merged(&[]).is_empty());
        assert_eq!(
            selector(ShardBy::Uid, &[r[1], r[0]]),
            selector(
                ShardBy::Uid,
                &[Range {
                    start: 0,
                    end: r[1].end
                }]
            )
        );
    }

    #[test]
    fn the_hash_is_fnv1a_64() {
        // The FNV-1a test vectors.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn a_split_covers_the_space_exactly_once() {
        for n in [1, 2, 3, 4, 7, 16] {
            let ranges = split(n);
            assert_eq!(ranges.len(), n as usize);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[ranges.len() - 1].end, SPACE);
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, w[1].start, "{n}: no gap, no overlap");
            }
            for h in [0u64, 1, u64::MAX / 3, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                assert_eq!(
                    ranges.iter().filter(|r| r.contains(h)).count(),
                    1,
                    "{n} {h}"
                );
            }
        }
    }

    #[test]
    fn the_selector_is_the_api_servers_wire_format() {
        let quarters = split(4);
        assert_eq!(
            selector(ShardBy::Uid, &[quarters[0], quarters[2]]),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000') || \
             shardRange(object.metadata.uid, '0x8000000000000000', '0xc000000000000000')"
        );
        assert_eq!(
            selector(ShardBy::Uid, &quarters[2..]),
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
        );
        assert_eq!(selector(ShardBy::Namespace, &[]), "");
    }

    #[test]
    fn an_object_is_held_by_exactly_one_of_a_split() {
        let thirds = split(3);
        for uid in ["0b5e6c1a-0000-4000-8000-00000000f00f", "x", ""] {
            let holders = thirds
                .iter()
                .filter(|r| holds(ShardBy::Uid, std::slice::from_ref(*r), uid, Some("ns")))
                .count();
            assert_eq!(holders, 1, "{uid}");
        }
        // By namespace, every object of a namespace lands in the same range.
        let r = thirds.iter().position(|r| {
            holds(
                ShardBy::Namespace,
                std::slice::from_ref(r),
                "u1",
                Some("team"),
            )
        });
        let s = thirds.iter().position(|r| {
            holds(
                ShardBy::Namespace,
                std::slice::from_ref(r),
                "u2",
                Some("team"),
            )
        });
        assert_eq!(r, s);
    }
}
