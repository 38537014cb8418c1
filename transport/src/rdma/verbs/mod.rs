//! Safe wrappers over libibverbs and librdmacm (via `rdma-sys`).
//!
//! This module tree is the one door to `unsafe` in the project: every call
//! into the C libraries happens here, each `unsafe` block carries a
//! `SAFETY:` comment, and everything exported is a safe API.
//!
//! # Ownership model
//!
//! Every verbs object is an RAII value whose `Drop` releases it, and every
//! child keeps its parent alive through an [`Arc`](std::sync::Arc):
//!
//! ```text
//! Context  <- ProtectionDomain <- MemoryRegion <- (bound) MemoryWindow
//!          <- CompletionChannel <- CompletionQueue
//! EventChannel <- CmId <- QueuePair -> ProtectionDomain, CompletionQueue x2
//!                                   -> (optional) SharedReceiveQueue -> ProtectionDomain
//! ```
//!
//! # Memory touched by the device
//!
//! Work requests can only name memory through an [`Sge`], and an `Sge` can
//! only be made from a [`MemoryRegion`] that owns its buffer (page aligned,
//! allocated and freed by this module). A region's `Drop` deregisters the
//! memory *before* freeing it, and leaks the buffer if deregistration fails.
//! Once `ibv_dereg_mr` has returned the device no longer touches the memory,
//! so a work request that is still outstanding when its region goes away
//! fails with a local protection error instead of writing into freed
//! memory. Safe code therefore cannot make the device write into memory
//! that Rust has handed to someone else.
//!
//! Because the device (or a remote peer through an rkey) may write into a
//! registered buffer at any moment, the buffer is never exposed as a Rust
//! `&[u8]` / `&mut [u8]` (that would promise the compiler the bytes do not
//! change). CPU access goes through copying methods
//! ([`MemoryRegion::write_at`], [`MemoryRegion::read_at`],
//! [`MemoryRegion::to_vec`]), which are serialised between Rust threads.
//! Ordering between CPU access and device access is the caller's protocol
//! (e.g. read a receive buffer after its completion was polled).
//!
//! Four exceptions hand out shared references, each with a proof that
//! nothing writes the bytes meanwhile: a received message lent out of its
//! receive buffer ([`RecvRing`]: the buffer is not posted again while the
//! loan lives); a region given up as `Bytes`
//! ([`MemoryRegion::into_bytes`]: deregistered first); a window-only region
//! lent as `Bytes` ([`MemoryRegion::lend`]: no rkey of its own, no `Sge`,
//! and no live window holds it, since a window keeps every region it was
//! bound to until it is deallocated); and arena blocks (see `arena`).

mod arena;
mod cm;
mod cq;
mod device;
mod mr;
mod mw;
mod qp;
mod recv;
mod srq;
mod waker;

use std::io;
use std::time::Duration;

pub use arena::{Arena, ArenaBlock, PendingRead, ARENA_CLASSES};
pub use cm::{
    CmEvent, CmEventKind, CmId, CmIdHandle, ConnParam, ConnectRequest, EventChannel,
    MAX_ACCEPT_PRIVATE_DATA, MAX_ACK_TIMEOUT, MAX_CONNECT_PRIVATE_DATA,
};
pub use cq::{
    decode_invalidated_rkey, CompletionChannel, CompletionError, CompletionQueue, CqId, Waited,
    WcFlagsQuirk, WcOpcode, WorkCompletion, RXE_WC_WITH_INVALIDATE, WC_WITH_INV,
};
pub use device::{Context, DeviceAttrs, DeviceList};
pub use mr::{Access, MemoryRegion, ProtectionDomain, RemoteBuf, Sge};
pub use mw::{next_rkey, MemoryWindow, MwAccess};
pub use qp::{QpCaps, QueuePair, RecvWr, RnrAttrs, SendFlags, SendOp, SendWr};
pub use recv::{ReceiveQueue, RecvRing};
pub use srq::SharedReceiveQueue;
pub use waker::Waker;

/// Text every "no device" error carries, pointing at the Soft-RoCE VM.
pub const NO_DEVICE_HINT: &str =
    "RDMA code needs a device; run it in the Soft-RoCE VM with `tests/vm/run -- COMMAND` \
     (or `scripts/test-vm` for the test suite)";

/// Errors of the verbs layer.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// There is no usable RDMA device on this machine.
    #[error("no RDMA device: {detail}; {hint}", hint = NO_DEVICE_HINT)]
    NoDevice {
        /// What was tried and what the system said.
        detail: String,
    },
    /// A library call failed; `source` carries the errno.
    #[error("{call} failed: {source}")]
    Call {
        /// The C function that failed.
        call: &'static str,
        /// The operating-system error it reported.
        #[source]
        source: io::Error,
    },
    /// An argument was out of range or did not belong together.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Waiting for an event or completion took longer than allowed.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// How long was waited.
        after: Duration,
        /// What was waited for.
        what: &'static str,
    },
    /// The connection manager delivered an event other than the one waited for.
    #[error("expected connection manager event {expected:?}, got {got:?} (status {status})")]
    UnexpectedEvent {
        /// The event that was waited for.
        expected: CmEventKind,
        /// The event that arrived.
        got: CmEventKind,
        /// The event's status field (negative errno or a reject reason).
        status: i32,
    },
    /// The peer rejected the connection.
    #[error("connection rejected by the peer (reason {status})")]
    Rejected {
        /// The reject reason reported by the connection manager.
        status: i32,
        /// Private data the peer attached to the reject.
        private_data: Vec<u8>,
    },
}

