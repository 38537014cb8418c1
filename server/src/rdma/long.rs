//! The threads that finish long calls for the pool threads.
//!
//! A pool thread serves many connections, one call at a time. A call whose
//! work grows with the bytes it names ([`LongCall`]: a COPY of up to
//! 64 MiB, a CLONE, an ALLOCATE or DEALLOCATE of any range) would hold
//! every other connection of its thread until it ends. The pool thread
//! decodes and checks such a call, then sends what is left of it here; one
//! of these threads runs it ([`Service::finish_call`]) and sends the reply
//! back to the connection's pool thread ([`Msg::Answer`]), waking it. The
//! reply then goes out as any other. Meanwhile the pool thread serves its
//! other connections, and the call's connection too: its other calls may
//! be answered before it, as RPC allows.

use super::worker::Msg;
use super::RdmaStats;
use crate::service::{LongCall, Service};
use nfsrdma_rpcrdma::conn::CallId;
use nfsrdma_transport::rdma::verbs::{VerbsError, Waker};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

/// Where a long call's reply goes: its connection on its pool thread.
pub struct Back {
    /// The pool thread's messages.
    pub tx: mpsc::Sender<Msg>,
    /// Wakes the pool thread from its sleep on the completion channel.
    pub waker: Arc<Waker>,
    /// The connection's queue pair number.
    pub qp_num: u32,
    /// The connection's number in the pool.
    pub serial: u64,
    /// The call.
    pub call: CallId,
}

struct Job {
    call: Box<LongCall>,
    back: Back,
}

/// What a pool thread hands long calls to (one per pool thread, all
/// feeding the same threads).
#[derive(Clone)]
pub struct LongSender {
    tx: mpsc::Sender<Job>,
    stats: Arc<RdmaStats>,
}

impl LongSender {
    /// Has `call` finished off the pool thread; its reply comes back as
    /// `back` says.
    pub fn send(&self, call: Box<LongCall>, back: Back) {
        self.stats.long_calls.fetch_add(1, Ordering::Relaxed);
        // The threads stop only once every sender is gone.
        let _ = self.tx.send(Job { call, back });
    }
}

/// The threads for long calls.
pub struct LongThreads {
    tx: LongSender,
    handles: Vec<JoinHandle<()>>,
}

impl LongThreads {
    /// Starts `n` threads (at least 1), named `rdma-long-N`.
    pub fn start(
        n: usize,
        service: Arc<Service>,
        stats: Arc<RdmaStats>,
    ) -> Result<LongThreads, VerbsError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for i in 0..n.max(1) {
            let rx = rx.clone();
            let service = service.clone();
            let h = std::thread::Builder::new()
                .name(format!("rdma-long-{i}"))
                .spawn(move || loop {
                    // One thread waits for the next job at a time; the
                    // lock is let go before the job runs.
                    let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    let reply = Box::new(service.finish_call(*job.call));
                    let b = job.back;
                    // A pool thread that has stopped drops the reply.
                    if b.tx
                        .send(Msg::Answer {
                            qp_num: b.qp_num,
                            serial: b.serial,
                            call: b.call,
                            reply,
                        })
                        .is_ok()
                    {
                        b.waker.wake();
                    }
                })
                .map_err(|e| VerbsError::Call {
                    call: "spawn",
                    source: e,
                })?;
            handles.push(h);
        }
        Ok(LongThreads {
            tx: LongSender { tx, stats },
            handles,
        })
    }

    /// A sender for a pool thread.
    pub fn sender(&self) -> LongSender {
        self.tx.clone()
    }

    /// Stops the threads once every sender is gone (the pool threads
    /// have stopped) and the calls sent are finished; waits for them.
    pub fn stop(&mut self) {
        let (none, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.tx.tx, none));
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for LongThreads {
    fn drop(&mut self) {
        self.stop();
    }
}
