//! RPC-over-RDMA version 1 transport header (RFC 8166 §4) and the RFC 8797
//! connection private message.

use crate::{Decoder, List, Result, Xdr, XdrError, XdrSink};

/// The protocol version this module encodes.
pub const RPCRDMA_VERSION: u32 = 1;
/// Most segments accepted in one Write or Reply chunk.
pub const MAX_CHUNK_SEGMENTS: u32 = 1024;
/// Most entries accepted in a Read list.
pub const MAX_READ_SEGMENTS: u32 = 1024;
/// Most chunks accepted in a Write list.
pub const MAX_WRITE_CHUNKS: u32 = 64;
/// Size of a header with empty chunk lists (RFC 8166 §4.5: anything
/// shorter is discarded).
pub const MIN_HEADER_LEN: usize = 28;

xdr_struct!(
    /// `xdr_rdma_segment` (HLOO): a registered memory segment.
    #[derive(Copy, Hash)]
    pub struct RdmaSegment {
        /// The R_key (steering tag).
        pub handle: u32,
        /// Length in bytes.
        pub length: u32,
        /// Remote address (offset within the registration).
        pub offset: u64,
    }
);

xdr_struct!(
    /// `xdr_read_chunk` (PHLOO): one segment of a Read chunk and the XDR
    /// stream position where its data belongs.
    #[derive(Copy, Hash)]
    pub struct ReadSegment {
        /// Byte offset in the unreduced XDR stream (a multiple of four).
        pub position: u32,
        /// The segment.
        pub target: RdmaSegment,
    }
);

xdr_struct!(
    /// `xdr_write_chunk`: a counted array of segments; used for Write list
    /// entries and for the Reply chunk.
    pub struct WriteChunk {
        /// The segments, in order.
        pub segments: crate::BoundedVec<RdmaSegment, MAX_CHUNK_SEGMENTS>,
    }
);

impl WriteChunk {
    /// A chunk made of `segments`.
    pub fn new(segments: Vec<RdmaSegment>) -> Self {
        WriteChunk {
            segments: crate::BoundedVec(segments),
        }
    }

    /// Sum of the segment lengths (u64: cannot overflow).
    pub fn total_len(&self) -> u64 {
        self.segments.0.iter().map(|s| u64::from(s.length)).sum()
    }
}

xdr_struct!(
    /// The three chunk lists every RDMA_MSG / RDMA_NOMSG header carries.
    pub struct ChunkLists {
        /// Read list (`xdr_read_list *`).
        pub read_list: List<ReadSegment, MAX_READ_SEGMENTS>,
        /// Write list (`xdr_write_list *`).
        pub write_list: List<WriteChunk, MAX_WRITE_CHUNKS>,
        /// Reply chunk (`xdr_write_chunk *`).
        pub reply_chunk: Option<WriteChunk>,
    }
);

impl ChunkLists {
    /// True when no list holds anything.
    pub fn is_empty(&self) -> bool {
        self.read_list.0.is_empty() && self.write_list.0.is_empty() && self.reply_chunk.is_none()
    }
}

xdr_struct!(
    /// `rpc_rdma_header_padded`, the RDMA_MSGP body (RFC 8166 keeps it only
    /// to reject it: responders answer ERR_CHUNK).
    pub struct PaddedBody {
        /// Alignment requested for the data.
        pub align: u32,
        /// Threshold for padding.
        pub thresh: u32,
        /// The chunk lists.
        pub chunks: ChunkLists,
    }
);

/// `rpc_rdma_errcode` with its arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum RdmaError {
    /// ERR_VERS: the versions the responder supports.
    Vers {
        /// Lowest version supported.
        low: u32,
        /// Highest version supported.
        high: u32,
    },
    /// ERR_CHUNK: a header or chunk could not be processed.
    Chunk,
}

impl Xdr for RdmaError {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match *self {
            RdmaError::Vers { low, high } => {
                s.put_u32_be(1);
                s.put_u32_be(low);
                s.put_u32_be(high);
            }
            RdmaError::Chunk => s.put_u32_be(2),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match d.u32("rdma_err")? {
            1 => Ok(RdmaError::Vers {
                low: d.u32("rdma_vers_low")?,
                high: d.u32("rdma_vers_high")?,
            }),
            2 => Ok(RdmaError::Chunk),
            value => Err(XdrError::BadValue {
                what: "rdma_err",
                value,
            }),
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            RdmaError::Vers { .. } => 12,
            RdmaError::Chunk => 4,
        }
    }
}

/// `rdma_proc` values.
pub mod proc_ {
    /// RDMA_MSG: an RPC message follows the header.
    pub const RDMA_MSG: u32 = 0;
    /// RDMA_NOMSG: the RPC message travels in chunks.
    pub const RDMA_NOMSG: u32 = 1;
    /// RDMA_MSGP: deprecated padded message.
    pub const RDMA_MSGP: u32 = 2;
    /// RDMA_DONE: deprecated.
    pub const RDMA_DONE: u32 = 3;
    /// RDMA_ERROR: a responder-reported error.
    pub const RDMA_ERROR: u32 = 4;
}

