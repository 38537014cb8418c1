//! The duplicate request cache (RFC 8267 §4.2 for RPC-over-RDMA, and the
//! same rule on TCP): a retransmitted non-idempotent call is answered from
//! the cache instead of being executed again.
//!
//! The key is the client's address without its port (a client that
//! reconnects comes from a new port), the XID, the procedure, and a
//! checksum over the first 256 bytes of the arguments plus their length
//! (enough to tell a reused XID from a retransmission, cheap for 1 MiB
//! WRITEs).
//!
//! The cache is split into shards by client address and XID, each behind
//! a mutex of its own, so that calls on different connections and cores do
//! not queue for one lock; each shard drops its oldest calls first.

use super::plain_hash::checksum;
use bytes::Bytes;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const CHECKSUM_BYTES: usize = 256;
/// Most shards.
const SHARDS: usize = 16;

/// Identifies one call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DrcKey {
    ip: IpAddr,
    xid: u32,
    proc_: u32,
    len: usize,
    sum: u64,
}

impl DrcKey {
    /// The key of a call from `ip` with arguments `args`.
    pub fn new(ip: IpAddr, xid: u32, proc_: u32, args: Bytes) -> DrcKey {
        DrcKey {
            ip,
            xid,
            proc_,
            len: args.len(),
            // Unkeyed: see `plain_hash`.
            sum: checksum(&args[..args.len().min(CHECKSUM_BYTES)]),
        }
    }
}

/// What the cache knows of a call.
#[derive(Debug, PartialEq, Eq)]
pub enum DrcLookup {
    /// First sighting: execute it (and call [`Drc::complete`]).
    New,
    /// The original is still executing: drop the retransmission.
    InProgress,
    /// Already executed: this is the encoded reply body.
    Done(Bytes),
}

enum Entry {
    InProgress,
    Done(Bytes),
}

struct Inner {
    map: HashMap<DrcKey, Entry>,
    order: VecDeque<DrcKey>,
    /// Calls this shard keeps.
    capacity: usize,
}

/// A bounded cache of recent non-idempotent calls.
pub struct Drc {
    shards: Box<[Mutex<Inner>]>,
    hits: AtomicU64,
}

impl Drc {
    /// A cache of at most `capacity` calls (each shard's oldest dropped
    /// first).
    pub fn new(capacity: usize) -> Drc {
        let capacity = capacity.max(1);
        let shards = capacity.min(SHARDS);
        Drc {
            shards: (0..shards)
                .map(|i| {
                    Mutex::new(Inner {
                        map: HashMap::new(),
                        order: VecDeque::new(),
                        capacity: capacity / shards + usize::from(i < capacity % shards),
                    })
                })
                .collect(),
            hits: AtomicU64::new(0),
        }
    }

