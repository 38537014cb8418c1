//! The requester's side of RPC-over-RDMA version 1: how a call travels and
//! what its reply needs, the call header, and the reply header's meaning.
//!
//! # Policies (as the Linux client does it)
//! - A call that fits the responder's inline threshold goes inline
//!   (RDMA_MSG).
//! - Otherwise, when the call has a DDP-eligible item (WRITE data, the
//!   SYMLINK path) and the call without it fits, the item travels in a Read
//!   chunk at its XDR position, without padding (RDMA_MSG).
//! - Otherwise the whole call travels in a Position-Zero Read chunk
//!   (RDMA_NOMSG, a "long call").
//! - A reply that may not fit our receive buffers gets a Write chunk for
//!   its DDP-eligible item when it has one (READ data, the READLINK path),
//!   else a Reply chunk sized for the largest reply.

use crate::reduce::{ReducingSink, SizingSink};
use bytes::Bytes;
use nfsrdma_xdr::rpcrdma::{
    ChunkLists, FixedHeader, RdmaBody, RdmaError, RdmaHeader, RdmaSegment, ReadSegment, WriteChunk,
    RPCRDMA_VERSION,
};
use nfsrdma_xdr::{Decoder, IoVecSink, List, Payload, Xdr, XdrSink};

/// The requester's settings for one connection.
#[derive(Debug, Clone)]
pub struct RequesterConfig {
    /// Largest message the responder receives inline (its receive
    /// threshold, from its RFC 8797 message or 1024).
    pub inline_send: u32,
    /// The size of our receive buffers.
    pub inline_recv: u32,
}

impl Default for RequesterConfig {
    fn default() -> Self {
        RequesterConfig {
            inline_send: 4096,
            inline_recv: 4096,
        }
    }
}

/// What the caller knows of the reply before sending the call (which
/// sizes the Write chunk for READ data and the Reply chunk for large
/// replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyExpect {
    /// Upper bound of the whole reply message (RPC header included),
    /// DDP item included.
    pub max_len: u32,
    /// Upper bound of the reply's DDP-eligible item, if it has one (READ:
    /// the count asked for; READLINK: the longest path).
    pub ddp_max: Option<u32>,
}

impl ReplyExpect {
    /// Room for the largest RPC reply header (a 400-byte verifier).
    pub const HEADER: u32 = 512;

    /// A reply with no DDP-eligible item, whose results take at most
    /// `results` bytes.
    pub const fn small(results: u32) -> ReplyExpect {
        ReplyExpect {
            max_len: Self::HEADER + results,
            ddp_max: None,
        }
    }

    /// A reply whose results take at most `results` bytes besides a
    /// DDP-eligible item of at most `ddp` bytes.
    pub const fn with_ddp(results: u32, ddp: u32) -> ReplyExpect {
        ReplyExpect {
            max_len: Self::HEADER + results + ddp,
            ddp_max: Some(ddp),
        }
    }
}

/// How the call travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallShape {
    /// RDMA_MSG, all inline.
    Inline,
    /// RDMA_MSG, the DDP item in a Read chunk.
    ReadChunk,
    /// RDMA_NOMSG, the whole call in a Position-Zero Read chunk.
    LongCall,
}

/// How one call and its reply travel.
#[derive(Debug, Clone)]
pub struct CallPlan {
    /// The XID.
    pub xid: u32,
    /// How the call travels.
    pub shape: CallShape,
    /// Bytes sent inline after the header (empty for a long call).
    pub inline: Vec<Bytes>,
    /// Data the responder will RDMA Read, and its position: register it for
    /// remote read.
    pub read: Option<(u32, Payload)>,
    /// Bytes of memory to register for remote write as the reply's Write
    /// chunk.
    pub write_chunk: Option<u32>,
    /// Bytes of memory to register for remote write as the Reply chunk.
    pub reply_chunk: Option<u32>,
}

/// The registrations made for a plan (their segments, in order).
#[derive(Debug, Clone, Default)]
pub struct Registrations {
    /// Segments covering the Read chunk data.
    pub read: Vec<RdmaSegment>,
    /// Segments of the Write chunk.
    pub write: Vec<RdmaSegment>,
    /// Segments of the Reply chunk.
    pub reply: Vec<RdmaSegment>,
}