/// `rpc_rdma_body`: the procedure and its arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum RdmaBody {
    /// RDMA_MSG.
    Msg(ChunkLists),
    /// RDMA_NOMSG.
    Nomsg(ChunkLists),
    /// RDMA_MSGP.
    Msgp(PaddedBody),
    /// RDMA_DONE.
    Done,
    /// RDMA_ERROR.
    Error(RdmaError),
}

impl RdmaBody {
    /// The `rdma_proc` number.
    pub fn proc_(&self) -> u32 {
        match self {
            RdmaBody::Msg(_) => proc_::RDMA_MSG,
            RdmaBody::Nomsg(_) => proc_::RDMA_NOMSG,
            RdmaBody::Msgp(_) => proc_::RDMA_MSGP,
            RdmaBody::Done => proc_::RDMA_DONE,
            RdmaBody::Error(_) => proc_::RDMA_ERROR,
        }
    }

    /// The chunk lists, for RDMA_MSG and RDMA_NOMSG.
    pub fn chunks(&self) -> Option<&ChunkLists> {
        match self {
            RdmaBody::Msg(c) | RdmaBody::Nomsg(c) => Some(c),
            _ => None,
        }
    }
}

/// The fixed first 16 bytes of every transport header, readable whatever
/// the version (so a responder can answer ERR_VERS with the right XID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    /// `rdma_xid`.
    pub xid: u32,
    /// `rdma_vers`.
    pub vers: u32,
    /// `rdma_credit`.
    pub credit: u32,
    /// `rdma_proc`.
    pub proc_: u32,
}

impl FixedHeader {
    /// Reads the fixed fields, `None` when fewer than 16 bytes are present.
    pub fn peek(buf: &[u8]) -> Option<FixedHeader> {
        if buf.len() < 16 {
            return None;
        }
        let w = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        Some(FixedHeader {
            xid: w(0),
            vers: w(4),
            credit: w(8),
            proc_: w(12),
        })
    }
}

/// `rpc_rdma_header`: the RPC-over-RDMA version 1 transport header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub struct RdmaHeader {
    /// `rdma_xid`: the XID of the RPC message it carries.
    pub xid: u32,
    /// `rdma_vers`: [`RPCRDMA_VERSION`] on decode; any value can be encoded
    /// (to test peers).
    #[cfg_attr(feature = "arbitrary", proptest(value = "RPCRDMA_VERSION"))]
    pub vers: u32,
    /// `rdma_credit`: requested credits in a call, granted in a reply.
    pub credit: u32,
    /// The procedure and its body.
    pub body: RdmaBody,
}

impl Xdr for RdmaHeader {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(self.xid);
        s.put_u32_be(self.vers);
        s.put_u32_be(self.credit);
        s.put_u32_be(self.body.proc_());
        match &self.body {
            RdmaBody::Msg(c) | RdmaBody::Nomsg(c) => c.encode(s),
            RdmaBody::Msgp(p) => p.encode(s),
            RdmaBody::Done => {}
            RdmaBody::Error(e) => e.encode(s),
        }
    }
    /// Decodes a version 1 header. A different `rdma_vers` is
    /// [`XdrError::BadValue`] with what = "rdma_vers" (use
    /// [`FixedHeader::peek`] to answer it).
    fn decode(d: &mut Decoder) -> Result<Self> {
        let xid = d.u32("rdma_xid")?;
        let vers = d.u32("rdma_vers")?;
        if vers != RPCRDMA_VERSION {
            return Err(XdrError::BadValue {
                what: "rdma_vers",
                value: vers,
            });
        }
        let credit = d.u32("rdma_credit")?;
        let body = match d.u32("rdma_proc")? {
            proc_::RDMA_MSG => RdmaBody::Msg(ChunkLists::decode(d)?),
            proc_::RDMA_NOMSG => RdmaBody::Nomsg(ChunkLists::decode(d)?),
            proc_::RDMA_MSGP => RdmaBody::Msgp(PaddedBody::decode(d)?),
            proc_::RDMA_DONE => RdmaBody::Done,
            proc_::RDMA_ERROR => RdmaBody::Error(RdmaError::decode(d)?),
            value => {
                return Err(XdrError::BadValue {
                    what: "rdma_proc",
                    value,
                })
            }
        };
        Ok(RdmaHeader {
            xid,
            vers,
            credit,
            body,
        })
    }
    fn encoded_len(&self) -> usize {
        16 + match &self.body {
            RdmaBody::Msg(c) | RdmaBody::Nomsg(c) => c.encoded_len(),
            RdmaBody::Msgp(p) => p.encoded_len(),
            RdmaBody::Done => 0,
            RdmaBody::Error(e) => e.encoded_len(),
        }
    }
}

/// The RFC 8797 format identifier.
pub const CM_PRIVATE_FORMAT_ID: u32 = 0xf6ab_0e18;
/// The RFC 8797 message version.
pub const CM_PRIVATE_VERSION: u8 = 1;
/// Flag: the sender accepts Send With Invalidate.
pub const CM_FLAG_SEND_WITH_INVALIDATE_OK: u8 = 1;
/// The inline threshold in effect when no private message was exchanged.
pub const DEFAULT_INLINE_THRESHOLD: u32 = 1024;

