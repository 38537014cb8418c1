//! The send queue: its depth, the send slots, and which work requests ask
//! for a completion.
//!
//! A queue pair completes its send-queue work in the order it was posted,
//! so one signaled completion stands for every unsignaled work request
//! before it. The queue here is that order: each entry is a posted work
//! request with what its completion gives back (a send slot, a chunk
//! slot, Read depth), and a signaled completion gives back its own and
//! every entry before it.
//!
//! # Policies (which requests are signaled)
//! - The Writes of a reply are unsignaled: the reply's Send after them
//!   completes only after they did.
//! - A reply's Send is signaled when it is the `signal_every`-th since the
//!   last signaled one, when it holds a chunk slot (few, and wanted
//!   back soon), when fewer than `signal_every` send slots are free, or
//!   when the unsignaled entries since the last signaled one would be more
//!   than half the queue. So slots and entries always come back with some
//!   later completion, and at most half the queue waits for one.
//! - The last request of a Read chain is signaled, the others not (one
//!   completion per chain).
//! - A reply whose Writes do not fit the queue goes out in several chains;
//!   each chain that ends before the Send ends with a signaled Write.

use super::{CallId, Config, WrId, WrKind};
use std::collections::VecDeque;

/// What a work request's completion gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Only its queue entry.
    Nothing,
    /// A send slot, and the chunk slot of a reply whose data was copied.
    Slot {
        /// The slot.
        slot: u32,
        /// Its chunk slot goes back too.
        chunk: bool,
    },
    /// The Send of our call in `slot`.
    CallSent {
        /// The call's slot.
        slot: u32,
    },
    /// The last local invalidation of our call in `slot`.
    Fenced {
        /// The call's slot.
        slot: u32,
    },
    /// The end of a call's Read chain of `reads` requests.
    ReadChain {
        /// The call.
        call: CallId,
        /// Reads in the chain.
        reads: u32,
    },
}

#[derive(Debug)]
struct Entry {
    wr: WrId,
    signaled: bool,
    release: Release,
}

/// Marks the id of a Read that is not signaled.
const QUIET: u64 = 1 << 55;

/// The send queue's state.
#[derive(Debug)]
pub struct SendQueue {
    depth: u32,
    entries: VecDeque<Entry>,
    free_slots: Vec<u32>,
    signal_every: u32,
    /// Unsignaled Sends since the last signaled entry.
    quiet_sends: u32,
    /// Entries since the last signaled one.
    tail: u32,
    /// Signaled entries in the queue.
    signaled: u32,
    next: u64,
}

impl SendQueue {
    /// The queue of `cfg`.
    pub fn new(cfg: &Config) -> SendQueue {
        SendQueue {
            depth: cfg.sq_depth,
            entries: VecDeque::new(),
            free_slots: (0..cfg.send_slots).rev().collect(),
            signal_every: cfg.signal_every,
            quiet_sends: 0,
            tail: 0,
            signaled: 0,
            next: 0,
        }
    }

    /// Entries free.
    pub fn room(&self) -> u32 {
        self.depth - self.entries.len() as u32
    }

    /// Entries in use.
    pub fn in_use(&self) -> u32 {
        self.entries.len() as u32
    }

    /// The queue's depth.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Takes a free send slot.
    pub fn reserve_slot(&mut self) -> Option<u32> {
        self.free_slots.pop()
    }

    /// Gives a slot back.
    pub fn free_slot(&mut self, slot: u32) {
        debug_assert!(!self.free_slots.contains(&slot), "slot {slot} freed twice");
        self.free_slots.push(slot);
    }

    /// Slots free.
    pub fn free_slots(&self) -> u32 {
        self.free_slots.len() as u32
    }

    /// Slots held by Sends that are posted and not yet known complete.
    pub fn unreaped_slots(&self) -> u32 {
        self.entries
            .iter()
            .filter(|e| matches!(e.release, Release::Slot { .. }))
            .count() as u32
    }