/// Plans a call. `encode` writes the RPC call message into the sink it is
/// given (it may be called twice).
pub fn plan_call(
    xid: u32,
    cfg: &RequesterConfig,
    expect: ReplyExpect,
    encode: &dyn Fn(&mut dyn XdrSink),
) -> CallPlan {
    let (write_chunk, reply_chunk) = if expect.max_len <= cfg.inline_recv {
        (None, None)
    } else if let Some(d) = expect.ddp_max.filter(|d| *d > 0) {
        (Some(d), None)
    } else {
        (None, Some(expect.max_len))
    };
    let header_len =
        |read: bool| call_header_len(read, write_chunk.is_some(), reply_chunk.is_some());
    let limit = cfg.inline_send as usize;
    // Sized first, then gathered once into a buffer of that size.
    let mut size = SizingSink::default();
    encode(&mut size);
    let full_len = size.full_len();
    let plan = |shape, inline, read| CallPlan {
        xid,
        shape,
        inline,
        read,
        write_chunk,
        reply_chunk,
    };
    if header_len(false) + full_len <= limit {
        let mut s = IoVecSink::with_capacity(full_len);
        encode(&mut s);
        return plan(CallShape::Inline, s.into_parts(), None);
    }
    if size.has_item() && header_len(true) + size.reduced_len() <= limit {
        let mut reduced = ReducingSink::with_capacity(true, size.reduced_len());
        encode(&mut reduced);
        let (parts, moved) = reduced.finish();
        let (pos, data) = moved.expect("sized with an item");
        return plan(CallShape::ReadChunk, parts, Some((pos as u32, data)));
    }
    // (Its payloads go by reference: room for the rest is enough.)
    let mut s = IoVecSink::with_capacity(full_len.min(limit));
    encode(&mut s);
    plan(
        CallShape::LongCall,
        Vec::new(),
        Some((0, Payload::from_parts(s.into_parts()))),
    )
}

/// The encoded length of an RDMA_MSG call header with at most one segment
/// in each of its chunks (what [`plan_header`] builds for one), worked out
/// without building it: the fixed words (XID, version, credits, procedure),
/// a Read list of one segment (a discriminator, the position, the segment)
/// or none, then its terminator; a Write list of one chunk of one segment
/// (a discriminator, the count, the segment) or none, then its
/// terminator; a Reply chunk (a discriminator, the count, the segment) or
/// its absence.
fn call_header_len(read: bool, write: bool, reply: bool) -> usize {
    const SEGMENT: usize = 16;
    let read = if read { 4 + 4 + SEGMENT } else { 0 };
    let write = if write { 4 + 4 + SEGMENT } else { 0 };
    let reply = if reply { 4 + 4 + SEGMENT } else { 4 };
    16 + read + 4 + write + 4 + reply
}

impl CallPlan {
    /// The call's transport header once its memory is registered.
    /// `credits` is the number of credits asked for.
    pub fn header(&self, credits: u32, regs: &Registrations) -> Bytes {
        let read_list = match &self.read {
            Some((position, _)) => regs
                .read
                .iter()
                .map(|s| ReadSegment {
                    position: *position,
                    target: *s,
                })
                .collect(),
            None => Vec::new(),
        };
        let lists = ChunkLists {
            read_list: List(read_list),
            write_list: List(
                self.write_chunk
                    .map(|_| WriteChunk::new(regs.write.clone()))
                    .into_iter()
                    .collect(),
            ),
            reply_chunk: self
                .reply_chunk
                .map(|_| WriteChunk::new(regs.reply.clone())),
        };
        RdmaHeader {
            xid: self.xid,
            vers: RPCRDMA_VERSION,
            credit: credits.max(1),
            body: if self.shape == CallShape::LongCall {
                RdmaBody::Nomsg(lists)
            } else {
                RdmaBody::Msg(lists)
            },
        }
        .to_bytes()
    }
}

/// Where the reply's RPC message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyMessage {
    /// Inline after the header.
    Inline(Bytes),
    /// In our Reply chunk memory, this many bytes.
    InReplyChunk(u32),
}

/// A parsed reply header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An RPC reply.
    Message {
        /// Credits granted (a zero grant is read as one).
        credits: u32,
        /// Where the RPC reply message is.
        message: ReplyMessage,
        /// Bytes the responder wrote into our Write chunk.
        written: Option<u32>,
    },
    /// RDMA_ERROR.
    Error {
        /// Credits granted.
        credits: u32,
        /// The error.
        error: RdmaError,
    },
}