/// The RFC 8797 connection private message (8 bytes) carried in the RDMA
/// connect request and accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmPrivate {
    /// The sender accepts Send With Invalidate (flag bit 0).
    pub remote_invalidation: bool,
    /// Largest inline message the sender will send, in bytes
    /// (1 KiB .. 256 KiB, a multiple of 1 KiB).
    pub send_size: u32,
    /// Largest inline message the sender can receive, in bytes.
    pub recv_size: u32,
}

impl CmPrivate {
    /// Length of the encoded message.
    pub const LEN: usize = 8;

    /// Rounds a byte size to the nearest representable size at or below it
    /// (1 KiB .. 256 KiB in 1 KiB steps).
    pub fn representable(size: u32) -> u32 {
        (size / 1024).clamp(1, 256) * 1024
    }

    /// The 8-byte encoding. Sizes are rounded down to what the format
    /// can carry (see [`CmPrivate::representable`]).
    pub fn encode(&self) -> [u8; 8] {
        let enc = |size: u32| (Self::representable(size) / 1024 - 1) as u8;
        let id = CM_PRIVATE_FORMAT_ID.to_be_bytes();
        [
            id[0],
            id[1],
            id[2],
            id[3],
            CM_PRIVATE_VERSION,
            if self.remote_invalidation {
                CM_FLAG_SEND_WITH_INVALIDATE_OK
            } else {
                0
            },
            enc(self.send_size),
            enc(self.recv_size),
        ]
    }

    /// Parses connection private data. Transports may pad private data, so
    /// bytes after the first eight are ignored; unknown flag bits are
    /// ignored. A wrong format identifier or version is an error: the caller
    /// then treats the message as absent (1 KiB thresholds, no remote
    /// invalidation).
    pub fn decode(buf: &[u8]) -> Result<CmPrivate> {
        if buf.len() < Self::LEN {
            return Err(XdrError::Short {
                what: "RFC 8797 private message",
                needed: Self::LEN,
                available: buf.len(),
            });
        }
        let id = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if id != CM_PRIVATE_FORMAT_ID {
            return Err(XdrError::BadValue {
                what: "RFC 8797 format identifier",
                value: id,
            });
        }
        if buf[4] != CM_PRIVATE_VERSION {
            return Err(XdrError::BadValue {
                what: "RFC 8797 version",
                value: buf[4].into(),
            });
        }
        Ok(CmPrivate {
            remote_invalidation: buf[5] & CM_FLAG_SEND_WITH_INVALIDATE_OK != 0,
            send_size: (u32::from(buf[6]) + 1) * 1024,
            recv_size: (u32::from(buf[7]) + 1) * 1024,
        })
    }

    /// The peer's view when private data may be absent or foreign: the
    /// parsed message, or the RFC 8166 defaults.
    pub fn from_peer(buf: Option<&[u8]>) -> CmPrivate {
        buf.and_then(|b| CmPrivate::decode(b).ok())
            .unwrap_or(CmPrivate {
                remote_invalidation: false,
                send_size: DEFAULT_INLINE_THRESHOLD,
                recv_size: DEFAULT_INLINE_THRESHOLD,
            })
    }
}

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for CmPrivate {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        (any::<bool>(), 1u32..=256, 1u32..=256)
            .prop_map(|(ri, s, r)| CmPrivate {
                remote_invalidation: ri,
                send_size: s * 1024,
                recv_size: r * 1024,
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_version_is_reported_with_the_fixed_fields_readable() {
        let h = RdmaHeader {
            xid: 9,
            vers: 2,
            credit: 1,
            body: RdmaBody::Msg(ChunkLists::default()),
        };
        let b = h.to_bytes();
        assert!(matches!(
            RdmaHeader::from_bytes(b.clone()),
            Err(XdrError::BadValue {
                what: "rdma_vers",
                value: 2
            })
        ));
        let f = FixedHeader::peek(&b).unwrap();
        assert_eq!((f.xid, f.vers, f.proc_), (9, 2, 0));
    }

    #[test]
    fn cm_private_sizes_round_trip_and_clamp() {
        let m = CmPrivate {
            remote_invalidation: true,
            send_size: 4096,
            recv_size: 4096 + 1000,
        };
        let d = CmPrivate::decode(&m.encode()).unwrap();
        assert_eq!(d.send_size, 4096);
        assert_eq!(d.recv_size, 4096);
        assert_eq!(CmPrivate::representable(100), 1024);
        assert_eq!(CmPrivate::representable(1 << 30), 256 * 1024);
        // Padded private data (as some transports deliver it) still parses.
        let mut padded = m.encode().to_vec();
        padded.resize(56, 0);
        assert_eq!(CmPrivate::decode(&padded).unwrap(), d);
        // A foreign message means "absent".
        assert_eq!(
            CmPrivate::from_peer(Some(&[0u8; 8])).recv_size,
            DEFAULT_INLINE_THRESHOLD
        );
        assert!(!CmPrivate::from_peer(None).remote_invalidation);
    }
}
