//! What a call's data needs from the server: where its Read chunks land,
//! running it, and where its reply's data is.
//!
//! - **Landing.** A call's Read chunks are read straight into arena blocks
//!   (64 KiB each; a head or tail shorter than that in blocks of powers of
//!   two it fills), laid out so that a WRITE's file blocks line up with
//!   landing blocks: the store then takes whole landing blocks (or whole
//!   pages of them) over instead of copying the data.
//! - **Running.** The assembled call's RPC header is checked against the
//!   transport header ([`responder::call_header`]), then the
//!   [`Service`] runs it; a reply that cannot travel as encoded, or a
//!   header at fault, is answered with RDMA_ERROR.
//! - **Reply data.** RDMA Writes send data in arena memory (file blocks)
//!   as it is; anything else (an encoded reply in the Reply chunk) is
//!   copied into arena blocks taken for the reply first (staging), held
//!   until the reply's Send completes. So staging memory is shared by
//!   every connection of the device rather than set aside per connection;
//!   a call copies at most the core's `chunk_size` and a connection at
//!   most that per chunk slot.

use super::conn::Verbs;
use super::RdmaStats;
use crate::service::metrics::CallClass;
use crate::service::{Begun, CallContext, LongCall, Reply, Service};
use crate::store::blocks::{Block, LandingBlocks};
use bytes::Bytes;
use nfsrdma_rpcrdma::conn::{CallId, Connection, Piece, ReadOp, RemoteSeg};
use nfsrdma_rpcrdma::responder::{self, IncomingCall};
use nfsrdma_transport::rdma::verbs::{PendingRead, RemoteBuf, VerbsError};
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::{Payload, Xdr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A piece of reply data, in arena memory: a file block as it is, or a
/// staging block the data was copied into. An RDMA Write reads it from
/// there; holding it keeps the memory from being reused or written until
/// the Write's Send completes.
#[derive(Debug, Clone)]
pub struct Local(pub Bytes);

impl Piece for Local {
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The landing memory of a call being read: the blocks (lent to the Reads
/// until they complete) and, per Read chunk, the bytes landing in each
/// block it spans.
#[derive(Debug)]
pub struct Landing {
    /// The blocks and the Reads into them.
    pub reads: PendingRead,
    layout: Vec<Vec<usize>>,
}

/// Plans where `call`'s Read chunks land and allocates the blocks: the
/// landing, the Reads in order (block index, offset in the block, the
/// peer's memory) and the bytes of blocks taken. `None` when the arena is
/// exhausted.
pub fn land(
    call: &IncomingCall,
    v: &Verbs,
) -> Result<Option<(Landing, Vec<ReadOp>, u64)>, VerbsError> {
    use crate::store::blocks::BLOCK_SIZE as BLK;
    // A WRITE's data lands so that its file blocks line up with landing
    // blocks: the store can then take whole landing blocks over.
    let skew = write_offset(&call.inline).map_or(0, |o| (o % BLK as u64) as usize);
    // Per landing block, its size and the reads landing in it.
    let mut blocks: Vec<(usize, Vec<(u32, RemoteSeg)>)> = Vec::new();
    let mut layout = Vec::new();
    for c in &call.read_chunks {
        let total = c.total_len() as usize;
        let first = blocks.len();
        let head = if c.position != 0 && skew > 0 {
            BLK - skew
        } else {
            BLK
        };
        let bounds = landing_pieces(total, head);
        for &n in &bounds {
            blocks.push((block_class(n), Vec::new()));
        }
        let mut piece = first;
        let mut in_piece = 0usize;
        for seg in &c.segments {
            let mut done = 0usize;
            while done < seg.length as usize {
                if in_piece == bounds[piece - first] {
                    piece += 1;
                    in_piece = 0;
                }
                let n = (seg.length as usize - done).min(bounds[piece - first] - in_piece);
                blocks[piece].1.push((
                    in_piece as u32,
                    RemoteSeg {
                        rkey: seg.handle,
                        addr: seg.offset + done as u64,
                        len: n as u32,
                    },
                ));
                done += n;
                in_piece += n;
            }
        }
        layout.push(bounds);
    }
    let mut allocated = Vec::with_capacity(blocks.len());
    let mut bytes = 0u64;
    for (size, _) in &blocks {
        match v.arena.alloc(*size)? {
            Some(b) => {
                bytes += b.len() as u64;
                allocated.push(b);
            }
            None => return Ok(None),
        }
    }
    let reads = blocks
        .into_iter()
        .enumerate()
        .flat_map(|(bi, (_, ops))| {
            ops.into_iter().map(move |(offset, remote)| ReadOp {
                block: bi as u32,
                offset,
                remote,
            })
        })
        .collect();
    Ok(Some((
        Landing {
            reads: PendingRead::new(allocated, &v.qp),
            layout,
        },
        reads,
        bytes,
    )))
}

/// Posts one chain of a call's Reads into its landing blocks.
pub fn post_reads(
    l: &mut Landing,
    v: &Verbs,
    reads: &[ReadOp],
    wr: u64,
    quiet: u64,
) -> Result<(), VerbsError> {
    let ops: Vec<(usize, usize, RemoteBuf)> = reads
        .iter()
        .map(|r| {
            (
                r.block as usize,
                r.offset as usize,
                RemoteBuf {
                    addr: r.remote.addr,
                    len: r.remote.len,
                    rkey: r.remote.rkey,
                },
            )
        })
        .collect();
    l.reads.post(&v.qp, &ops, wr, quiet)
}

/// The Read chunks' data once every Read completed, one payload per chunk;
/// the landing blocks travel with it, so that the store can take whole
/// ones over.
pub fn landed(l: Landing) -> Result<Vec<Payload>, VerbsError> {
    let blocks = l
        .reads
        .finish()
        .map_err(|_| VerbsError::InvalidArgument("a call run with its Reads in flight".into()))?;
    let mut blocks = blocks.into_iter();
    let mut data = Vec::with_capacity(l.layout.len());
    for pieces in &l.layout {
        let mut p = Payload::new();
        let mut landing = Vec::with_capacity(pieces.len());
        for &n in pieces {
            let b = blocks
                .next()
                .ok_or_else(|| VerbsError::InvalidArgument("a landing block short".into()))?;
            let block = Block::from_memory(Box::new(b));
            p.push(block.slice(0..n));
            landing.push(block);
        }
        data.push(p.with_attachment(Arc::new(LandingBlocks(landing))));
    }
    Ok(data)
}

/// What [`run`] did with a call.
pub enum Ran {
    /// Answered through the core (or not at all): what its turnaround is
    /// recorded under when a reply went to the core (see
    /// [`crate::service::Reply::class`]).
    Answered(Option<CallClass>),
    /// Begun, and what is left may run long: to be finished off the pool
    /// thread, and its reply given to [`answer`].
    Long(Box<LongCall>),
}

/// Runs a ready call and answers it through the core: the reply, an
/// RDMA_ERROR (its RPC header at fault, or a reply that cannot travel as
/// encoded), or nothing (a retransmission of a call in progress); or
/// hands back what is left of a call that may run long.
pub fn run(
    core: &mut Connection<Local>,
    id: CallId,
    data: Vec<Payload>,
    service: &Service,
    ctx: &CallContext,
    v: &Verbs,
    stats: &RdmaStats,
) -> Result<Ran, VerbsError> {
    let Some(call) = core.call(id) else {
        return Ok(Ran::Answered(None));
    };
    let xid = call.xid;
    let Ok(mut d) = call.assemble(data) else {
        tracing::debug!(peer = %ctx.peer, xid, "chunk data does not match the Read list");
        core.reject(id);
        return Ok(Ran::Answered(None));
    };
    let body = match responder::call_header(&mut d, xid) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(peer = %ctx.peer, xid, error = %e, "ERR_CHUNK");
            core.reject(id);
            return Ok(Ran::Answered(None));
        }
    };
    let reply = match service.begin_call(ctx, xid, &body, d) {
        Begun::Done(Some(reply)) => reply,
        Begun::Done(None) => {
            tracing::debug!(peer = %ctx.peer, xid, "retransmission of a call in progress: no reply");
            core.no_reply(id);
            return Ok(Ran::Answered(None));
        }
        Begun::Long(c) => return Ok(Ran::Long(Box::new(c))),
    };
    answer(core, id, reply, ctx, v, stats).map(Ran::Answered)
}

/// Answers call `id` with `reply` through the core: the reply, or an
/// RDMA_ERROR when it cannot travel as encoded. Returns what its
/// turnaround is recorded under when a reply went to the core.
pub fn answer(
    core: &mut Connection<Local>,
    id: CallId,
    reply: Reply,
    ctx: &CallContext,
    v: &Verbs,
    stats: &RdmaStats,
) -> Result<Option<CallClass>, VerbsError> {
    let Some(xid) = core.call(id).map(|c| c.xid) else {
        return Ok(None);
    };
    let plan = match core.plan_reply(id, |s| reply.encode(s)) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            tracing::debug!(peer = %ctx.peer, xid, error = %e, "reply cannot be sent");
            core.reject(id);
            return Ok(None);
        }
        None => return Ok(None),
    };
    // Data in arena memory goes from there; anything else is copied into
    // staging blocks, at most `chunk_size` bytes for a call that holds a
    // chunk slot.
    let mut room = if core.holds_chunk_slot(id) {
        core.config().chunk_size as usize
    } else {
        0
    };
    let mut staged = false;
    let mut ddp_left = plan.ddp_bytes;
    let mut local = Vec::with_capacity(plan.writes.len());
    for w in &plan.writes {
        let mut pieces = Vec::with_capacity(w.data.parts().len());
        for p in w.data.parts() {
            let ddp = p.len().min(ddp_left);
            ddp_left -= ddp;
            if v.arena.sge_for(p).is_some() {
                pieces.push(Local(p.clone()));
                continue;
            }
            if p.len() > room {
                tracing::debug!(peer = %ctx.peer, xid, "reply data beyond the call's staging room");
                core.reject(id);
                return Ok(None);
            }
            room -= p.len();
            if !stage(p, v, &mut pieces)? {
                stats.arena_exhausted.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %ctx.peer, xid, "arena exhausted: no staging for a reply");
                core.reject(id);
                return Ok(None);
            }
            staged = true;
            stats
                .payload_copies
                .fetch_add(ddp as u64, Ordering::Relaxed);
        }
        local.push(pieces);
    }
    core.send_reply(id, plan, local, staged);
    Ok(reply.class)
}