/// A reply header that breaks the protocol (the connection should go).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyHeaderError {
    /// Too short or undecodable.
    #[error("malformed reply header: {0}")]
    Malformed(String),
    /// Inconsistent with the call.
    #[error("reply header inconsistent with the call: {0}")]
    Inconsistent(&'static str),
}

/// The XID of a received reply, to find its call.
pub fn reply_xid(buf: &[u8]) -> Option<u32> {
    FixedHeader::peek(buf).map(|f| f.xid)
}

/// Parses a reply to `plan`'s call.
pub fn parse_reply(buf: Bytes, plan: &CallPlan) -> Result<Reply, ReplyHeaderError> {
    let mut d = Decoder::new(buf);
    let h = RdmaHeader::decode(&mut d).map_err(|e| ReplyHeaderError::Malformed(e.to_string()))?;
    if h.xid != plan.xid {
        return Err(ReplyHeaderError::Inconsistent("XID"));
    }
    let credits = h.credit.max(1);
    let (nomsg, lists) = match h.body {
        RdmaBody::Msg(l) => (false, l),
        RdmaBody::Nomsg(l) => (true, l),
        RdmaBody::Error(error) => return Ok(Reply::Error { credits, error }),
        RdmaBody::Msgp(_) | RdmaBody::Done => {
            return Err(ReplyHeaderError::Inconsistent("procedure"))
        }
    };
    if !lists.read_list.0.is_empty() {
        return Err(ReplyHeaderError::Inconsistent("Read list in a reply"));
    }
    let written = match (plan.write_chunk, lists.write_list.0.as_slice()) {
        (None, []) => None,
        (Some(offered), [w]) => {
            let n = w.total_len();
            if n > u64::from(offered) {
                return Err(ReplyHeaderError::Inconsistent("more written than offered"));
            }
            Some(n as u32)
        }
        _ => return Err(ReplyHeaderError::Inconsistent("Write list")),
    };
    let message = if nomsg {
        let (Some(offered), Some(rc)) = (plan.reply_chunk, lists.reply_chunk) else {
            return Err(ReplyHeaderError::Inconsistent(
                "RDMA_NOMSG without a Reply chunk",
            ));
        };
        let n = rc.total_len();
        if n > u64::from(offered) {
            return Err(ReplyHeaderError::Inconsistent("Reply chunk overrun"));
        }
        ReplyMessage::InReplyChunk(n as u32)
    } else {
        if lists
            .reply_chunk
            .as_ref()
            .is_some_and(|r| r.total_len() > 0)
        {
            return Err(ReplyHeaderError::Inconsistent(
                "RDMA_MSG with a used Reply chunk",
            ));
        }
        ReplyMessage::Inline(d.into_rest())
    };
    Ok(Reply::Message {
        credits,
        message,
        written,
    })
}

/// The RPC reply message as a decoder: `message` is the reply (inline or
/// read from the Reply chunk), `ddp` the bytes written into the Write
/// chunk, which the decoder hands out at the reply's DDP-eligible item.
pub fn reply_decoder(message: Bytes, ddp: Option<Payload>) -> Decoder {
    match ddp {
        Some(d) if !d.is_empty() => Decoder::with_ddp_first(message, d),
        _ => Decoder::new(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: RdmaSegment = RdmaSegment {
        handle: 0,
        length: 0,
        offset: 0,
    };

    fn plan_header(
        xid: u32,
        credits: u32,
        read: Option<u32>,
        write: Option<WriteChunk>,
        reply: Option<WriteChunk>,
        nomsg: bool,
    ) -> RdmaHeader {
        let lists = ChunkLists {
            read_list: List(
                read.map(|position| {
                    vec![ReadSegment {
                        position,
                        target: SEG,
                    }]
                })
                .unwrap_or_default(),
            ),
            write_list: List(write.into_iter().collect()),
            reply_chunk: reply,
        };
        RdmaHeader {
            xid,
            vers: RPCRDMA_VERSION,
            credit: credits,
            body: if nomsg {
                RdmaBody::Nomsg(lists)
            } else {
                RdmaBody::Msg(lists)
            },
        }
    }

    #[test]
    fn the_worked_out_call_header_length_is_the_encoded_one() {
        let seg = |on: bool| on.then(|| WriteChunk::new(vec![SEG]));
        for bits in 0..8u8 {
            let (read, write, reply) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            let h = plan_header(7, 1, read.then_some(4), seg(write), seg(reply), false);
            assert_eq!(
                call_header_len(read, write, reply),
                h.encoded_len(),
                "read {read} write {write} reply {reply}"
            );
        }
    }
}
