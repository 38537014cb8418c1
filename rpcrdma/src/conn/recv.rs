//! Receive buffers: each is posted, or held by the message it received.
//!
//! RFC 8166 §3.3.1: a responder posts receives before it grants the credits
//! that let a requester send into them. A connection's own buffers are all
//! posted when it starts; a message holds its buffer from its receive
//! completion until it is done with (its reply or RDMA_ERROR is posted, or
//! it is dropped), and the buffer is posted again then. The driver may
//! therefore hand the core a message that is a view of the buffer rather
//! than a copy, and must not post it again before the core says so.
//!
//! With a shared receive queue ([`super::Config::shared_receives`]) the
//! buffers are the pool's, posted by the driver, and any of them may
//! complete on this connection: the core then knows only the ones its
//! messages hold, and gives each back to be posted again as above. Once
//! the connection has ended, [`RecvBuffers::held_ids`] are the buffers the
//! driver must return to the pool itself.

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
    /// The connection's own buffers, by number (none when shared).
    state: Vec<State>,
    /// Shared buffers held by messages, by their ids in the pool.
    shared: Option<Vec<u32>>,
    held: u32,
}

impl RecvBuffers {
    /// `n` buffers of the connection's own, all held (the connection posts
    /// them at once).
    pub fn new(n: u32) -> RecvBuffers {
        RecvBuffers {
            state: vec![State::Held; n as usize],
            shared: None,
            held: n,
        }
    }

    /// Buffers of a shared pool: none held yet.
    pub fn shared() -> RecvBuffers {
        RecvBuffers {
            state: Vec::new(),
            shared: Some(Vec::new()),
            held: 0,
        }
    }

    /// Buffer `b` is posted (or, shared, given back to be posted).
    pub fn post(&mut self, b: u32) {
        if let Some(held) = &mut self.shared {
            if let Some(i) = held.iter().position(|h| *h == b) {
                held.swap_remove(i);
                self.held -= 1;
            }
            return;
        }
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
        if let Some(held) = &mut self.shared {
            if held.contains(&b) {
                return Err(format!("shared receive buffer {b} completed while held"));
            }
            held.push(b);
            self.held += 1;
            return Ok(());
        }
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

    /// Buffer `b`, given back to be posted, was not posted after all (the
    /// connection ended first): held again.
    pub fn unpost(&mut self, b: u32) {
        if let Some(held) = &mut self.shared {
            if !held.contains(&b) {
                held.push(b);
                self.held += 1;
            }
            return;
        }
        if let Some(s) = self.state.get_mut(b as usize) {
            if *s == State::Posted {
                *s = State::Held;
                self.held += 1;
            }
        }
    }

    /// Buffers held by messages.
    pub fn held(&self) -> u32 {
        self.held
    }

    /// The held buffers' ids.
    pub fn held_ids(&self) -> Vec<u32> {
        match &self.shared {
            Some(held) => held.clone(),
            None => (0..self.state.len() as u32)
                .filter(|b| self.state[*b as usize] == State::Held)
                .collect(),
        }
    }
}
