//! An unkeyed hash, for data no peer can use to make a table collide:
//!
//! - the NFSv4 state tables' keys ([`IssuedMap`]): session ids, stateids,
//!   client ids and files, all issued by this server (a counter behind a
//!   boot word or a client id), never chosen by a peer. A peer can only
//!   look a key up, not add one, so it cannot fill a table with colliding
//!   keys, and the keyed SipHash of the standard maps (some 200
//!   instructions for a session id, several look-ups per COMPOUND) buys
//!   nothing there. Keys a peer chooses (client owners) stay in standard
//!   maps.
//! - the duplicate request cache's checksum of a call's arguments
//!   ([`checksum`]), which tells a retransmission from a new call reusing
//!   its XID: a peer that made two of its own calls collide would only
//!   confuse itself (the cache's key holds its address).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by something this server issued.
pub type IssuedMap<K, V> = HashMap<K, V, BuildHasherDefault<PlainHasher>>;

/// The hash of `bytes` (their length included).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = PlainHasher::default();
    h.write_usize(bytes.len());
    h.write(bytes);
    h.finish()
}

/// Odd multipliers with bits spread over the whole word.
const M1: u64 = 0xa076_1d64_78bd_642f;
const M2: u64 = 0xe703_7ed1_a0b4_28db;

/// Folds each 64-bit word in with a multiply; `finish` mixes high bits
/// down, so that keys differing only in their top bytes (a big-endian
/// counter read as little-endian words) still land in different buckets.
#[derive(Default, Clone, Copy)]
pub struct PlainHasher(u64);

impl PlainHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(M1).rotate_left(31);
    }
}

impl Hasher for PlainHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 32;
        h = h.wrapping_mul(M2);
        h ^= h >> 29;
        h = h.wrapping_mul(M1);
        h ^ (h >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    /// How many different values the low `bits` and the top 7 bits (the
    /// two parts of a hash the standard map uses) take over `keys`.
    fn spread<K: std::hash::Hash>(keys: impl Iterator<Item = K>, bits: u32) -> (usize, usize) {
        let b = BuildHasherDefault::<PlainHasher>::default();
        let (mut low, mut top) = (HashSet::new(), HashSet::new());
        for k in keys {
            let h = b.hash_one(k);
            low.insert(h & ((1 << bits) - 1));
            top.insert(h >> 57);
        }
        (low.len(), top.len())
    }

    /// 1,024 keys over 1,024 buckets: random hashes fill about 647 of
    /// them (1 - 1/e); a hash that ignored the counter's bytes would fill
    /// one.
    #[test]
    fn issued_keys_spread_over_buckets_like_random_ones() {
        let session = |i: u64| {
            let mut s = [0u8; 16];
            s[..8].copy_from_slice(&0x6543_2100_0000_0001u64.to_be_bytes());
            s[8..].copy_from_slice(&i.to_be_bytes());
            s
        };
        let stateid = |i: u64| {
            let mut o = [0u8; 12];
            o[..4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
            o[4..].copy_from_slice(&i.to_be_bytes());
            o
        };
        let cases: [(&str, (usize, usize)); 4] = [
            ("session ids", spread((1..=1024).map(session), 10)),
            ("stateids", spread((1..=1024).map(stateid), 10)),
            (
                "client ids",
                spread((1..=1024u64).map(|i| (0x6543_2100u64 << 32) | i), 10),
            ),
            ("files", spread((1..=1024u32).map(|i| (0usize, i)), 10)),
        ];
        for (what, (low, top)) in cases {
            assert!(low >= 580, "{what}: {low} of 1024 buckets");
            assert!(top >= 120, "{what}: {top} of 128 top-bit values");
        }
    }
}
