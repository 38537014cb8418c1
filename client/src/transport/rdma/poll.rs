//! Waiting for completions, with the completion engine's
//! [`nfsrdma_transport::rdma::engine::Poller`]: the completion thread, and
//! in busy mode the waiting caller that polls the completion queue on its
//! own thread. One thread polls at a time (it holds the poller), and
//! handles what it finds in queue order.

use super::conn::{lock, Conn};
use super::Outcome;
use crate::PollMode;
use nfsrdma_transport::rdma::verbs::WorkCompletion;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Busy mode: empty polls by a waiting caller between two yields to the
/// async runtime (which lets timers and other tasks run).
const SPINS_PER_YIELD: u32 = 64;
/// Busy mode: how long the completion thread sleeps at a time while
/// callers poll for themselves.
const BACKSTOP_NAP: Duration = Duration::from_millis(1);

impl Conn {
    /// Hands polled completions to the core (the state is locked only when
    /// there is something to handle, so that a caller spinning on an empty
    /// queue does not keep others from posting).
    fn handle(&self, wcs: &mut Vec<WorkCompletion>) -> usize {
        let n = wcs.len();
        if n > 0 {
            let mut st = lock(&self.st);
            for wc in wcs.drain(..) {
                if self.is_dead() {
                    break;
                }
                self.completion(&mut st, &wc);
            }
            self.drive(&mut st);
            drop(st);
            // A completion may have freed a slot (a call's Send completing
            // after its reply was handed over) or raised the credit limit:
            // one waiter tries, and passes the turn on if it gets one.
            self.notify.notify_one();
        }
        n
    }

    /// One poll by a waiting caller (`busy` mode). False when nothing was
    /// handled (the queue was empty, or another thread is polling).
    fn poll_inline(&self) -> bool {
        let Ok(mut g) = self.poller.try_lock() else {
            return false;
        };
        let (poller, wcs) = &mut *g;
        wcs.clear();
        if let Err(e) = poller.poll(wcs) {
            drop(g);
            self.kill(&format!("polling the completion queue: {e}"));
            return false;
        }
        let n = self.handle(wcs);
        self.counters
            .by_caller
            .fetch_add(n as u64, Ordering::Relaxed);
        n > 0
    }

    /// Busy mode: waits for the outcome by polling the completion queue on
    /// the caller's own thread, so the reply needs no hand-off between
    /// threads. One caller polls at a time (the others' replies reach them
    /// through their oneshots, and one of them takes over when it leaves):
    /// more spinning threads would only take CPU from everything else.
    /// `None` when the outcome's sender is gone.
    pub(super) async fn wait_busy(&self, rx: &mut oneshot::Receiver<Outcome>) -> Option<Outcome> {
        struct Spinning<'a>(&'a Conn);
        impl Drop for Spinning<'_> {
            fn drop(&mut self) {
                self.0.spinning.store(false, Ordering::Release);
                self.0.spinner_gone.notify_one();
            }
        }
        loop {
            if self
                .spinning
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Another caller polls; `notify_one` keeps a permit, so
                // leaving between the check and here is not missed.
                tokio::select! {
                    biased;
                    r = &mut *rx => return r.ok(),
                    _ = self.spinner_gone.notified() => continue,
                }
            }
            let _spinning = Spinning(self);
            let mut idle = 0u32;
            loop {
                match rx.try_recv() {
                    Ok(o) => return Some(o),
                    Err(oneshot::error::TryRecvError::Closed) => return None,
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                if self.poll_inline() {
                    continue;
                }
                idle += 1;
                if idle.is_multiple_of(SPINS_PER_YIELD) {
                    tokio::task::yield_now().await;
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// The completion thread: waits for completions as the poll mode says
    /// (in busy mode it is the backstop for completions no caller is
    /// waiting for, and naps while a caller polls).
    pub(super) fn run(self: Arc<Self>) {
        while !self.is_dead() {
            if self.poll == PollMode::Busy && self.spinning.load(Ordering::Acquire) {
                std::thread::park_timeout(BACKSTOP_NAP);
                continue;
            }
            let mut g = lock(&self.poller);
            let (poller, wcs) = &mut *g;
            wcs.clear();
            match poller.wait(wcs) {
                Ok(0) => {}
                Ok(_) => {
                    // What the thread waits for are replies.
                    poller.awaited();
                    poller.worked();
                    self.handle(wcs);
                }
                Err(e) => {
                    drop(g);
                    self.kill(&format!("waiting for completions: {e}"));
                    break;
                }
            }
        }
        tracing::debug!(conn = self.id, "completion thread ends");
    }
}
