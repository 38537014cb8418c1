//! The server's calls to its client in the backward direction of an
//! RPC-over-RDMA connection (RFC 8167): NFSv4.1 callbacks on the
//! connection the client bound to its session's backchannel.
//!
//! RFC 8167 §4 allows only one shape in this direction: an RDMA_MSG whose
//! three chunk lists are empty, the whole RPC message inline, in both the
//! call and its reply; the transport XID is the RPC XID. A call that does
//! not fit the client's receive size is not sent (the backchannel fails
//! it: its sender finds the path down), and its reply must fit ours, so
//! no chunk is ever offered. Credits for these calls are the client's
//! grant in its backward replies, kept by the connection core apart from
//! the credits we grant for forward calls.

use bytes::Bytes;
use nfsrdma_rpcrdma::conn::Config;
use nfsrdma_rpcrdma::requester::{
    plan_call, CallPlan, CallShape, Reply, ReplyExpect, ReplyMessage, RequesterConfig,
};

/// How the RPC call message `parts` travels as a backward call: inline,
/// its reply inline; `None` when it cannot (too large for the client's
/// receive size, or too short to carry an XID).
pub fn plan(parts: Vec<Bytes>, cfg: &Config) -> Option<CallPlan> {
    let mut head = [0u8; 4];
    let mut got = 0;
    for p in &parts {
        let n = (4 - got).min(p.len());
        head[got..got + n].copy_from_slice(&p[..n]);
        got += n;
        if got == 4 {
            break;
        }
    }
    if got < 4 {
        return None;
    }
    let rc = RequesterConfig {
        inline_send: cfg.inline_send,
        inline_recv: cfg.inline_recv,
    };
    // The reply must come inline: expecting no more than our receive size
    // offers no Reply chunk.
    let expect = ReplyExpect {
        max_len: cfg.inline_recv,
        ddp_max: None,
    };
    let plan = plan_call(u32::from_be_bytes(head), &rc, expect, &|s| {
        for p in &parts {
            s.put_raw(p);
        }
    });
    (plan.shape == CallShape::Inline
        && plan.read.is_none()
        && plan.write_chunk.is_none()
        && plan.reply_chunk.is_none())
    .then_some(plan)
}

/// The RPC reply message of a backward call's reply; `None` for an
/// RDMA_ERROR (or no reply).
pub fn reply_message(reply: Option<Reply>) -> Option<Bytes> {
    match reply? {
        Reply::Message {
            message: ReplyMessage::Inline(m),
            ..
        } => Some(m),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfsrdma_rpcrdma::requester::{parse_reply, Registrations};
    use nfsrdma_xdr::rpcrdma::{ChunkLists, RdmaBody, RdmaError, RdmaHeader};
    use nfsrdma_xdr::{Decoder, List, Xdr};

    fn cfg(inline: u32) -> Config {
        Config {
            inline_send: inline,
            inline_recv: inline,
            ..Config::default()
        }
    }

    /// A call message of `len` bytes with XID `xid`, split in two parts
    /// after `split` bytes.
    fn call(xid: u32, len: usize, split: usize) -> Vec<Bytes> {
        let mut m = vec![0xabu8; len];
        m[..4].copy_from_slice(&xid.to_be_bytes());
        let b = Bytes::from(m);
        vec![b.slice(..split), b.slice(split..)]
    }

    #[test]
    fn a_call_goes_inline_with_a_bare_header_naming_its_xid() {
        let p = plan(call(0x1234_5678, 200, 2), &cfg(1024)).expect("fits");
        assert_eq!(p.xid, 0x1234_5678, "the XID across two parts");
        let header = p.header(4, &Registrations::default());
        let h = RdmaHeader::decode(&mut Decoder::new(header.clone())).unwrap();
        assert_eq!(h.xid, 0x1234_5678);
        assert_eq!(h.credit, 4);
        assert_eq!(
            h.body,
            RdmaBody::Msg(ChunkLists {
                read_list: List(vec![]),
                write_list: List(vec![]),
                reply_chunk: None,
            })
        );
        assert_eq!(header.len() as u32, super::super::worker::BARE_HEADER);
        let inline: Vec<u8> = p.inline.iter().flat_map(|b| b.to_vec()).collect();
        let whole: Vec<u8> = call(0x1234_5678, 200, 2)
            .iter()
            .flat_map(|b| b.to_vec())
            .collect();
        assert_eq!(inline, whole, "the message follows the header as it is");
    }

    #[test]
    fn a_call_that_does_not_fit_the_clients_receives_is_not_sent() {
        let limit = 1024 - super::super::worker::BARE_HEADER as usize;
        assert!(plan(call(1, limit, 10), &cfg(1024)).is_some());
        assert!(plan(call(1, limit + 1, 10), &cfg(1024)).is_none());
        assert!(plan(vec![Bytes::from_static(&[1, 2, 3])], &cfg(1024)).is_none());
    }

    #[test]
    fn an_inline_reply_is_handed_over_and_an_error_is_not() {
        let p = plan(call(9, 100, 50), &cfg(1024)).unwrap();
        let mut m = RdmaHeader {
            xid: 9,
            vers: 1,
            credit: 16,
            body: RdmaBody::Msg(ChunkLists {
                read_list: List(vec![]),
                write_list: List(vec![]),
                reply_chunk: None,
            }),
        }
        .to_bytes()
        .to_vec();
        m.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 1]);
        let r = parse_reply(Bytes::from(m), &p).unwrap();
        assert_eq!(
            reply_message(Some(r)).as_deref(),
            Some(&[0u8, 0, 0, 9, 0, 0, 0, 1][..])
        );
        let e = RdmaHeader {
            xid: 9,
            vers: 1,
            credit: 16,
            body: RdmaBody::Error(RdmaError::Chunk),
        }
        .to_bytes();
        let r = parse_reply(e, &p).unwrap();
        assert_eq!(reply_message(Some(r)), None);
        assert_eq!(reply_message(None), None);
    }
}
