//! RDMA Reads: the depth agreed with the peer, and the order in which
//! calls' Reads go out.
//!
//! # Policies
//! - At most `read_depth` Reads are outstanding (the initiator depth
//!   agreed at connect time: the peer's responder resources). A Read
//!   beyond it would wait in the device or fail.
//! - Calls' Reads go out oldest call first; a call's Reads go out as one
//!   chain as far as the depth and the send queue allow (one send-queue
//!   entry stays free for a reply), the rest in further chains as
//!   completions give room back.

use super::CallId;
use std::collections::VecDeque;

/// Read depth in use and calls waiting to post Reads.
#[derive(Debug)]
pub struct ReadScheduler {
    depth: u32,
    outstanding: u32,
    waiting: VecDeque<CallId>,
}

impl ReadScheduler {
    /// A scheduler for `depth` outstanding Reads (at least one).
    pub fn new(depth: u32) -> ReadScheduler {
        ReadScheduler {
            depth: depth.max(1),
            outstanding: 0,
            waiting: VecDeque::new(),
        }
    }

    /// Reads outstanding.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// `call` has Reads to post; it goes after every call already waiting.
    pub fn enqueue(&mut self, call: CallId) {
        self.waiting.push_back(call);
    }

    /// The oldest call with Reads to post.
    pub fn front(&self) -> Option<CallId> {
        self.waiting.front().copied()
    }

    /// The oldest call has posted all its Reads.
    pub fn pop_front(&mut self) {
        self.waiting.pop_front();
    }

    /// How many Reads may go out now, with `sq_room` send-queue entries
    /// free (one stays for a reply).
    pub fn room(&self, sq_room: u32) -> u32 {
        (self.depth - self.outstanding).min(sq_room.saturating_sub(1))
    }

    /// `n` Reads were posted.
    pub fn posted(&mut self, n: u32) {
        self.outstanding += n;
        debug_assert!(self.outstanding <= self.depth);
    }

    /// A chain of `n` Reads completed.
    pub fn chain_done(&mut self, n: u32) {
        self.outstanding = self.outstanding.saturating_sub(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_and_queue_room_bound_the_reads() {
        let mut r = ReadScheduler::new(4);
        assert_eq!(r.room(100), 4);
        assert_eq!(r.room(3), 2, "one entry stays for a reply");
        r.posted(3);
        assert_eq!(r.room(100), 1);
        r.chain_done(3);
        assert_eq!(r.room(100), 4);
        assert_eq!(r.room(0), 0);
    }
}
