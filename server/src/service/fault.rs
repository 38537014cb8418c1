//! A panic in a call's handler is a bug of ours, not the peer's; it must
//! not leave the peer waiting for a reply that never comes, nor take down
//! the thread that serves other peers' calls (an RDMA pool thread serves
//! many connections). Each procedure and each NFSv4 operation runs under
//! [`catch`]: a panic there is logged, counted, and answered with the
//! protocol's own status for a server fault (NFS3ERR_SERVERFAULT,
//! NFS4ERR_SERVERFAULT); anywhere else in a call it is answered with RPC
//! SYSTEM_ERR (RFC 5531 §9).
//!
//! What the handler held stays usable: the store's and the state's locks
//! take over a poisoned guard, and the caches a call enters (the duplicate
//! request cache, an NFSv4.1 slot) are left by the normal path, since the
//! panic is caught below them.

use super::metrics::Metrics;
use std::any::Any;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic in it is logged with `what` and the peer, counted,
/// and turned into `None`.
pub(crate) fn catch<T>(
    metrics: &Metrics,
    peer: SocketAddr,
    what: &str,
    f: impl FnOnce() -> T,
) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(payload) => {
            metrics.panicked();
            tracing::error!(
                %peer,
                call = what,
                panic = message(payload.as_ref()),
                "a call's handler panicked: answered as a server fault"
            );
            None
        }
    }
}

/// The text a panic was raised with.
pub(crate) fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(not text)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_counted_and_turned_into_none_and_a_value_passes_through() {
        let m = Metrics::default();
        let peer: SocketAddr = "192.0.2.1:700".parse().unwrap();
        assert_eq!(catch(&m, peer, "t", || 7), Some(7));
        assert_eq!(m.handler_panics(), 0);
        assert_eq!(catch(&m, peer, "t", || -> u32 { panic!("a bug") }), None);
        let n = 3;
        assert_eq!(catch(&m, peer, "t", || -> u32 { panic!("bug {n}") }), None);
        assert_eq!(m.handler_panics(), 2);
    }

    #[test]
    fn the_panic_message_is_found_whether_static_or_formatted() {
        let p = catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(message(p.as_ref()), "static");
        let n = 5;
        let p = catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(message(p.as_ref()), "formatted 5");
        let p = catch_unwind(|| std::panic::panic_any(5u8)).unwrap_err();
        assert_eq!(message(p.as_ref()), "(not text)");
    }
}
