//! The responder's side of RPC-over-RDMA version 1: what to do with a
//! received message, and how to send a reply.
//!
//! # Policies (where RFC 8166 leaves a choice)
//! - Faults RFC 8166 §4.5 names are answered with RDMA_ERROR: an unknown
//!   `rdma_vers` with ERR_VERS (1..1); RDMA_MSGP, an unknown procedure, an
//!   undecodable header, RDMA_NOMSG without a Position-Zero Read chunk,
//!   misaligned or out-of-order positions, a position past the end of the
//!   inline message, an empty Write or Reply chunk, a segment whose offset
//!   plus length does not fit in 64 bits, or more chunk data than the
//!   largest call with ERR_CHUNK. Messages shorter than the fixed 16
//!   bytes, or shorter than the 28 bytes of a version 1 header, RDMA_DONE
//!   and RDMA_ERROR from a requester are dropped silently.
//! - One Read chunk at a non-zero position is accepted per call (NFSv3 has
//!   one DDP-eligible item per call: WRITE data or the SYMLINK path), plus
//!   at most one Position-Zero Read chunk. More is ERR_CHUNK.
//! - A reply that fits the peer's inline threshold is sent inline even when
//!   the requester offered a Reply chunk (no RDMA Write needed); the unused
//!   Reply chunk is then not echoed. Otherwise it goes in the Reply chunk as
//!   RDMA_NOMSG, or, without one, the reply is ERR_CHUNK.
//! - The first DDP-eligible item of a reply (READ data, the READLINK path)
//!   goes into the first Write chunk when the requester offered one; the
//!   Write list is echoed with the lengths written, unused chunks with zero
//!   lengths (§4.3.2).
//! - Send With Invalidate, as the Linux server does it: only when the
//!   requester's private message (RFC 8797) says it accepts it, and only
//!   when every segment of the call (Read list, Write list, Reply chunk)
//!   carries the same R_key, which is then invalidated.

use crate::chunk::{fill_chunk, unused_chunk, WriteOp};
use crate::reduce::ReducingSink;
use bytes::Bytes;
use nfsrdma_xdr::rpcrdma::{
    proc_, ChunkLists, FixedHeader, RdmaBody, RdmaError, RdmaHeader, RdmaSegment, WriteChunk,
    MIN_HEADER_LEN, RPCRDMA_VERSION,
};
use nfsrdma_xdr::{Decoder, List, Payload, Xdr, XdrSink};

/// The responder's settings for one connection.
#[derive(Debug, Clone)]
pub struct ResponderConfig {
    /// Largest message the requester can receive inline (its receive
    /// threshold, from its RFC 8797 message or 1024).
    pub inline_send: u32,
    /// The size of our receive buffers.
    pub inline_recv: u32,
    /// Credits granted in every reply (never zero).
    pub credits: u32,
    /// The requester accepts Send With Invalidate.
    pub remote_invalidation: bool,
    /// Largest call message (or Read chunk) assembled from chunks.
    pub max_call: u64,
}

impl Default for ResponderConfig {
    fn default() -> Self {
        ResponderConfig {
            inline_send: 4096,
            inline_recv: 4096,
            credits: 128,
            remote_invalidation: false,
            max_call: (1 << 20) + 64 * 1024,
        }
    }
}

/// The RDMA_ERROR faults, for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// ERR_VERS.
    Vers,
    /// ERR_CHUNK, with what was wrong.
    Chunk(&'static str),
}

/// What to do with a received message.
#[derive(Debug)]
pub enum Received {
    /// A call to assemble (maybe after RDMA Reads) and execute.
    Call(IncomingCall),
    /// Drop it without a reply.
    Discard(&'static str),
    /// Send this RDMA_ERROR message and nothing else.
    Error {
        /// The encoded RDMA_ERROR transport header.
        reply: Bytes,
        /// Why.
        fault: Fault,
    },
}

/// One Read chunk: segments sharing a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadChunk {
    /// XDR position of the chunk's data in the call message.
    pub position: u32,
    /// The segments to read, in order.
    pub segments: Vec<RdmaSegment>,
}

