//! Receive buffers: a reply is handed to its caller in the buffer it
//! landed in, and a spare buffer is posted in its stead.
//!
//! The connection core counts [`RECV_BUFFERS`](super::RECV_BUFFERS)
//! receive buffers and posts each again as soon as its reply is parsed
//! (`nfsrdma_rpcrdma::conn`). Here each of those is posted as one buffer
//! of a [`RecvRing`] that has [`SPARES`] more: when a reply arrives, the
//! buffer it is in is lent to the caller (as `Bytes`, without a copy) and
//! a free one of the ring takes its place in the core's next post. The
//! caller decodes the reply with a lent-input decoder
//! ([`nfsrdma_xdr::Decoder::lent`]), so nothing it keeps holds the buffer,
//! which is free again once the call's decode is done. Only when every
//! spare is lent at once (replies kept undecoded) is a reply copied out,
//! and its buffer posted again at once: a caller that holds replies can
//! never take receives away from the calls in flight.

use super::{Counters, RECV_BUFFERS};
use bytes::Bytes;
use nfsrdma_transport::rdma::verbs::{ProtectionDomain, QueuePair, RecvRing, VerbsError};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Ring buffers beyond those posted: as many again, so that every call in
/// flight can have its reply lent at once.
pub const SPARES: usize = RECV_BUFFERS as usize;

/// The ring and which of its buffers each of the core's receive buffers is
/// posted as.
pub(super) struct Receives {
    ring: RecvRing,
    /// Ring buffer of each of the core's buffers.
    at: Vec<usize>,
    /// Ring buffers some core buffer is (or is about to be) posted as: a
    /// spare chosen for one reply must not be chosen for the next one
    /// before the core's post of the first.
    mapped: Vec<bool>,
    /// Where the search for a free ring buffer goes on from.
    next: usize,
}

impl Receives {
    /// `buffers` buffers for the core and [`SPARES`] more, of `size` bytes.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        buffers: u32,
        size: usize,
    ) -> Result<Receives, VerbsError> {
        let n = buffers as usize;
        Ok(Receives {
            ring: RecvRing::new(pd, n + SPARES, size)?,
            at: (0..n).collect(),
            mapped: (0..n + SPARES).map(|r| r < n).collect(),
            next: n,
        })
    }

    /// The ring (its region is torn down with the connection's).
    pub fn ring(&self) -> &RecvRing {
        &self.ring
    }

    /// Posts the core's buffer `buffer` as receive `wr`.
    pub fn post(&mut self, qp: &QueuePair, buffer: u32, wr: u64) -> Result<(), String> {
        let r = *self
            .at
            .get(buffer as usize)
            .ok_or_else(|| format!("receive buffer {buffer} does not exist"))?;
        match self.ring.post(qp, r, wr) {
            Ok(true) => Ok(()),
            // `take` gave the core's buffer a free ring buffer, and only
            // this connection posts: a driver fault.
            Ok(false) => Err(format!("receive buffer {buffer} (ring buffer {r}) is lent")),
            Err(e) => Err(format!("posting a receive: {e}")),
        }
    }

    /// The core's buffer `buffer` received `len` bytes: the message, lent
    /// in place when a free ring buffer can be posted in its stead (then
    /// `true`), otherwise copied out (its buffer is free again at once).
    pub fn take(
        &mut self,
        buffer: u32,
        len: usize,
        counters: &Counters,
    ) -> Result<(Bytes, bool), String> {
        let b = buffer as usize;
        let r = *self
            .at
            .get(b)
            .ok_or_else(|| format!("receive buffer {buffer} does not exist"))?;
        let len = len.min(self.ring.buffer_size());
        let view = self
            .ring
            .take(r, len)
            .map_err(|e| format!("receive buffer: {e}"))?;
        match self.free_buffer() {
            Some(spare) => {
                self.at[b] = spare;
                self.mapped[r] = false;
                self.mapped[spare] = true;
                counters.receives_lent.fetch_add(1, Ordering::Relaxed);
                Ok((view, true))
            }
            None => {
                let copy = Bytes::copy_from_slice(&view);
                drop(view);
                counters.receives_copied.fetch_add(1, Ordering::Relaxed);
                Ok((copy, false))
            }
        }
    }

    /// The core's buffer `buffer` completed without a message (flushed or
    /// failed).
    pub fn cancel(&mut self, buffer: u32) {
        if let Some(&r) = self.at.get(buffer as usize) {
            self.ring.cancel(r);
        }
    }

    /// A ring buffer that no core buffer is posted as and that is not
    /// lent, searched round the ring from where the last search ended.
    fn free_buffer(&mut self) -> Option<usize> {
        let n = self.ring.len();
        let found = (0..n)
            .map(|i| (self.next + i) % n)
            .find(|&r| !self.mapped[r] && self.ring.is_free(r))?;
        self.next = (found + 1) % n;
        Some(found)
    }
}
