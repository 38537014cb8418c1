//! Serving NFSv3 over RPC-over-RDMA version 1 (RFC 8166): the responder
//! driver.
//!
//! Every protocol decision is made by the connection core
//! ([`nfsrdma_rpcrdma::conn::Connection`]: credits, receive buffers, the
//! send queue and its signalling, the RDMA Read depth, RDMA_ERROR, Send
//! With Invalidate) and the message rules it uses
//! ([`nfsrdma_rpcrdma::responder`]). This driver carries out what the
//! core yields with the verbs layer, in files of one concern:
//!
//! - [`device`]: the RDMA device, its protection domain and the arena the
//!   stores' file blocks come from (registered once, local access only);
//! - [`listener`]: the connection manager thread: listening, the RFC 8797
//!   exchange at connect time, and each connection's verbs objects;
//! - [`worker`]: the pool of threads that serve the connections, each
//!   waiting for the completions of the connections placed on it (the
//!   [`nfsrdma_transport::rdma::engine::Poller`], over CQs its connections
//!   share) and handing each to its connection;
//! - [`conn`]: a connection: handing its completions to the core, posting
//!   the work it yields;
//! - [`calls`]: what a call's data needs from the server: where its Read
//!   chunks land (so that WRITE data becomes file blocks without a copy),
//!   running it through the [`crate::service::Service`], and where its
//!   reply's data is (store blocks as they are, anything else copied into
//!   staging blocks from the arena);
//! - [`stats`]: the counters, over all connections.
//!
//! Every region the server registers has local access only: the server
//! never hands an rkey to a peer. A completion error (the peer's memory
//! refused a Read or Write, the peer went away) ends that connection only:
//! its queue pair is flushed and everything it held is released.

pub mod backward;
pub mod calls;
pub mod conn;
pub mod device;
pub mod listener;
pub mod long;
pub mod shared;
pub mod stats;
pub mod worker;

pub use device::RdmaDevice;
pub use listener::RdmaListener;
pub use stats::RdmaStats;

use nfsrdma_transport::rdma::engine::{PollMode, AUTO_MAX_DEFAULT};
use nfsrdma_xdr::rpcrdma::CmPrivate;
use std::net::SocketAddr;

/// RDMA listener settings.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Credits granted (and receive buffers posted) per connection.
    pub credits: u32,
    /// Our inline threshold, both directions (advertised in the RFC 8797
    /// message; 1 KiB .. 256 KiB).
    pub inline_size: u32,
    /// Largest READ/WRITE payload (and so the largest call assembled from
    /// chunks: [`RdmaConfig::chunk_size`]).
    pub max_io: u32,
    /// Chunk slots per connection: calls with chunks in progress at once,
    /// each landing up to [`RdmaConfig::chunk_size`] bytes of Read chunks
    /// and staging as much reply data, in blocks from the device's arena
    /// (shared by every connection, not set aside per connection).
    pub chunk_slots: usize,
    /// How pool threads wait for completions.
    pub poll: PollMode,
    /// Pool threads serving the connections ([`worker`]).
    pub threads: usize,
    /// One reply Send in this many asks for a completion (1: every one;
    /// see `nfsrdma_rpcrdma::conn::sendq` for when a Send is signaled
    /// anyway).
    pub signal_every: u32,
    /// Connections served at once; a connect request beyond them is
    /// rejected (counted in [`RdmaStats::refused_connections`]).
    pub max_connections: usize,
    /// Receive buffers per pool thread on a shared receive queue that all
    /// the thread's connections receive from ([`shared`]); 0: each
    /// connection posts `credits` buffers of its own (the default). A
    /// device without shared receive queues falls back to that, logged.
    pub srq_buffers: u32,
    /// Backward calls (RFC 8167: NFSv4.1 callbacks) each connection can
    /// have waiting for replies, a send buffer each and a receive of its
    /// own each (or, with `srq_buffers`, one of the shared queue's while
    /// its reply is parsed) ([`listener::BACKWARD_CALLS`]; 0 without
    /// NFSv4).
    pub backward_calls: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            addr: ([0, 0, 0, 0], 20049).into(),
            credits: 128,
            inline_size: 4096,
            max_io: 1 << 20,
            chunk_slots: 4,
            poll: PollMode::Auto {
                max: AUTO_MAX_DEFAULT,
            },
            signal_every: 1,
            max_connections: 256,
            threads: default_threads(),
            srq_buffers: 0,
            backward_calls: listener::BACKWARD_CALLS,
        }
    }
}