impl ReadChunk {
    /// Bytes the chunk holds.
    pub fn total_len(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// A call that passed the transport checks.
#[derive(Debug, Clone)]
pub struct IncomingCall {
    /// `rdma_xid`.
    pub xid: u32,
    /// Credits the requester asked for.
    pub credits_requested: u32,
    /// The call message as received inline (empty for RDMA_NOMSG).
    pub inline: Bytes,
    /// Read chunks, by ascending position (at most a Position-Zero chunk
    /// and one more).
    pub read_chunks: Vec<ReadChunk>,
    /// The Write list.
    pub write_list: Vec<WriteChunk>,
    /// The Reply chunk.
    pub reply_chunk: Option<WriteChunk>,
}

/// A failure to assemble a call from its chunks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// The chunk data does not match the Read list.
    #[error("chunk data does not match the Read list: {0}")]
    Mismatch(&'static str),
}

/// The encoded RDMA_ERROR message for `xid`.
pub fn error_reply(xid: u32, credits: u32, err: RdmaError) -> Bytes {
    RdmaHeader {
        xid,
        vers: RPCRDMA_VERSION,
        credit: credits.max(1),
        body: RdmaBody::Error(err),
    }
    .to_bytes()
}

fn chunk_error(xid: u32, cfg: &ResponderConfig, why: &'static str) -> Received {
    Received::Error {
        reply: error_reply(xid, cfg.credits, RdmaError::Chunk),
        fault: Fault::Chunk(why),
    }
}

/// Classifies a received message against this connection's settings.
pub fn receive(buf: Bytes, cfg: &ResponderConfig) -> Received {
    let Some(fixed) = FixedHeader::peek(&buf) else {
        return Received::Discard("shorter than the fixed header");
    };
    if fixed.vers != RPCRDMA_VERSION {
        return Received::Error {
            reply: error_reply(
                fixed.xid,
                cfg.credits,
                RdmaError::Vers {
                    low: RPCRDMA_VERSION,
                    high: RPCRDMA_VERSION,
                },
            ),
            fault: Fault::Vers,
        };
    }
    if buf.len() < MIN_HEADER_LEN {
        return Received::Discard("shorter than a version 1 header");
    }
    match fixed.proc_ {
        proc_::RDMA_MSG | proc_::RDMA_NOMSG => {}
        proc_::RDMA_DONE => return Received::Discard("RDMA_DONE"),
        proc_::RDMA_ERROR => return Received::Discard("RDMA_ERROR sent by a requester"),
        proc_::RDMA_MSGP => return chunk_error(fixed.xid, cfg, "RDMA_MSGP"),
        _ => return chunk_error(fixed.xid, cfg, "unknown procedure"),
    }
    let mut d = Decoder::new(buf);
    let h = match RdmaHeader::decode(&mut d) {
        Ok(h) => h,
        Err(_) => return chunk_error(fixed.xid, cfg, "undecodable header"),
    };
    let (nomsg, chunks) = match h.body {
        RdmaBody::Msg(c) => (false, c),
        RdmaBody::Nomsg(c) => (true, c),
        _ => unreachable!("procedure checked above"),
    };
    let inline = d.into_rest();
    if nomsg && !inline.is_empty() {
        return chunk_error(h.xid, cfg, "RDMA_NOMSG with inline data");
    }
    // No memory of the peer's ends past the last address: a segment whose
    // end does not fit in 64 bits is garbage. Refused here, every address
    // computed inside a segment later (RDMA Reads and Writes split at SGE
    // limits) is in range.
    let segments = (chunks.read_list.0.iter().map(|s| &s.target))
        .chain(chunks.write_list.0.iter().flat_map(|w| &w.segments.0))
        .chain(chunks.reply_chunk.iter().flat_map(|r| &r.segments.0));
    for seg in segments {
        if seg.offset.checked_add(u64::from(seg.length)).is_none() {
            return chunk_error(h.xid, cfg, "segment ends past the address space");
        }
    }

    // Group the Read list into chunks: consecutive segments with one position.
    let mut read_chunks: Vec<ReadChunk> = Vec::new();
    for seg in &chunks.read_list.0 {
        if seg.position % 4 != 0 {
            return chunk_error(h.xid, cfg, "misaligned Read chunk position");
        }
        match read_chunks.last_mut() {
            Some(c) if c.position == seg.position => c.segments.push(seg.target),
            Some(c) if c.position > seg.position => {
                return chunk_error(h.xid, cfg, "Read chunks out of position order")
            }
            _ => read_chunks.push(ReadChunk {
                position: seg.position,
                segments: vec![seg.target],
            }),
        }
    }
    let has_pz = read_chunks.first().is_some_and(|c| c.position == 0);
    if nomsg != has_pz {
        return chunk_error(
            h.xid,
            cfg,
            if nomsg {
                "RDMA_NOMSG without a Position-Zero Read chunk"
            } else {
                "Position-Zero Read chunk in RDMA_MSG"
            },
        );
    }
    if read_chunks.len() > 1 + usize::from(has_pz) {
        return chunk_error(h.xid, cfg, "more Read chunks than one DDP item");
    }
    let mut total = 0u64;
    for c in &read_chunks {
        if c.total_len() == 0 {
            return chunk_error(h.xid, cfg, "empty Read chunk");
        }
        total += c.total_len();
    }
    if total > cfg.max_call {
        return chunk_error(h.xid, cfg, "Read chunks larger than the largest call");
    }
    if !has_pz {
        if let Some(c) = read_chunks.first() {
            if c.position as usize > inline.len() || c.position < 4 {
                return chunk_error(h.xid, cfg, "Read chunk position past the end");
            }
        }
    }
    if chunks.write_list.0.iter().any(|w| w.segments.0.is_empty()) {
        return chunk_error(h.xid, cfg, "Write chunk without segments");
    }
    if chunks
        .reply_chunk
        .as_ref()
        .is_some_and(|r| r.segments.0.is_empty())
    {
        return chunk_error(h.xid, cfg, "Reply chunk without segments");
    }
    Received::Call(IncomingCall {
        xid: h.xid,
        credits_requested: h.credit,
        inline,
        read_chunks,
        write_list: chunks.write_list.0,
        reply_chunk: chunks.reply_chunk,
    })
}

impl IncomingCall {
    /// True when the call needs RDMA Reads before it can be decoded.
    pub fn needs_reads(&self) -> bool {
        !self.read_chunks.is_empty()
    }

    /// Bytes the first Write chunk can take: the most READ data (or
    /// READLINK path) this reply may carry by direct placement.
    pub fn write_budget(&self) -> Option<u64> {
        self.write_list.first().map(WriteChunk::total_len)
    }

    /// The R_key to invalidate with Send With Invalidate, if the policy in
    /// the module documentation allows one.
    pub fn invalidate_rkey(&self, cfg: &ResponderConfig) -> Option<u32> {
        if !cfg.remote_invalidation {
            return None;
        }
        let mut keys = self
            .read_chunks
            .iter()
            .flat_map(|c| c.segments.iter())
            .chain(self.write_list.iter().flat_map(|w| w.segments.0.iter()))
            .chain(self.reply_chunk.iter().flat_map(|r| r.segments.0.iter()))
            .map(|s| s.handle);
        let first = keys.next()?;
        keys.all(|k| k == first).then_some(first)
    }

    /// The call message as a decoder, given the data of each Read chunk (in
    /// the order of [`IncomingCall::read_chunks`]). A DDP item in a chunk is
    /// returned by the decoder's `payload()` without copying; XDR padding a
    /// requester left on it is dropped.
    pub fn assemble(&self, chunk_data: Vec<Payload>) -> Result<Decoder, AssembleError> {
        if chunk_data.len() != self.read_chunks.len() {
            return Err(AssembleError::Mismatch("number of chunks"));
        }
        for (c, d) in self.read_chunks.iter().zip(&chunk_data) {
            if c.total_len() != d.len() as u64 {
                return Err(AssembleError::Mismatch("chunk length"));
            }
        }
        let mut data = chunk_data.into_iter();
        let mut chunks = self.read_chunks.iter();
        let stream = if self.read_chunks.first().is_some_and(|c| c.position == 0) {
            chunks.next();
            data.next().expect("checked").to_contiguous()
        } else {
            self.inline.clone()
        };
        let Some(c) = chunks.next() else {
            return Ok(Decoder::new(stream));
        };
        let item = data.next().expect("checked");
        let pos = c.position as usize;
        if pos < 4 || pos > stream.len() {
            return Err(AssembleError::Mismatch("position past the end"));
        }
        let declared =
            u32::from_be_bytes(stream[pos - 4..pos].try_into().expect("4 bytes")) as usize;
        let item = if item.len() > declared && item.len() == nfsrdma_xdr::roundup(declared) {
            item.slice(0..declared)
        } else {
            item
        };
        Ok(Decoder::with_ddp(stream, pos, item))
    }
}

/// Why an assembled call is answered with ERR_CHUNK instead of being run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallHeaderError {
    /// The RPC header does not decode.
    #[error("the RPC header does not decode")]
    Undecodable,
    /// The RPC XID is not the transport header's `rdma_xid`.
    #[error("RPC XID {rpc:#x} differs from rdma_xid {rdma:#x}")]
    XidMismatch {
        /// The transport header's XID.
        rdma: u32,
        /// The RPC header's XID.
        rpc: u32,
    },
    /// A REPLY where a call was expected.
    #[error("an RPC reply where a call was expected")]
    NotACall,
}

/// Decodes the RPC header of an assembled call and checks it against the
/// transport header: RFC 8166 §4.1 has `rdma_xid` equal the RPC XID, and a
/// message where they differ (or whose RPC header does not decode, or is a
/// reply) is a transport fault answered with ERR_CHUNK. Leaves `d` at the
/// procedure's arguments.
pub fn call_header(
    d: &mut Decoder,
    rdma_xid: u32,
) -> Result<nfsrdma_xdr::rpc::CallBody, CallHeaderError> {
    use nfsrdma_xdr::rpc::{MessageBody, RpcMessage};
    let h = RpcMessage::decode(d).map_err(|_| CallHeaderError::Undecodable)?;
    if h.xid != rdma_xid {
        return Err(CallHeaderError::XidMismatch {
            rdma: rdma_xid,
            rpc: h.xid,
        });
    }
    match h.body {
        MessageBody::Call(c) => Ok(c),
        MessageBody::Reply(_) => Err(CallHeaderError::NotACall),
    }
}

/// How a reply travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyShape {
    /// RDMA_MSG: the (reduced) reply follows the header in the Send.
    Inline,
    /// RDMA_NOMSG: the reply was written into the Reply chunk.
    ReplyChunk,
}

