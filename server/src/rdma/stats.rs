//! The RDMA transport's counters, totals over all connections: the
//! connection cores' own counters ([`nfsrdma_rpcrdma::conn::Stats`]) added
//! up as they move, and the driver's.

use nfsrdma_rpcrdma::conn::Stats;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the RDMA transport (totals over all connections).
#[derive(Debug, Default)]
pub struct RdmaStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Backward calls sent (RFC 8167: NFSv4.1 callbacks).
    pub backward_calls: AtomicU64,
    /// Backward calls answered with an RPC reply.
    pub backward_replies: AtomicU64,
    /// Backward calls not sent (too large to go inline, or too many
    /// waiting for the client's grant) or answered with RDMA_ERROR.
    pub backward_dropped: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Calls received.
    pub calls: AtomicU64,
    /// Calls that arrived entirely inline.
    pub inline_calls: AtomicU64,
    /// Calls with Read chunks.
    pub chunked_calls: AtomicU64,
    /// Replies sent inline.
    pub inline_replies: AtomicU64,
    /// Replies sent through the Reply chunk.
    pub reply_chunk_replies: AtomicU64,
    /// Bytes moved by RDMA Read.
    pub read_bytes: AtomicU64,
    /// Bytes moved by RDMA Write.
    pub write_bytes: AtomicU64,
    /// Plain Sends.
    pub sends: AtomicU64,
    /// Sends With Invalidate.
    pub sends_with_inv: AtomicU64,
    /// Reply Sends posted without asking for a completion (reaped with a
    /// later one; see [`super::RdmaConfig::signal_every`]).
    pub unsignaled_sends: AtomicU64,
    /// RDMA_ERROR ERR_VERS sent.
    pub err_vers: AtomicU64,
    /// RDMA_ERROR ERR_CHUNK sent.
    pub err_chunk: AtomicU64,
    /// Messages dropped without a reply.
    pub discarded: AtomicU64,
    /// The last credit grant.
    pub credits_granted: AtomicU64,
    /// Payload bytes copied into staging blocks for RDMA Writes (data of
    /// a reply that was not in arena memory).
    pub payload_copies: AtomicU64,
    /// Calls answered with ERR_CHUNK because the arena had no memory left
    /// for their Read chunks to land in (for [`super::conn::ARENA_WAIT`])
    /// or for their reply's data to be staged in.
    pub arena_exhausted: AtomicU64,
    /// Calls whose Read chunks waited for arena memory to land in.
    pub arena_waits: AtomicU64,
    /// Connections ended by an error.
    pub errors: AtomicU64,
    /// Connect requests rejected because `max_connections` were open.
    pub refused_connections: AtomicU64,
    /// Connections closed because a Send of ours found no receive posted
    /// at the peer through all its receiver-not-ready retries
    /// ([`super::listener::RNR_RETRY`]): a requester that posts no
    /// receives for its replies.
    pub peer_not_receiving: AtomicU64,
    /// Connections dropped by [`RdmaListener::disconnect_all`].
    pub forced_disconnects: AtomicU64,
    /// Calls found by a pool thread that was polling (busy, or spinning
    /// after its last completion).
    pub polled_calls: AtomicU64,
    /// Calls found by a pool thread that had gone to sleep on the
    /// completion channel (each a wake-up on the call's path).
    pub woken_calls: AtomicU64,
    /// Sleeps of a pool thread on its completion channel that ended by
    /// their time limit with nothing to do: what idle connections cost, per
    /// pool thread (see [`super::worker::IDLE_WAIT`]).
    pub idle_wakeups: AtomicU64,
    /// Calls run to their end off the pool threads, on the threads for
    /// long calls ([`super::long`]), so that their pool thread serves its
    /// other connections meanwhile.
    pub long_calls: AtomicU64,
    /// The most receive buffers one connection's messages held at once:
    /// never more than the credits granted, whatever a peer sends.
    pub receives_held_peak: AtomicU64,
    /// Receive buffers of the pool threads' shared receive queues, all
    /// threads together (0: each connection has its own, the default;
    /// `--rdma-srq`).
    pub shared_receive_buffers: AtomicU64,
    /// Of those, the buffers posted now (the rest are held by calls, or
    /// wait to be posted again).
    pub shared_receives_posted: AtomicU64,
    /// The most buffers of one pool thread's shared receive queue taken
    /// at once (received and not yet posted again): when it reaches the
    /// thread's share of [`RdmaStats::shared_receive_buffers`], a Send
    /// can have found the queue empty.
    pub shared_receives_taken_peak: AtomicU64,
    /// Of the calls found polling under `--poll auto`, how long each came
    /// after the connection's last work, by [`GAP_BOUNDS_US`] (the last
    /// bucket: longer than the largest bound).
    pub polled_gaps: [AtomicU64; GAP_BOUNDS_US.len() + 1],
}