    /// The shard of a call: its client's address and XID mixed, so that
    /// XIDs whose low bits never change (a slot number there) still spread.
    fn shard_of(&self, k: &DrcKey) -> usize {
        let ip = match k.ip {
            IpAddr::V4(a) => u64::from(u32::from(a)),
            IpAddr::V6(a) => {
                let v = u128::from(a);
                (v as u64) ^ ((v >> 64) as u64)
            }
        };
        let mixed =
            (ip ^ (u64::from(k.xid) << 32 | u64::from(k.xid))).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 32) as usize % self.shards.len()
    }

    fn lock(&self, k: &DrcKey) -> std::sync::MutexGuard<'_, Inner> {
        self.shards[self.shard_of(k)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Looks a call up, registering it as in progress when new.
    pub fn begin(&self, k: &DrcKey) -> DrcLookup {
        let mut g = self.lock(k);
        match g.map.entry(k.clone()) {
            MapEntry::Occupied(e) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return match e.get() {
                    Entry::InProgress => DrcLookup::InProgress,
                    Entry::Done(b) => DrcLookup::Done(b.clone()),
                };
            }
            MapEntry::Vacant(e) => {
                e.insert(Entry::InProgress);
            }
        }
        g.order.push_back(k.clone());
        while g.order.len() > g.capacity {
            if let Some(old) = g.order.pop_front() {
                g.map.remove(&old);
            }
        }
        DrcLookup::New
    }

    /// Records the reply of a call registered by [`Drc::begin`].
    pub fn complete(&self, k: &DrcKey, body: Bytes) {
        let mut g = self.lock(k);
        if let Some(e) = g.map.get_mut(k) {
            *e = Entry::Done(body);
        }
    }

    /// Forgets a call that produced no cacheable reply.
    pub fn abandon(&self, k: &DrcKey) {
        let mut g = self.lock(k);
        g.map.remove(k);
        g.order.retain(|o| o != k);
    }

    /// Retransmissions caught (answered from the cache or dropped while in
    /// progress).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Calls currently remembered.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
            .sum()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(xid: u32, args: &'static [u8]) -> DrcKey {
        DrcKey::new(
            "10.0.0.1".parse().unwrap(),
            xid,
            7,
            Bytes::from_static(args),
        )
    }

    #[test]
    fn retransmissions_are_caught() {
        let d = Drc::new(10);
        let k = key(1, b"args");
        assert_eq!(d.begin(&k), DrcLookup::New);
        assert_eq!(d.begin(&k), DrcLookup::InProgress);
        d.complete(&k, Bytes::from_static(b"reply"));
        assert_eq!(d.begin(&k), DrcLookup::Done(Bytes::from_static(b"reply")));
        assert_eq!(d.hits(), 2);
        // Same xid, other arguments: a different call.
        assert_eq!(d.begin(&key(1, b"other")), DrcLookup::New);
    }

    #[test]
    fn the_port_is_not_part_of_the_key_and_capacity_bounds_it() {
        let d = Drc::new(2);
        for x in 0..5 {
            assert_eq!(d.begin(&key(x, b"a")), DrcLookup::New);
            d.complete(&key(x, b"a"), Bytes::new());
        }
        assert_eq!(d.len(), 2);
        assert_eq!(d.begin(&key(0, b"a")), DrcLookup::New, "oldest was dropped");
        let k = key(9, b"a");
        d.begin(&k);
        d.abandon(&k);
        assert_eq!(d.begin(&k), DrcLookup::New);
    }

    #[test]
    fn a_reused_xid_with_other_arguments_of_the_same_length_is_a_new_call() {
        // 16 shards of 64: one XID's calls share a shard.
        let d = Drc::new(1024);
        let args = [7u8; 300];
        let k = DrcKey::new(
            "10.0.0.1".parse().unwrap(),
            1,
            7,
            Bytes::copy_from_slice(&args),
        );
        assert_eq!(d.begin(&k), DrcLookup::New);
        d.complete(&k, Bytes::from_static(b"reply"));
        for at in [0, 100, 255] {
            let mut other = args;
            other[at] ^= 1;
            let k2 = DrcKey::new(
                "10.0.0.1".parse().unwrap(),
                1,
                7,
                Bytes::copy_from_slice(&other),
            );
            assert_eq!(d.begin(&k2), DrcLookup::New, "byte {at} changed");
        }
        // Past the checksummed bytes, only the length tells calls apart.
        let mut tail = args;
        tail[299] ^= 1;
        let k3 = DrcKey::new(
            "10.0.0.1".parse().unwrap(),
            1,
            7,
            Bytes::copy_from_slice(&tail),
        );
        assert_eq!(d.begin(&k3), DrcLookup::Done(Bytes::from_static(b"reply")));
    }

    /// Four threads' calls at once over a small cache: a call sent again
    /// right after it completed is answered with its own reply, or (pushed
    /// out by newer calls in its shard) runs as new; never with another
    /// call's reply. The cache never holds more than its capacity.
    #[test]
    fn calls_from_several_threads_get_their_own_replies_within_the_capacity() {
        let d = Drc::new(50);
        let caught = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let (d, caught) = (&d, &caught);
                s.spawn(move || {
                    for i in 0..2000u32 {
                        // XIDs whose low bits are the thread's: the shards
                        // must still be used evenly.
                        let xid = i << 8 | t;
                        let k = DrcKey::new(
                            "10.0.0.1".parse().unwrap(),
                            xid,
                            7,
                            Bytes::from(xid.to_be_bytes().to_vec()),
                        );
                        assert_eq!(d.begin(&k), DrcLookup::New);
                        let reply = Bytes::from(xid.to_le_bytes().to_vec());
                        d.complete(&k, reply.clone());
                        match d.begin(&k) {
                            DrcLookup::Done(r) => {
                                assert_eq!(r, reply);
                                caught.fetch_add(1, Ordering::Relaxed);
                            }
                            DrcLookup::New => d.abandon(&k),
                            DrcLookup::InProgress => panic!("call {xid:#x} still in progress"),
                        }
                        assert!(d.len() <= 50);
                    }
                });
            }
        });
        assert_eq!(d.hits(), caught.load(Ordering::Relaxed));
        assert!(caught.load(Ordering::Relaxed) > 0);
        assert!(!d.is_empty() && d.len() <= 50);
        // The XIDs above differ only above their low byte, yet every shard
        // takes its share of them.
        let mut per = [0u32; SHARDS];
        for t in 0..4u32 {
            for i in 0..2000u32 {
                let k = DrcKey::new("10.0.0.1".parse().unwrap(), i << 8 | t, 7, Bytes::new());
                per[d.shard_of(&k)] += 1;
            }
        }
        assert!(per.iter().all(|n| (350..=650).contains(n)), "{per:?}");
        let sizes: Vec<usize> = d
            .shards
            .iter()
            .map(|s| s.lock().unwrap().capacity)
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 50);
        assert_eq!(
            (sizes.iter().min(), sizes.iter().max()),
            (Some(&3), Some(&4))
        );
    }
}