/// The arena block size that holds `n` bytes (up to a 64 KiB block): the
/// smallest power of two from 4 KiB.
fn block_class(n: usize) -> usize {
    n.max(4096)
        .next_power_of_two()
        .min(crate::store::blocks::BLOCK_SIZE)
}

/// Copies `data` into staging blocks from the arena (64 KiB each; the last
/// in the smallest block class that holds what is left) and adds them to
/// `pieces`. False when the arena is exhausted.
fn stage(data: &[u8], v: &Verbs, pieces: &mut Vec<Local>) -> Result<bool, VerbsError> {
    use crate::store::blocks::BLOCK_SIZE as BLK;
    for part in data.chunks(BLK) {
        let Some(mut b) = v.arena.alloc(block_class(part.len()))? else {
            return Ok(false);
        };
        b.as_mut()[..part.len()].copy_from_slice(part);
        pieces.push(Local(Block::from_memory(Box::new(b)).slice(0..part.len())));
    }
    Ok(true)
}

/// How `total` bytes of a Read chunk land: a head of up to `head` bytes
/// (up to the file's next 64 KiB boundary), 64 KiB pieces, a tail. A head
/// or tail shorter than 64 KiB lands in pieces of powers of two (from
/// 4 KiB; the last may be shorter), each in a block of exactly its size:
/// the store takes whole pages of landing blocks over and keeps each such
/// block alive whole, so none is left mostly empty.
fn landing_pieces(total: usize, head: usize) -> Vec<usize> {
    use crate::store::blocks::{BLOCK_SIZE as BLK, PAGE};
    let mut pieces = Vec::new();
    let mut left = total;
    let mut span = left.min(head);
    while left > 0 {
        let n = if span >= BLK || span <= PAGE {
            span
        } else {
            1 << (usize::BITS - 1 - span.leading_zeros())
        };
        pieces.push(n);
        left -= n;
        span -= n;
        if span == 0 {
            span = left.min(BLK);
        }
    }
    pieces
}