/// Upper bounds (exclusive, in microseconds) of the buckets of
/// [`RdmaStats::polled_gaps`].
pub const GAP_BOUNDS_US: [u64; 9] = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

impl RdmaStats {
    /// Counts a call found polling `gap` after the last work.
    pub fn note_gap(&self, gap: std::time::Duration) {
        let us = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
        let i = GAP_BOUNDS_US
            .iter()
            .position(|&b| us < b)
            .unwrap_or(GAP_BOUNDS_US.len());
        self.polled_gaps[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The gap buckets as `<16 N, <32 N, ..., >=4096 N`.
    fn gaps_report(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.polled_gaps.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            match GAP_BOUNDS_US.get(i) {
                Some(b) => out.push_str(&format!("<{b} {}", c.load(Ordering::Relaxed))),
                None => out.push_str(&format!(
                    ">={} {}",
                    GAP_BOUNDS_US[GAP_BOUNDS_US.len() - 1],
                    c.load(Ordering::Relaxed)
                )),
            }
        }
        out
    }

    /// A one-paragraph report.
    pub fn report(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "rdma: connections {} (open {}), calls {} (inline {}, chunked {}), replies inline {} / reply chunk {}, \
             RDMA Read {} B, RDMA Write {} B, Send {} / Send With Invalidate {} (unsignaled {}), RDMA_ERROR vers {} chunk {}, \
             discarded {}, credits granted {}, payload bytes copied {}, calls refused for want of arena memory {} (waited for it {}), connection errors {}, connections refused over the cap {}, \
             closed for want of a receive at the peer (RNR) {}, \
             calls found polling {} / after a wake-up {}, idle wake-ups {}, long calls run off the pool threads {}, receives held at most {}, \
             shared receive buffers {} (posted now {}, of one thread's taken at once at most {}), \
             backward calls {} (answered {}, dropped {}), \
             gaps before calls found polling in us: {}\n",
            g(&self.connections),
            g(&self.open),
            g(&self.calls),
            g(&self.inline_calls),
            g(&self.chunked_calls),
            g(&self.inline_replies),
            g(&self.reply_chunk_replies),
            g(&self.read_bytes),
            g(&self.write_bytes),
            g(&self.sends),
            g(&self.sends_with_inv),
            g(&self.unsignaled_sends),
            g(&self.err_vers),
            g(&self.err_chunk),
            g(&self.discarded),
            g(&self.credits_granted),
            g(&self.payload_copies),
            g(&self.arena_exhausted),
            g(&self.arena_waits),
            g(&self.errors),
            g(&self.refused_connections),
            g(&self.peer_not_receiving),
            g(&self.polled_calls),
            g(&self.woken_calls),
            g(&self.idle_wakeups),
            g(&self.long_calls),
            g(&self.receives_held_peak),
            g(&self.shared_receive_buffers),
            g(&self.shared_receives_posted),
            g(&self.shared_receives_taken_peak),
            g(&self.backward_calls),
            g(&self.backward_replies),
            g(&self.backward_dropped),
            self.gaps_report(),
        )
    }
}

impl RdmaStats {
    /// Adds what a connection's core counted between `before` and `now`.
    pub fn add(&self, before: &Stats, now: &Stats) {
        let add = |a: &AtomicU64, was: u64, is: u64| {
            if is != was {
                a.fetch_add(is - was, Ordering::Relaxed);
            }
        };
        add(&self.calls, before.calls, now.calls);
        add(&self.inline_calls, before.inline_calls, now.inline_calls);
        add(&self.chunked_calls, before.chunked_calls, now.chunked_calls);
        add(
            &self.inline_replies,
            before.inline_replies,
            now.inline_replies,
        );
        add(
            &self.reply_chunk_replies,
            before.reply_chunk_replies,
            now.reply_chunk_replies,
        );
        add(&self.read_bytes, before.read_bytes, now.read_bytes);
        add(&self.write_bytes, before.write_bytes, now.write_bytes);
        add(&self.sends, before.sends, now.sends);
        add(
            &self.sends_with_inv,
            before.sends_with_inv,
            now.sends_with_inv,
        );
        add(
            &self.unsignaled_sends,
            before.unsignaled_sends,
            now.unsignaled_sends,
        );
        add(&self.err_vers, before.err_vers, now.err_vers);
        add(&self.err_chunk, before.err_chunk, now.err_chunk);
        add(&self.discarded, before.discarded, now.discarded);
        add(&self.backward_calls, before.calls_sent, now.calls_sent);
    }
}