    /// Whether a reply's Send after `writes` Writes in its chain asks for
    /// a completion (see the policies above).
    pub fn send_signaled(&self, writes: u32, chunk_slot: bool) -> bool {
        let unreaped = self.tail + writes + 1;
        self.quiet_sends + 1 >= self.signal_every
            || chunk_slot
            || self.free_slots.len() < self.signal_every as usize
            || unreaped > self.depth / 2
    }

    /// Adds a posted work request; returns its id.
    pub fn push(&mut self, kind: WrKind, signaled: bool, release: Release) -> WrId {
        debug_assert!(self.room() > 0, "send queue overfilled");
        self.next += 1;
        let wr = WrId::new(kind, self.next & (QUIET - 1));
        if signaled {
            self.tail = 0;
            self.quiet_sends = 0;
            self.signaled += 1;
        } else {
            self.tail += 1;
            if kind == WrKind::Send {
                self.quiet_sends += 1;
            }
        }
        self.entries.push_back(Entry {
            wr,
            signaled,
            release,
        });
        wr
    }

    /// The id every unsignaled Read carries.
    pub fn quiet_read() -> WrId {
        WrId::new(WrKind::Read, QUIET)
    }

    /// A signaled work request completed: it and every entry before it are
    /// done; what they give back is appended to `out`. An error when `wr`
    /// is not a signaled entry of the queue (a driver fault).
    pub fn complete(&mut self, wr: WrId, out: &mut Vec<Release>) -> Result<(), String> {
        let Some(at) = self.entries.iter().position(|e| e.wr == wr) else {
            return Err(format!(
                "completion of work request {:#x}, which is not outstanding",
                wr.0
            ));
        };
        if !self.entries[at].signaled {
            return Err(format!("completion of unsignaled work request {:#x}", wr.0));
        }
        for e in self.entries.drain(..=at) {
            if e.signaled {
                self.signaled -= 1;
            }
            out.push(e.release);
        }
        if self.signaled == 0 {
            // Everything left is the unsignaled tail.
            self.tail = self.entries.len() as u32;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(depth: u32, slots: u32, every: u32) -> SendQueue {
        SendQueue::new(&Config {
            sq_depth: depth,
            send_slots: slots,
            signal_every: every,
            ..Config::default()
        })
    }

    #[test]
    fn one_completion_gives_back_everything_before_it() {
        let mut s = q(8, 16, 4);
        let a = s.reserve_slot().unwrap();
        let b = s.reserve_slot().unwrap();
        assert!(!s.send_signaled(2, false));
        s.push(WrKind::Write, false, Release::Nothing);
        s.push(WrKind::Write, false, Release::Nothing);
        s.push(
            WrKind::Send,
            false,
            Release::Slot {
                slot: a,
                chunk: false,
            },
        );
        let last = s.push(
            WrKind::Send,
            true,
            Release::Slot {
                slot: b,
                chunk: true,
            },
        );
        assert_eq!(s.room(), 4);
        let mut back = Vec::new();
        s.complete(last, &mut back).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(s.room(), 8);
        assert!(
            s.complete(last, &mut back).is_err(),
            "not outstanding any more"
        );
    }

    #[test]
    fn sends_are_signaled_before_slots_or_the_queue_run_out() {
        let mut s = q(8, 4, 16);
        // Fewer free slots than signal_every: every Send is signaled.
        assert!(s.send_signaled(0, false));
        let mut s2 = q(8, 64, 16);
        // Half the queue unreaped.
        for _ in 0..4 {
            s2.push(WrKind::Write, false, Release::Nothing);
        }
        assert!(s2.send_signaled(0, false));
        assert!(q(64, 64, 16).send_signaled(0, true), "chunk slot");
        let u = s.push(WrKind::Send, false, Release::Nothing);
        assert!(
            s.complete(u, &mut Vec::new()).is_err(),
            "an unsignaled request never completes alone"
        );
    }
}
