//! Receive buffers: each is posted, or held by the message it received.
//!
//! RFC 8166 §3.3.1: a responder posts receives before it grants the credits
//! that let a requester send into them. Every buffer is posted when the
//! connection starts; a message holds its buffer from its receive
//! completion until it is done with (its reply or RDMA_ERROR is posted, or
//! it is dropped), and the buffer is posted again then. The driver may
//! therefore hand the core a message that is a view of the buffer rather
//! than a copy, and must not post it again before the core says so.

use super::{WrId, WrKind};

/// The id of buffer `b`'s receive.
pub fn wr_id(b: u32) -> WrId {
    WrId::new(WrKind::Recv, u64::from(b))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Posted,
    Held,
}

/// The buffers' states.
#[derive(Debug)]
pub struct RecvBuffers {
    state: Vec<State>,
    held: u32,
}

impl RecvBuffers {
    /// `n` buffers, all held (the connection posts them at once).
    pub fn new(n: u32) -> RecvBuffers {
        RecvBuffers {
            state: vec![State::Held; n as usize],
            held: n,
        }
    }

    /// Buffer `b` is posted.
    pub fn post(&mut self, b: u32) {
        if let Some(s) = self.state.get_mut(b as usize) {
            if *s == State::Held {
                *s = State::Posted;
                self.held -= 1;
            }
        }
    }

    /// Buffer `b` received a message, which now holds it. An error when
    /// it was not posted (a driver fault).
    pub fn take(&mut self, b: u32) -> Result<(), String> {
        match self.state.get_mut(b as usize) {
            Some(s @ State::Posted) => {
                *s = State::Held;
                self.held += 1;
                Ok(())
            }
            Some(State::Held) => Err(format!("receive buffer {b} completed while not posted")),
            None => Err(format!("receive buffer {b} does not exist")),
        }
    }

    /// Buffers held by messages.
    pub fn held(&self) -> u32 {
        self.held
    }
}