/// Result alias of the verbs layer.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

impl VerbsError {
    /// Error for a call that reported failure through `errno`.
    pub(crate) fn last_os(call: &'static str) -> Self {
        Self::from_errno(call, io::Error::last_os_error())
    }

    /// Error for a call that returned an errno value directly.
    pub(crate) fn errno(call: &'static str, errno: i32) -> Self {
        Self::from_errno(call, io::Error::from_raw_os_error(errno))
    }

    fn from_errno(call: &'static str, source: io::Error) -> Self {
        match source.raw_os_error() {
            // ENOSYS: the kernel has no verbs support at all (host without
            // RDMA); ENODEV: librdmacm found no device.
            Some(libc::ENOSYS) | Some(libc::ENODEV) => Self::NoDevice {
                detail: format!("{call}: {source}"),
            },
            _ => Self::Call { call, source },
        }
    }

    /// True for [`VerbsError::NoDevice`].
    pub fn is_no_device(&self) -> bool {
        matches!(self, Self::NoDevice { .. })
    }
}

/// Checks that `offset..offset + len` lies inside `0..total`, without
/// overflowing.
pub(crate) fn check_range(offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(VerbsError::InvalidArgument(format!(
            "range {offset}+{len} outside buffer of {total} bytes"
        ))),
    }
}

/// Converts a timeout to the `int` milliseconds `poll(2)` and librdmacm
/// take; `None` means "wait forever" (-1).
pub(crate) fn timeout_ms(timeout: Option<Duration>) -> libc::c_int {
    match timeout {
        None => -1,
        Some(t) => {
            let ms = t.as_millis();
            // Round a non-zero sub-millisecond timeout up so it still waits.
            let ms = if ms == 0 && !t.is_zero() { 1 } else { ms };
            libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
        }
    }
}

/// `poll(2)` over `pfds` until one is ready or `timeout` passes (their
/// `revents` say which). EINTR is retried.
fn poll_fds(pfds: &mut [libc::pollfd], timeout: Option<Duration>) -> Result<()> {
    loop {
        // SAFETY: `pfds` is a slice of valid, initialised pollfds and we
        // pass exactly its length.
        let rc = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                timeout_ms(timeout),
            )
        };
        if rc >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(VerbsError::Call {
                call: "poll",
                source: err,
            });
        }
    }
}

fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits until `fd` is readable or `timeout` passes. Returns whether it is
/// readable. EINTR is retried.
pub(crate) fn wait_readable(fd: libc::c_int, timeout: Option<Duration>) -> Result<bool> {
    let mut pfds = [pollfd(fd)];
    poll_fds(&mut pfds, timeout)?;
    Ok(pfds[0].revents != 0)
}

/// What [`wait_readable_or`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Readable {
    /// The first descriptor is readable.
    pub first: bool,
    /// The second is.
    pub second: bool,
}

/// Waits until `fd` or `other` is readable, or `timeout` passes. EINTR is
/// retried.
pub(crate) fn wait_readable_or(
    fd: libc::c_int,
    other: libc::c_int,
    timeout: Option<Duration>,
) -> Result<Readable> {
    let mut pfds = [pollfd(fd), pollfd(other)];
    poll_fds(&mut pfds, timeout)?;
    let ready = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLERR) != 0;
    Ok(Readable {
        first: ready(&pfds[0]),
        second: ready(&pfds[1]),
    })
}

/// Sets or clears `O_NONBLOCK` on `fd`.
pub(crate) fn set_fd_nonblocking(fd: libc::c_int, nonblocking: bool) -> Result<()> {
    // SAFETY: F_GETFL on an fd owned by a live verbs object; no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(VerbsError::last_os("fcntl(F_GETFL)"));
    }
    let new = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL with an integer flag word; no pointers.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, new) };
    if rc < 0 {
        return Err(VerbsError::last_os("fcntl(F_SETFL)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_message_names_the_vm() {
        let e = VerbsError::errno("ibv_get_device_list", libc::ENOSYS);
        assert!(e.is_no_device());
        let msg = e.to_string();
        assert!(msg.starts_with("no RDMA device"), "{msg}");
        assert!(msg.contains("tests/vm/run"), "{msg}");
        assert!(msg.contains("Soft-RoCE"), "{msg}");
        let e = VerbsError::errno("rdma_create_event_channel", libc::ENODEV);
        assert!(e.is_no_device());
        let e = VerbsError::errno("ibv_reg_mr", libc::ENOMEM);
        assert!(!e.is_no_device());
        assert!(e.to_string().contains("ibv_reg_mr"));
    }

    #[test]
    fn range_checks_do_not_overflow() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(check_range(10, 0, 10).is_ok());
        assert!(check_range(1, 10, 10).is_err());
        assert!(check_range(usize::MAX, 2, 10).is_err());
        assert!(check_range(2, usize::MAX, 10).is_err());
    }

    #[test]
    fn timeouts_convert_to_poll_milliseconds() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(10))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_millis(1500))), 1500);
        assert_eq!(
            timeout_ms(Some(Duration::from_secs(u64::MAX))),
            libc::c_int::MAX
        );
    }
}
