//! Filling the peer's Write chunks: which bytes go to which segment, and
//! the chunk as the responder echoes it (RFC 8166 §4.3.2).

use nfsrdma_xdr::rpcrdma::{RdmaSegment, WriteChunk};
use nfsrdma_xdr::Payload;

/// One RDMA Write (responder) or one region of a chunk: `data` goes to
/// `offset` of the peer's registration `rkey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOp {
    /// The peer's R_key.
    pub rkey: u32,
    /// The peer's address.
    pub offset: u64,
    /// What to write (store blocks or reply bytes, by reference).
    pub data: Payload,
}

/// Splits `data` over the segments of `chunk`, in order. Returns the writes
/// and the chunk as it is echoed back: each segment's length replaced by the
/// bytes written into it (zero for segments left unused, RFC 8166 §4.3.2).
/// `None` when the data does not fit.
pub fn fill_chunk(chunk: &WriteChunk, data: &Payload) -> Option<(Vec<WriteOp>, WriteChunk)> {
    if data.len() as u64 > chunk.total_len() {
        return None;
    }
    let mut ops = Vec::new();
    let mut echo = Vec::with_capacity(chunk.segments.0.len());
    let mut at = 0usize;
    for seg in &chunk.segments.0 {
        let n = (seg.length as usize).min(data.len() - at);
        if n > 0 {
            ops.push(WriteOp {
                rkey: seg.handle,
                offset: seg.offset,
                data: data.slice(at..at + n),
            });
        }
        echo.push(RdmaSegment {
            handle: seg.handle,
            length: n as u32,
            offset: seg.offset,
        });
        at += n;
    }
    Some((ops, WriteChunk::new(echo)))
}

/// The same chunk with every segment length set to zero: an unused Write
/// chunk as the responder echoes it.
pub fn unused_chunk(chunk: &WriteChunk) -> WriteChunk {
    WriteChunk::new(
        chunk
            .segments
            .0
            .iter()
            .map(|s| RdmaSegment { length: 0, ..*s })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn chunk(lens: &[u32]) -> WriteChunk {
        WriteChunk::new(
            lens.iter()
                .enumerate()
                .map(|(i, l)| RdmaSegment {
                    handle: 100 + i as u32,
                    length: *l,
                    offset: 0x1000 * (i as u64 + 1),
                })
                .collect(),
        )
    }

    #[test]
    fn data_fills_segments_in_order_and_echo_says_what_was_written() {
        let c = chunk(&[4, 4, 8]);
        let data = Payload::from(Bytes::from_static(b"abcdef"));
        let (ops, echo) = fill_chunk(&c, &data).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!((ops[0].rkey, ops[0].offset), (100, 0x1000));
        assert_eq!(ops[0].data.to_contiguous(), Bytes::from_static(b"abcd"));
        assert_eq!(ops[1].data.to_contiguous(), Bytes::from_static(b"ef"));
        let lens: Vec<u32> = echo.segments.0.iter().map(|s| s.length).collect();
        assert_eq!(lens, vec![4, 2, 0]);
        assert!(fill_chunk(&c, &Payload::from(vec![0u8; 17])).is_none());
        assert!(unused_chunk(&c).segments.0.iter().all(|s| s.length == 0));
    }
}
