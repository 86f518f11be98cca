//! The hasher of the tables keyed by connection ids.
//!
//! Connection ids are integers this process hands out (the store's id
//! blocks, one after the other) or reads from its own checkpoints, never
//! values off the wire: a table keyed by them needs no defence against keys
//! chosen to collide, which is what the standard library's default (SipHash
//! with a random key) buys at ~150 instructions a look-up. `IdHasher` mixes
//! each integer with one multiplication. Keys an attacker chooses
//! (addresses, ports: `reassembly`'s direction table) keep the default.

use std::hash::{BuildHasherDefault, Hasher};

/// 2^64 / φ, odd: a multiplication by it spreads consecutive integers over
/// the high bits (the table's tags) and keeps them apart in the low ones
/// (its buckets).
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// A `Hasher` for integer keys (see the module doc); other writes are mixed
/// byte by byte.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(K);
    }

    fn write_i64(&mut self, n: i64) {
        self.write_u64(u64::from_ne_bytes(n.to_ne_bytes()));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// The `BuildHasher` of tables keyed by connection ids.
pub type IdHashing = BuildHasherDefault<IdHasher>;

/// A table keyed by connection ids.
pub type IdMap<K, V> = std::collections::HashMap<K, V, IdHashing>;

/// A set of connection ids.
pub type IdSet<K> = std::collections::HashSet<K, IdHashing>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(v: T) -> u64 {
        IdHashing::default().hash_one(v)
    }

    #[test]
    fn consecutive_ids_spread_over_tags_and_buckets() {
        // 4,096 consecutive ids: no two alike, their top 7 bits (hashbrown's
        // tags) all used, and every one of 1,024 buckets (the low bits) hit
        let hashes: Vec<u64> = (1_000i64..5_096).map(hash).collect();
        let distinct: std::collections::HashSet<u64> = hashes.iter().copied().collect();
        assert_eq!(distinct.len(), hashes.len());
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(tags.len(), 128);
        let buckets: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        assert_eq!(buckets.len(), 1024);
    }

    #[test]
    fn pairs_and_signs_are_told_apart() {
        assert_ne!(hash((1u64, 2i64)), hash((2u64, 1i64)));
        assert_ne!(hash(-1i64), hash(1i64));
        assert_eq!(hash(7i64), hash(7u64)); // the same integer, the same hash
        let mut m: IdMap<(u64, i64), usize> = IdMap::default();
        for c in 0..50u64 {
            for x in -3..3i64 {
                m.insert((c, x), m.len());
            }
        }
        assert_eq!(m.len(), 300);
        assert_eq!(m.get(&(49, 2)), Some(&299));
    }
}
