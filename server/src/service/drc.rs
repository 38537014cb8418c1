//! The duplicate request cache (RFC 8267 §4.2 for RPC-over-RDMA, and the
//! same rule on TCP): a retransmitted non-idempotent call is answered from
//! the cache instead of being executed again.
//!
//! The key is the client's address without its port (a client that
//! reconnects comes from a new port), the XID, the procedure, and a
//! checksum over the first 256 bytes of the arguments plus their length
//! (enough to tell a reused XID from a retransmission, cheap for 1 MiB
//! WRITEs).

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const CHECKSUM_BYTES: usize = 256;

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
        let mut h = std::collections::hash_map::DefaultHasher::new();
        args[..args.len().min(CHECKSUM_BYTES)].hash(&mut h);
        DrcKey {
            ip,
            xid,
            proc_,
            len: args.len(),
            sum: h.finish(),
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
}

/// A bounded cache of recent non-idempotent calls.
pub struct Drc {
    inner: Mutex<Inner>,
    capacity: usize,
    hits: AtomicU64,
}

impl Drc {
    /// A cache of at most `capacity` calls (oldest dropped first).
    pub fn new(capacity: usize) -> Drc {
        Drc {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity: capacity.max(1),
            hits: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks a call up, registering it as in progress when new.
    pub fn begin(&self, k: &DrcKey) -> DrcLookup {
        let mut g = self.lock();
        match g.map.get(k) {
            Some(Entry::InProgress) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return DrcLookup::InProgress;
            }
            Some(Entry::Done(b)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return DrcLookup::Done(b.clone());
            }
            None => {}
        }
        g.map.insert(k.clone(), Entry::InProgress);
        g.order.push_back(k.clone());
        while g.order.len() > self.capacity {
            if let Some(old) = g.order.pop_front() {
                g.map.remove(&old);
            }
        }
        DrcLookup::New
    }

    /// Records the reply of a call registered by [`Drc::begin`].
    pub fn complete(&self, k: &DrcKey, body: Bytes) {
        let mut g = self.lock();
        if let Some(e) = g.map.get_mut(k) {
            *e = Entry::Done(body);
        }
    }

    /// Forgets a call that produced no cacheable reply.
    pub fn abandon(&self, k: &DrcKey) {
        let mut g = self.lock();
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
        self.lock().map.len()
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
}
