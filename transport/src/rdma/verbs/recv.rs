//! Receive buffers whose messages are handed over without a copy.
//!
//! A [`RecvRing`] is one region (local access only) cut into buffers of one
//! size. Each buffer is free, posted (a receive work request names it), or
//! lent (the message that landed in it is out as [`Bytes`]). The device
//! writes a buffer only while it is posted, so lending is sound:
//!
//! - [`RecvRing::take`] lends a posted buffer once its receive completed
//!   (the caller hands in that completion, as it does for
//!   [`PendingRead::complete`](super::PendingRead::complete));
//! - [`RecvRing::post`] posts only a free buffer: while any `Bytes` over it
//!   is alive it is lent, and posting is refused until the last one is
//!   dropped;
//! - no peer can reach the region (no remote access), and the buffers
//!   keep it alive; a region is deregistered before its memory is freed.

use super::mr::{Access, MemoryRegion, ProtectionDomain};
use super::qp::{QueuePair, RecvWr};
use super::srq::SharedReceiveQueue;
use super::{Result, VerbsError};
use bytes::Bytes;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Where receives are posted: a queue pair's own receive queue, or a
/// shared receive queue.
pub trait ReceiveQueue {
    /// Posts receive work requests in one call.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
}

impl ReceiveQueue for QueuePair {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        QueuePair::post_recv(self, wrs)
    }
}

impl ReceiveQueue for SharedReceiveQueue {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        SharedReceiveQueue::post_recv(self, wrs)
    }
}

impl<T: ReceiveQueue + ?Sized> ReceiveQueue for Arc<T> {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        (**self).post_recv(wrs)
    }
}

/// A buffer's states.
const FREE: u8 = 0;
const POSTED: u8 = 1;
const LENT: u8 = 2;

struct Inner {
    region: Arc<MemoryRegion>,
    size: usize,
    state: Box<[AtomicU8]>,
}

/// Receive buffers of one size in one registered region.
#[derive(Clone)]
pub struct RecvRing {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("buffers", &self.len())
            .field("size", &self.inner.size)
            .finish()
    }
}

impl RecvRing {
    /// `n` buffers of `size` bytes, registered on `pd`, all free.
    pub fn new(pd: &Arc<ProtectionDomain>, n: usize, size: usize) -> Result<RecvRing> {
        let total = n
            .checked_mul(size)
            .filter(|t| *t > 0)
            .ok_or_else(|| VerbsError::InvalidArgument("receive ring of no bytes".into()))?;
        let region = MemoryRegion::new(pd, total, Access::LOCAL)?;
        Ok(RecvRing {
            inner: Arc::new(Inner {
                region,
                size,
                state: (0..n).map(|_| AtomicU8::new(FREE)).collect(),
            }),
        })
    }

    /// Buffers in the ring.
    pub fn len(&self) -> usize {
        self.inner.state.len()
    }

    /// True when the ring has no buffers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The size of each buffer.
    pub fn buffer_size(&self) -> usize {
        self.inner.size
    }

    /// Buffers lent out now.
    pub fn lent(&self) -> usize {
        self.inner
            .state
            .iter()
            .filter(|s| s.load(Ordering::Acquire) == LENT)
            .count()
    }

    /// True when buffer `i` is neither posted nor lent (so [`RecvRing::post`]
    /// would post it).
    pub fn is_free(&self, i: usize) -> bool {
        self.inner
            .state
            .get(i)
            .is_some_and(|s| s.load(Ordering::Acquire) == FREE)
    }

    fn state(&self, i: usize) -> Result<&AtomicU8> {
        self.inner.state.get(i).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("receive buffer {i} of {}", self.inner.state.len()))
        })
    }

    /// Posts buffer `i` on `qp` (a queue pair's own receive queue or a
    /// shared one) as receive `wr_id`. Returns `Ok(false)`, posting
    /// nothing, while the buffer is lent (a `Bytes` over its last message
    /// is still alive); an error when it is posted already or the post
    /// fails.
    pub fn post(&self, qp: &impl ReceiveQueue, i: usize, wr_id: u64) -> Result<bool> {
        let st = self.state(i)?;
        match st.compare_exchange(FREE, POSTED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(LENT) => return Ok(false),
            Err(_) => {
                return Err(VerbsError::InvalidArgument(format!(
                    "receive buffer {i} is posted already"
                )))
            }
        }
        let posted = self
            .inner
            .region
            .sge(i * self.inner.size, self.inner.size)
            .and_then(|sge| {
                qp.post_recv(&[RecvWr {
                    wr_id,
                    sges: &[sge],
                }])
            });
        if let Err(e) = posted {
            st.store(FREE, Ordering::Release);
            return Err(e);
        }
        Ok(true)
    }

    /// Lends the `len` bytes that buffer `i`'s completed receive holds.
    /// Call it once per completion of a receive posted on buffer `i`; the
    /// buffer can be posted again when every `Bytes` over it is gone.
    pub fn take(&self, i: usize, len: usize) -> Result<Bytes> {
        if len > self.inner.size {
            return Err(VerbsError::InvalidArgument(format!(
                "a receive of {len} bytes in a {}-byte buffer",
                self.inner.size
            )));
        }
        let st = self.state(i)?;
        if let Err(other) = st.compare_exchange(POSTED, LENT, Ordering::AcqRel, Ordering::Acquire) {
            return Err(VerbsError::InvalidArgument(format!(
                "receive buffer {i} is {}, not posted",
                if other == LENT { "lent" } else { "free" }
            )));
        }
        Ok(Bytes::from_owner(Loan {
            inner: self.inner.clone(),
            i,
            len,
        }))
    }

    /// Buffer `i`'s receive ended without a message (flushed or failed):
    /// it is free again.
    pub fn cancel(&self, i: usize) {
        if let Ok(st) = self.state(i) {
            let _ = st.compare_exchange(POSTED, FREE, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

/// One lent buffer.
struct Loan {
    inner: Arc<Inner>,
    i: usize,
    len: usize,
}

impl AsRef<[u8]> for Loan {
    fn as_ref(&self) -> &[u8] {
        let start = self.i * self.inner.size;
        // SAFETY: `start + len` lies within the region (`i` is a buffer of
        // the ring and `len <= size`, checked in `take`), whose allocation
        // is zero-initialised and lives as long as `inner`. The buffer is
        // lent: `post` refuses it until this loan is dropped, and the
        // receive that filled it has completed, so neither the device nor
        // a peer (local access only) writes it while this reference lives.
        unsafe {
            std::slice::from_raw_parts(self.inner.region.buf_ptr().as_ptr().add(start), self.len)
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if let Some(st) = self.inner.state.get(self.i) {
            let _ = st.compare_exchange(LENT, FREE, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}
