//! The RFC 8797 connection message: what each side offers in the connect
//! request and the accept, and what follows for the connection.
//!
//! # Policies
//! - We send one inline threshold for both directions, rounded down to
//!   what the message can carry (1 KiB .. 256 KiB in 1 KiB steps): our
//!   receive buffers and send buffers are that size.
//! - Our send threshold is the smaller of the peer's receive size and our
//!   own; our receive threshold is our own. A peer without the message
//!   (or with a foreign one) gets the RFC 8166 default of 1 KiB each way
//!   and no remote invalidation (RFC 8797 §4).
//! - A requester offers to accept Send With Invalidate only when its
//!   registrations can be invalidated by the peer (memory windows: a
//!   per-RPC `ibv_reg_mr` region or a persistent pool cannot). A
//!   responder never offers it: it exposes no memory.
//! - A responder uses Send With Invalidate only when the requester's
//!   message said it accepts it (the R_key it names is chosen by
//!   [`crate::responder::IncomingCall::invalidate_rkey`]).

use nfsrdma_xdr::rpcrdma::CmPrivate;

/// What one side puts in its connection message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// Our inline threshold, both directions (the size of our receive and
    /// send buffers); rounded down to a representable size.
    pub inline: u32,
    /// We accept Send With Invalidate from the peer.
    pub accept_remote_invalidation: bool,
}

impl Offer {
    /// A responder's offer: `inline` bytes each way, no remote invalidation.
    pub fn responder(inline: u32) -> Offer {
        Offer {
            inline: CmPrivate::representable(inline),
            accept_remote_invalidation: false,
        }
    }

    /// A requester's offer.
    pub fn requester(inline: u32, accept_remote_invalidation: bool) -> Offer {
        Offer {
            inline: CmPrivate::representable(inline),
            accept_remote_invalidation,
        }
    }

    /// The 8-byte message.
    pub fn message(&self) -> [u8; CmPrivate::LEN] {
        CmPrivate {
            remote_invalidation: self.accept_remote_invalidation,
            send_size: self.inline,
            recv_size: self.inline,
        }
        .encode()
    }
}

/// What a connection uses once both messages are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// Largest message we send inline (header included).
    pub inline_send: u32,
    /// Largest message we can receive inline: our receive buffers' size.
    pub inline_recv: u32,
    /// The peer accepts Send With Invalidate from us.
    pub peer_accepts_remote_invalidation: bool,
    /// We offered to accept Send With Invalidate.
    pub we_accept_remote_invalidation: bool,
    /// The peer sent a message of this format.
    pub peer_sent_message: bool,
}

/// Agrees on thresholds from our offer and the peer's private data (absent
/// or foreign data means the RFC 8166 defaults).
pub fn agree(ours: &Offer, peer_private_data: Option<&[u8]>) -> Agreed {
    let sent = peer_private_data.is_some_and(|b| CmPrivate::decode(b).is_ok());
    let peer = CmPrivate::from_peer(peer_private_data);
    Agreed {
        inline_send: peer.recv_size.min(ours.inline),
        inline_recv: ours.inline,
        peer_accepts_remote_invalidation: peer.remote_invalidation,
        we_accept_remote_invalidation: ours.accept_remote_invalidation,
        peer_sent_message: sent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_follow_both_messages() {
        let server = Offer::responder(4096);
        let client = Offer::requester(16 * 1024, true);
        let at_server = agree(&server, Some(&client.message()));
        assert_eq!(at_server.inline_send, 4096, "our buffers are 4 KiB");
        assert_eq!(at_server.inline_recv, 4096);
        assert!(at_server.peer_accepts_remote_invalidation);
        let at_client = agree(&client, Some(&server.message()));
        assert_eq!(at_client.inline_send, 4096, "the server receives 4 KiB");
        assert_eq!(at_client.inline_recv, 16 * 1024);
        assert!(!at_client.peer_accepts_remote_invalidation);
        assert!(at_client.we_accept_remote_invalidation);
    }

    #[test]
    fn no_message_means_the_rfc_8166_defaults() {
        let ours = Offer::responder(8192);
        for peer in [None, Some(&b"garbage!"[..]), Some(&b"\xf6\xab"[..])] {
            let a = agree(&ours, peer);
            assert_eq!(a.inline_send, 1024);
            assert!(!a.peer_accepts_remote_invalidation);
            assert!(!a.peer_sent_message);
        }
    }

    #[test]
    fn sizes_round_down_to_what_the_message_carries() {
        assert_eq!(Offer::responder(5000).inline, 4096);
        assert_eq!(Offer::responder(1 << 20).inline, 256 * 1024);
        assert_eq!(Offer::responder(100).inline, 1024);
    }
}
