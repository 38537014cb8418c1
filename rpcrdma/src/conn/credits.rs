//! Credits (RFC 8166 §3.3): how many calls the requester may have
//! outstanding.
//!
//! # Policies
//! - The grant is fixed for the connection: the number of receive buffers
//!   posted for calls ([`super::Config::credits`]), sent in every reply
//!   and RDMA_ERROR, never zero. The requester's ask (`rdma_credit` in its
//!   calls) does not change it: the buffers are posted once, and a grant
//!   above them would invite Sends that find no receive.
//! - A call uses a credit from its arrival until its reply (or RDMA_ERROR)
//!   is posted; dropping it also gives the credit back. A requester that
//!   sends beyond the grant finds no receive posted, since every buffer is
//!   held by one of its calls: its Send waits for receiver-not-ready
//!   retries on its side, and fails there when they run out. Nothing is
//!   queued here for it. Should a call arrive with every credit in use
//!   all the same, the driver posted more receives than credits; the
//!   connection ends (see [`Credits::arrive`]).

/// Credits of the forward direction, responder side.
#[derive(Debug)]
pub struct Credits {
    granted: u32,
    in_use: u32,
}

impl Credits {
    /// `granted` credits (at least one).
    pub fn new(granted: u32) -> Credits {
        Credits {
            granted: granted.max(1),
            in_use: 0,
        }
    }

    /// The grant to put in a reply header.
    pub fn grant(&self) -> u32 {
        self.granted
    }

    /// Credits in use.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// A call arrived. An error when every credit was in use already.
    pub fn arrive(&mut self) -> Result<(), String> {
        if self.in_use >= self.granted {
            return Err(format!(
                "a call arrived with all {} credits in use",
                self.granted
            ));
        }
        self.in_use += 1;
        Ok(())
    }

    /// A call is done with (its reply posted, or dropped).
    pub fn done(&mut self) {
        self.in_use = self.in_use.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_beyond_the_grant_are_refused_and_credits_come_back() {
        let mut c = Credits::new(2);
        assert_eq!(c.grant(), 2);
        c.arrive().unwrap();
        c.arrive().unwrap();
        assert!(c.arrive().is_err());
        c.done();
        c.arrive().unwrap();
        assert_eq!(c.in_use(), 2);
        assert_eq!(Credits::new(0).grant(), 1, "a grant is never zero");
    }
}
