//! Shared receive queues (`ibv_create_srq`): one pool of posted receives
//! that every queue pair created on it consumes from, so the receive
//! buffers a server needs follow its traffic rather than its number of
//! connections.
//!
//! A completion of a receive taken from a shared queue comes on the
//! receive CQ of the queue pair the message arrived on, with that queue
//! pair's number ([`WorkCompletion::qp_num`](super::WorkCompletion)); the
//! work request id is the one given when the receive was posted here.
//!
//! The queue pairs on a shared queue keep it alive (each holds an
//! [`Arc`]), so it is destroyed after the last of them; a receive still
//! posted when its region goes away fails (see the `verbs` module docs),
//! as on a queue pair's own receive queue.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_create_srq, ibv_destroy_srq, ibv_post_srq_recv, ibv_srq, ibv_srq_init_attr};

use super::mr::ProtectionDomain;
use super::qp::{post_recv_chain, RecvWr};
use super::{Result, VerbsError};

/// A shared receive queue on one protection domain.
pub struct SharedReceiveQueue {
    srq: NonNull<ibv_srq>,
    max_wr: u32,
    max_sge: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: posting to a shared receive queue is thread safe in libibverbs
// providers; the handle is owned by this value.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl SharedReceiveQueue {
    /// A shared receive queue on `pd` for at least `max_wr` posted
    /// receives of up to `max_sge` scatter/gather entries each (the device
    /// may grant more: [`Self::max_wr`], [`Self::max_sge`]). An error when
    /// the device has no shared receive queues or not that many entries
    /// (`max_srq`, `max_srq_wr`, `max_srq_sge` of its attributes).
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32, max_sge: u32) -> Result<Arc<Self>> {
        if max_wr == 0 || max_sge == 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "a shared receive queue of {max_wr} entries of {max_sge} scatter/gather entries"
            )));
        }
        // SAFETY: ibv_srq_init_attr is plain old data; zero is valid.
        let mut attr: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = max_sge;
        // SAFETY: live PD (kept alive by the queue); `attr` is valid for the
        // call, which writes the granted sizes back into it.
        let srq = unsafe { ibv_create_srq(pd.as_ptr(), &mut attr) };
        let srq = NonNull::new(srq).ok_or_else(|| VerbsError::last_os("ibv_create_srq"))?;
        Ok(Arc::new(SharedReceiveQueue {
            srq,
            max_wr: attr.attr.max_wr.max(max_wr),
            max_sge: attr.attr.max_sge.max(max_sge),
            pd: pd.clone(),
        }))
    }

    /// Receives that may be posted at once (as granted).
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Scatter/gather entries per receive (as granted).
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_srq {
        self.srq.as_ptr()
    }

    /// Posts receive work requests (one `ibv_post_srq_recv`): any queue
    /// pair on this queue may consume them. On failure none from the
    /// failing one on was posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let srq = self.srq.as_ptr();
        post_recv_chain(wrs, self.max_sge, "ibv_post_srq_recv", |wr, bad| {
            // SAFETY: live shared queue; the chain and its SGE arrays
            // outlive the call (post_recv_chain's contract).
            unsafe { ibv_post_srq_recv(srq, wr, bad) }
        })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; every queue pair on it
        // holds an Arc to it, so none is left. A failure cannot be acted on
        // here.
        unsafe { ibv_destroy_srq(self.srq.as_ptr()) };
    }
}