/// Everything the driver does to send one reply, in order: the RDMA
/// Writes, then one Send of `header` followed by `inline` (with invalidate
/// when `send_with_invalidate` is set).
#[derive(Debug, Clone)]
pub struct ReplyPlan {
    /// The transport header.
    pub header: Bytes,
    /// Bytes sent inline after the header.
    pub inline: Vec<Bytes>,
    /// RDMA Writes into the requester's Write or Reply chunk.
    pub writes: Vec<WriteOp>,
    /// R_key for Send With Invalidate.
    pub send_with_invalidate: Option<u32>,
    /// Inline or Reply chunk.
    pub shape: ReplyShape,
    /// Bytes placed directly into a Write chunk.
    pub ddp_bytes: usize,
}

impl ReplyPlan {
    /// Bytes of the Send (header plus inline part).
    pub fn send_len(&self) -> usize {
        self.header.len() + self.inline.iter().map(Bytes::len).sum::<usize>()
    }

    /// Bytes moved by RDMA Write.
    pub fn write_len(&self) -> usize {
        self.writes.iter().map(|w| w.data.len()).sum()
    }
}

/// Why a reply cannot be sent as encoded (the driver answers ERR_CHUNK).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply does not fit inline and no Reply chunk was offered.
    #[error(
        "reply of {len} bytes exceeds the inline threshold {limit} and no Reply chunk was offered"
    )]
    TooLarge {
        /// Bytes of header plus reply.
        len: usize,
        /// The threshold.
        limit: u32,
    },
    /// The reply does not fit the offered Reply chunk.
    #[error("reply of {len} bytes exceeds the Reply chunk of {chunk} bytes")]
    ReplyChunkTooSmall {
        /// Bytes of the reply.
        len: usize,
        /// Bytes offered.
        chunk: u64,
    },
    /// The DDP item does not fit the first Write chunk.
    #[error("{len} bytes of data exceed the Write chunk of {chunk} bytes")]
    WriteChunkTooSmall {
        /// Bytes of data.
        len: usize,
        /// Bytes offered.
        chunk: u64,
    },
}