/// The default of `--rdma-threads`: one pool thread per core the process
/// may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl RdmaConfig {
    /// Bytes of registered memory one connection holds for its life: a
    /// receive buffer and a send buffer per credit and per backward call
    /// (only the send buffers, with shared receive queues: see
    /// [`RdmaConfig::shared_receive_memory`]). The memory its calls'
    /// chunks land in and its replies' data is staged in comes from the
    /// device's arena as calls need it, at most
    /// [`RdmaConfig::chunk_memory_per_connection`].
    pub fn memory_per_connection(&self) -> usize {
        let inline = CmPrivate::representable(self.inline_size) as usize;
        let slots = (self.credits + self.backward_calls) as usize;
        if self.srq_buffers > 0 {
            slots * inline
        } else {
            2 * slots * inline
        }
    }

    /// Bytes of the shared receive queues' buffers, for the daemon's life:
    /// `srq_buffers` per pool thread (0 without them).
    pub fn shared_receive_memory(&self) -> usize {
        let inline = CmPrivate::representable(self.inline_size) as usize;
        self.srq_buffers as usize * inline * self.threads.max(1)
    }

    /// The most arena memory one connection's calls hold at once: per
    /// chunk slot, a call's landing memory and its staged reply data.
    pub fn chunk_memory_per_connection(&self) -> usize {
        2 * self.chunk_slots.max(1) * self.chunk_size()
    }

    /// The default of `--max-connections` over RDMA: the connections whose
    /// registered memory ([`RdmaConfig::memory_per_connection`]) fits in
    /// half of `memory_total` bytes (the machine's memory), at least 1. A
    /// connection takes no file descriptor of its own (its completions
    /// come on a pool thread's channel), so the open-file limit does not
    /// bound them.
    pub fn default_max_connections(&self, memory_total: u64) -> usize {
        let per = self.memory_per_connection().max(1) as u64;
        usize::try_from(memory_total / 2 / per)
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// The largest call assembled from chunks, and the most reply data
    /// staged for one call.
    pub fn chunk_size(&self) -> usize {
        self.max_io as usize + 64 * 1024
    }

    /// The `signal_every` that suits a polling mode when none is asked
    /// for: 1 with adaptive and auto polling, 16 otherwise. Such a thread
    /// spins for a while after its last completion; with every reply Send
    /// signaled, that time counts from when the reply went out (its data
    /// Writes included) rather than from when the call arrived, so a
    /// client that sends its next call soon after a large reply still
    /// finds the thread awake (and `auto` learns the gap between a reply
    /// and the next call, which is what the client controls). In event
    /// and busy mode a completion per reply would only cost a wake-up or a
    /// poll.
    pub fn default_signal_every(poll: PollMode) -> u32 {
        match poll {
            PollMode::Adaptive { .. } | PollMode::Auto { .. } => 1,
            PollMode::Busy | PollMode::Event => 16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_connection_cap_fits_half_the_memory() {
        let cfg = RdmaConfig::default();
        let per = cfg.memory_per_connection() as u64;
        // 2 GiB: 1 GiB of registered memory for connections.
        let n = cfg.default_max_connections(2 << 30);
        assert_eq!(n as u64, (1 << 30) / per);
        assert!(n as u64 * per <= 1 << 30 && (n as u64 + 1) * per > 1 << 30);
        // 32 GiB over 1 MiB + 32 KiB each.
        assert_eq!(cfg.default_max_connections(64 << 30), 31_775);
        // A machine too small for one still serves one.
        assert_eq!(cfg.default_max_connections(per), 1);
        assert_eq!(cfg.default_max_connections(0), 1);
    }

    #[test]
    fn adaptive_polling_signals_every_reply_by_default() {
        assert_eq!(RdmaConfig::default_signal_every(PollMode::default()), 1);
        let auto = RdmaConfig::default().poll;
        assert!(matches!(auto, PollMode::Auto { .. }), "{auto}");
        assert_eq!(RdmaConfig::default_signal_every(auto), 1);
        assert_eq!(RdmaConfig::default().signal_every, 1);
        assert_eq!(
            RdmaConfig::default_signal_every("adaptive:1000".parse().unwrap()),
            1
        );
        assert_eq!(RdmaConfig::default_signal_every(PollMode::Event), 16);
        assert_eq!(RdmaConfig::default_signal_every(PollMode::Busy), 16);
        assert_eq!(
            RdmaConfig::default().signal_every,
            RdmaConfig::default_signal_every(RdmaConfig::default().poll)
        );
    }

    #[test]
    fn memory_per_connection_counts_every_buffer() {
        // 128 receive and 128 send buffers of 4 KiB, and 4 of each for
        // backward calls: 1 MiB + 32 KiB.
        let cfg = RdmaConfig::default();
        assert_eq!(cfg.memory_per_connection(), 2 * (128 + 4) * 4096);
        assert_eq!(cfg.memory_per_connection(), (1 << 20) + (32 << 10));
        let v3_only = RdmaConfig {
            backward_calls: 0,
            ..RdmaConfig::default()
        };
        assert_eq!(v3_only.memory_per_connection(), 1 << 20);
        // Per chunk slot (4), a call's landing and its staged reply data
        // of at most 1 MiB + 64 KiB each, from the arena.
        assert_eq!(
            cfg.chunk_memory_per_connection(),
            2 * 4 * ((1 << 20) + (64 << 10))
        );
        assert_eq!(cfg.shared_receive_memory(), 0);
        // With shared receive queues a connection keeps its send buffers
        // only (for its replies and its backward calls); the receive
        // buffers are per pool thread.
        let shared = RdmaConfig {
            srq_buffers: 1024,
            threads: 2,
            ..RdmaConfig::default()
        };
        assert_eq!(shared.memory_per_connection(), (128 + 4) * 4096);
        assert_eq!(shared.shared_receive_memory(), 2 * 1024 * 4096);
    }
}