/// The file offset of an NFSv3 WRITE call, or of the first WRITE of an
/// NFSv4 COMPOUND among its first few operations, from the call's inline
/// part (the RPC header and the arguments up to the data).
fn write_offset(inline: &Bytes) -> Option<u64> {
    use nfsrdma_xdr::nfs3::{NfsFh3, NfsProc3, PROGRAM, VERSION};
    use nfsrdma_xdr::nfs4::{self, opnum, ArgOp, Stateid4, Utf8Str};
    let mut d = nfsrdma_xdr::Decoder::new(inline.clone());
    let h = RpcMessage::decode(&mut d).ok()?;
    let c = h.as_call()?;
    match (c.prog, c.vers, c.proc_) {
        (PROGRAM, VERSION, p) if p == NfsProc3::Write as u32 => {
            NfsFh3::decode(&mut d).ok()?;
            d.u64("offset").ok()
        }
        (PROGRAM, nfs4::VERSION, nfs4::PROC_COMPOUND) => {
            Utf8Str::decode(&mut d).ok()?;
            d.u32("minorversion").ok()?;
            let n = d.u32("ops").ok()?;
            // SEQUENCE, PUTFH, WRITE is what clients send.
            for _ in 0..n.min(4) {
                if d.clone().u32("op").ok()? == opnum::WRITE {
                    d.u32("op").ok()?;
                    Stateid4::decode(&mut d).ok()?;
                    return d.u64("offset").ok();
                }
                ArgOp::decode(&mut d).ok()?;
            }
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_offset_is_found_in_nfsv3_and_nfsv4_calls() {
        use bytes::BytesMut;
        use nfsrdma_xdr::nfs3::{self, Data};
        use nfsrdma_xdr::nfs4::ops::{SequenceArgs, WriteArgs};
        use nfsrdma_xdr::nfs4::{self, ArgOp, Compound4Args, Fh4, StableHow4, Stateid4};
        use nfsrdma_xdr::rpc::OpaqueAuth;
        let call = |prog, vers, proc_, args: &dyn Fn(&mut BytesMut)| {
            let mut b = BytesMut::new();
            RpcMessage::call(1, prog, vers, proc_, OpaqueAuth::none()).encode(&mut b);
            args(&mut b);
            b.freeze()
        };
        let compound = |ops: Vec<ArgOp>| {
            move |b: &mut BytesMut| {
                Compound4Args {
                    tag: Default::default(),
                    minorversion: 2,
                    ops: ops.clone(),
                }
                .encode(b)
            }
        };
        let write = ArgOp::Write(WriteArgs {
            stateid: Stateid4::ANONYMOUS,
            offset: 12_288,
            stable: StableHow4::Unstable,
            data: Data(Default::default()),
        });
        let seq = ArgOp::Sequence(SequenceArgs::default());
        let putfh = ArgOp::Putfh(Fh4(Bytes::from_static(&[1; 32])));
        let v4 = call(
            nfs3::PROGRAM,
            nfs4::VERSION,
            nfs4::PROC_COMPOUND,
            &compound(vec![seq.clone(), putfh.clone(), write.clone()]),
        );
        assert_eq!(write_offset(&v4), Some(12_288));
        // Not a WRITE COMPOUND, or a WRITE too far in.
        let v4 = call(
            nfs3::PROGRAM,
            nfs4::VERSION,
            nfs4::PROC_COMPOUND,
            &compound(vec![seq.clone(), putfh.clone(), ArgOp::Getfh]),
        );
        assert_eq!(write_offset(&v4), None);
        let far = vec![seq, putfh.clone(), putfh.clone(), putfh, write];
        let v4 = call(
            nfs3::PROGRAM,
            nfs4::VERSION,
            nfs4::PROC_COMPOUND,
            &compound(far),
        );
        assert_eq!(write_offset(&v4), None);
        // NFSv3 as before.
        let v3 = call(
            nfs3::PROGRAM,
            nfs3::VERSION,
            nfs3::NfsProc3::Write as u32,
            &|b: &mut BytesMut| {
                nfs3::NfsFh3(Bytes::from_static(&[1; 8])).encode(b);
                b.extend_from_slice(&65_536u64.to_be_bytes());
            },
        );
        assert_eq!(write_offset(&v3), Some(65_536));
    }

    #[test]
    fn read_chunks_land_in_blocks_they_fill() {
        const K: usize = 1024;
        // Aligned records: one piece per 64 KiB, a 4 KiB record alone.
        assert_eq!(landing_pieces(4 * K, 64 * K), [4 * K]);
        assert_eq!(landing_pieces(4 * K, 8 * K), [4 * K]);
        assert_eq!(landing_pieces(128 * K, 64 * K), [64 * K, 64 * K]);
        // A head up to the next 64 KiB boundary and a tail, in powers of
        // two (a sub-page remainder last).
        assert_eq!(
            landing_pieces(40 * K + 64 * K + 12_345, 40 * K),
            [32 * K, 8 * K, 64 * K, 8 * K, 4 * K, 57]
        );
        assert_eq!(landing_pieces(4097, 64 * K), [4096, 1]);
        // Every byte exactly once.
        for (total, head) in [(1, 1), (65_537, 3000), (300_000, 65_536), (12_288, 4096)] {
            let p = landing_pieces(total, head);
            assert_eq!(p.iter().sum::<usize>(), total);
            assert!(p.iter().all(|&n| n > 0 && n <= 64 * K));
        }
    }
}
