//! Credits (RFC 8166 §3.3): how many calls the requester may have
//! outstanding.
//!
//! # Policies
//! - The connection's credits ([`super::Config::credits`]) are the most it
//!   ever grants and the bound it enforces. With receive buffers of its
//!   own they are also the grant, fixed for the connection: the number of
//!   buffers posted for calls, sent in every reply and RDMA_ERROR, never
//!   zero. The requester's ask (`rdma_credit` in its calls) does not
//!   change it: the buffers are posted once, and a grant above them would
//!   invite Sends that find no receive.
//! - On a shared receive queue the driver may lower the grant
//!   ([`Credits::set_grant`]), e.g. to its connections' share of the
//!   queue's buffers, and raise it again up to the credits; never to zero.
//!   Each reply carries the grant in force when it is built. A requester
//!   learns of a lower grant only from a reply, so calls it sent under
//!   the earlier one may still arrive: those are within the credits and
//!   are served; only a call beyond the credits ends the connection.
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
    /// The most ever granted, and the bound on calls held at once.
    limit: u32,
    /// The grant sent in replies now (1..=limit).
    granted: u32,
    in_use: u32,
}

impl Credits {
    /// `credits` credits (at least one), all granted.
    pub fn new(credits: u32) -> Credits {
        let limit = credits.max(1);
        Credits {
            limit,
            granted: limit,
            in_use: 0,
        }
    }

    /// The grant to put in a reply header.
    pub fn grant(&self) -> u32 {
        self.granted
    }

    /// Grants `n` from now on, within 1..=the credits; returns the grant
    /// in force.
    pub fn set_grant(&mut self, n: u32) -> u32 {
        self.granted = n.clamp(1, self.limit);
        self.granted
    }

    /// Credits in use.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// A call arrived. An error when every credit was in use already.
    pub fn arrive(&mut self) -> Result<(), String> {
        if self.in_use >= self.limit {
            return Err(format!(
                "a call arrived with all {} credits in use",
                self.limit
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

    #[test]
    fn a_lowered_grant_stays_within_the_credits_and_calls_sent_before_it_are_served() {
        let mut c = Credits::new(4);
        assert_eq!(c.set_grant(0), 1, "never zero");
        assert_eq!(c.set_grant(9), 4, "never above the credits");
        assert_eq!(c.set_grant(2), 2);
        assert_eq!(c.grant(), 2);
        // The requester may not have seen the lower grant yet: up to the
        // credits arrive and are served; one more is refused.
        for _ in 0..4 {
            c.arrive().unwrap();
        }
        let e = c.arrive().unwrap_err();
        assert!(e.contains("all 4 credits"), "{e}");
    }
}
