//! Receive buffers shared by a pool thread's connections
//! (`--rdma-srq N`): one shared receive queue per pool thread, with `N`
//! buffers of the inline size posted on it, which the queue pairs of
//! every connection on that thread take their receives from.
//!
//! A connection's calls hold their buffers as with buffers of its own
//! (the connection core tracks them, [`Config::shared_receives`]); each
//! goes back to the shared queue once its call is done with, and what a
//! connection still holds when it is dropped goes back then
//! ([`SharedRecv::give_back`]). A buffer still lent (a `Bytes` over its
//! message is alive) waits in the queue's orphans until its pool thread
//! finds it free ([`SharedRecv::retry_orphans`]).
//!
//! Credits are still granted per connection, and a call beyond them ends
//! its connection. What the shared queue does not give is a floor per
//! connection: a peer that sends beyond its credits takes buffers from
//! the others before the call that breaks the grant is seen, and a
//! well-behaved peer whose Send then finds the queue empty gets
//! receiver-not-ready; the Linux client asks for no RNR retries, so its
//! connection ends and reconnects. [`RdmaStats::shared_receives_taken_peak`]
//! says how close a thread's queue came to empty.
//!
//! [`Config::shared_receives`]: nfsrdma_rpcrdma::conn::Config::shared_receives

use super::RdmaStats;
use nfsrdma_rpcrdma::conn::recv::wr_id;
use nfsrdma_transport::rdma::verbs::{ProtectionDomain, RecvRing, SharedReceiveQueue, VerbsError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A pool thread's shared receive queue and its buffers.
pub struct SharedRecv {
    /// The queue the thread's queue pairs are created on.
    pub srq: Arc<SharedReceiveQueue>,
    /// Its buffers (a connection lends messages out of it).
    pub ring: RecvRing,
    /// Buffers posted now.
    posted: AtomicU64,
    /// Buffers given back while still lent: posted once free.
    orphans: Mutex<Vec<u32>>,
    /// Whether `orphans` has any (read without the lock between batches).
    has_orphans: AtomicBool,
    stats: Arc<RdmaStats>,
}

impl std::fmt::Debug for SharedRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRecv")
            .field("buffers", &self.ring.len())
            .field("posted", &self.posted.load(Ordering::Relaxed))
            .finish()
    }
}

impl SharedRecv {
    /// A shared receive queue on `pd` with `n` buffers of `size` bytes,
    /// every one posted. An error when the device has no shared receive
    /// queues or not that many entries.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        n: u32,
        size: usize,
        stats: Arc<RdmaStats>,
    ) -> Result<Arc<SharedRecv>, VerbsError> {
        let srq = SharedReceiveQueue::new(pd, n, 1)?;
        let ring = RecvRing::new(pd, n as usize, size)?;
        let s = Arc::new(SharedRecv {
            srq,
            ring,
            posted: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            has_orphans: AtomicBool::new(false),
            stats,
        });
        for b in 0..n {
            s.give_back(b)?;
        }
        s.stats
            .shared_receive_buffers
            .fetch_add(u64::from(n), Ordering::Relaxed);
        Ok(s)
    }

    /// Buffers posted now.
    pub fn posted(&self) -> u64 {
        self.posted.load(Ordering::Relaxed)
    }

    /// A receive of this queue completed (on whichever queue pair, with
    /// whatever status): one buffer fewer posted.
    pub fn consumed(&self) {
        let left = self
            .posted
            .fetch_sub(1, Ordering::Relaxed)
            .saturating_sub(1);
        self.stats
            .shared_receives_posted
            .fetch_sub(1, Ordering::Relaxed);
        let taken = (self.ring.len() as u64).saturating_sub(left);
        self.stats
            .shared_receives_taken_peak
            .fetch_max(taken, Ordering::Relaxed);
    }

    /// Posts buffer `b` again, or keeps it to post once it is free (its
    /// last message is still lent out).
    pub fn give_back(&self, b: u32) -> Result<(), VerbsError> {
        if self.ring.post(&self.srq, b as usize, wr_id(b).0)? {
            self.posted.fetch_add(1, Ordering::Relaxed);
            self.stats
                .shared_receives_posted
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.orphans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(b);
            self.has_orphans.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// A buffer whose receive completed on no connection of the thread
    /// (its connection was dropped meanwhile): posted again.
    pub fn unclaimed(&self, b: u32) -> Result<(), VerbsError> {
        self.ring.cancel(b as usize);
        self.give_back(b)
    }

    /// True while buffers wait to be posted once free.
    pub fn has_orphans(&self) -> bool {
        self.has_orphans.load(Ordering::Acquire)
    }

    /// Posts the orphans that came free.
    pub fn retry_orphans(&self) -> Result<(), VerbsError> {
        let waiting = {
            let mut o = self.orphans.lock().unwrap_or_else(|p| p.into_inner());
            self.has_orphans.store(false, Ordering::Release);
            std::mem::take(&mut *o)
        };
        for b in waiting {
            self.give_back(b)?;
        }
        Ok(())
    }
}