/// Plans the reply to `call`: `encode` writes the RPC reply message into
/// the sink it is given.
pub fn plan_reply(
    call: &IncomingCall,
    cfg: &ResponderConfig,
    encode: impl FnOnce(&mut dyn XdrSink),
) -> Result<ReplyPlan, ReplyError> {
    let mut sink = ReducingSink::new(!call.write_list.is_empty());
    encode(&mut sink);
    let (stream, moved) = sink.finish();
    let mut writes = Vec::new();
    let mut ddp_bytes = 0;
    let mut echo: Vec<WriteChunk> = call.write_list.iter().map(unused_chunk).collect();
    if let Some((_, data)) = &moved {
        let first = &call.write_list[0];
        let (ops, used) = fill_chunk(first, data).ok_or(ReplyError::WriteChunkTooSmall {
            len: data.len(),
            chunk: first.total_len(),
        })?;
        writes.extend(ops);
        echo[0] = used;
        ddp_bytes = data.len();
    }
    let stream_len: usize = stream.iter().map(Bytes::len).sum();
    let header_for = |reply_chunk: Option<WriteChunk>, nomsg: bool| {
        let lists = ChunkLists {
            read_list: List(vec![]),
            write_list: List(echo.clone()),
            reply_chunk,
        };
        RdmaHeader {
            xid: call.xid,
            vers: RPCRDMA_VERSION,
            credit: cfg.credits.max(1),
            body: if nomsg {
                RdmaBody::Nomsg(lists)
            } else {
                RdmaBody::Msg(lists)
            },
        }
    };
    let send_with_invalidate = call.invalidate_rkey(cfg);
    let inline_header = header_for(None, false);
    if inline_header.encoded_len() + stream_len <= cfg.inline_send as usize {
        return Ok(ReplyPlan {
            header: inline_header.to_bytes(),
            inline: stream,
            writes,
            send_with_invalidate,
            shape: ReplyShape::Inline,
            ddp_bytes,
        });
    }
    let Some(rc) = &call.reply_chunk else {
        return Err(ReplyError::TooLarge {
            len: inline_header.encoded_len() + stream_len,
            limit: cfg.inline_send,
        });
    };
    let message = Payload::from_parts(stream);
    let (ops, used) = fill_chunk(rc, &message).ok_or(ReplyError::ReplyChunkTooSmall {
        len: message.len(),
        chunk: rc.total_len(),
    })?;
    writes.extend(ops);
    Ok(ReplyPlan {
        header: header_for(Some(used), true).to_bytes(),
        inline: Vec::new(),
        writes,
        send_with_invalidate,
        shape: ReplyShape::ReplyChunk,
        ddp_bytes,
    })
}
