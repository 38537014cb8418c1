//! The NFSv4.1 callback program (RFC 8881 §20, XDR in RFC 5662): what a
//! server sends a client on the session's backchannel. CB_NULL and
//! CB_COMPOUND; of the operations, CB_SEQUENCE (every CB_COMPOUND starts
//! with it) and CB_RECALL (a delegation is wanted back). Others decode as
//! [`CbArgOp::Unsupported`], where the decoder stops.

use super::ops::Res;
use super::{Bitmap4, Fattr4, Fh4, SessionId4, Stateid4, Status, Utf8Str};
use crate::{BoundedVec, Decoder, Result, Xdr, XdrSink};

/// The callback program's version (NFS_CB).
pub const VERSION: u32 = 1;
/// CB_NULL.
pub const PROC_NULL: u32 = 0;
/// CB_COMPOUND.
pub const PROC_COMPOUND: u32 = 1;

/// Callback operation numbers (`nfs_cb_opnum4`).
#[allow(missing_docs)]
pub mod cb_opnum {
    pub const CB_GETATTR: u32 = 3;
    pub const CB_RECALL: u32 = 4;
    pub const CB_SEQUENCE: u32 = 11;
    /// The last operation number defined (NFSv4.2's CB_OFFLOAD).
    pub const LAST: u32 = 15;
    pub const CB_ILLEGAL: u32 = 10044;
}

xdr_struct!(
    /// `referring_call4`.
    pub struct ReferringCall4 {
        /// The referring call's sequence id.
        pub sequenceid: u32,
        /// Its slot.
        pub slotid: u32,
    }
);

xdr_struct!(
    /// `referring_call_list4`.
    pub struct ReferringCallList4 {
        /// The session of the referring calls.
        pub sessionid: SessionId4,
        /// The calls.
        pub calls: BoundedVec<ReferringCall4, 64>,
    }
);

xdr_struct!(
    /// CB_SEQUENCE4args.
    pub struct CbSequenceArgs {
        /// The session whose backchannel carries the call.
        pub sessionid: SessionId4,
        /// The slot's sequence id.
        pub sequenceid: u32,
        /// The slot.
        pub slotid: u32,
        /// Highest slot the server may use now.
        pub highest_slotid: u32,
        /// Whether the client should cache the reply.
        pub cachethis: bool,
        /// Fore-channel calls this callback follows from.
        pub referring_call_lists: BoundedVec<ReferringCallList4, 64>,
    }
);

xdr_struct!(
    /// CB_SEQUENCE4resok.
    pub struct CbSequenceResOk {
        /// The session.
        pub sessionid: SessionId4,
        /// The slot's sequence id.
        pub sequenceid: u32,
        /// The slot.
        pub slotid: u32,
        /// Highest slot the client will accept now.
        pub highest_slotid: u32,
        /// Highest slot the client wants the server to use.
        pub target_highest_slotid: u32,
    }
);

xdr_struct!(
    /// CB_RECALL4args.
    pub struct CbRecallArgs {
        /// The delegation.
        pub stateid: Stateid4,
        /// Whether the file is about to be truncated to zero.
        pub truncate: bool,
        /// The file.
        pub fh: Fh4,
    }
);

xdr_struct!(
    /// CB_GETATTR4args (RFC 8881 §20.1): the holder of a write delegation
    /// asked for the attributes it may have changed.
    pub struct CbGetattrArgs {
        /// The file.
        pub fh: Fh4,
        /// The attributes asked for.
        pub attr_request: Bitmap4,
    }
);

/// One operation of a CB_COMPOUND with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CbArgOp {
    Getattr(CbGetattrArgs),
    Recall(CbRecallArgs),
    Sequence(CbSequenceArgs),
    /// A defined operation whose arguments are not modelled: decoding
    /// stops there. Encodes as the number alone.
    Unsupported(u32),
    /// An undefined operation number (the decoder stops there).
    Illegal(u32),
}

impl CbArgOp {
    /// The operation number.
    pub fn num(&self) -> u32 {
        match self {
            CbArgOp::Getattr(_) => cb_opnum::CB_GETATTR,
            CbArgOp::Recall(_) => cb_opnum::CB_RECALL,
            CbArgOp::Sequence(_) => cb_opnum::CB_SEQUENCE,
            CbArgOp::Unsupported(n) | CbArgOp::Illegal(n) => *n,
        }
    }
}

impl Xdr for CbArgOp {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(self.num());
        match self {
            CbArgOp::Getattr(a) => a.encode(s),
            CbArgOp::Recall(a) => a.encode(s),
            CbArgOp::Sequence(a) => a.encode(s),
            CbArgOp::Unsupported(_) | CbArgOp::Illegal(_) => {}
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let op = d.u32("nfs_cb_opnum4")?;
        Ok(match op {
            cb_opnum::CB_GETATTR => CbArgOp::Getattr(CbGetattrArgs::decode(d)?),
            cb_opnum::CB_RECALL => CbArgOp::Recall(CbRecallArgs::decode(d)?),
            cb_opnum::CB_SEQUENCE => CbArgOp::Sequence(CbSequenceArgs::decode(d)?),
            // 3 and 4 are above.
            5..=cb_opnum::LAST => CbArgOp::Unsupported(op),
            _ => CbArgOp::Illegal(op),
        })
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CbArgOp::Getattr(a) => a.encoded_len(),
            CbArgOp::Recall(a) => a.encoded_len(),
            CbArgOp::Sequence(a) => a.encoded_len(),
            _ => 0,
        }
    }
}

/// One operation's result in a CB_COMPOUND reply.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CbResOp {
    Getattr(Res<Fattr4>),
    Recall(Status),
    Sequence(Res<CbSequenceResOk>),
    /// Any other operation: its number and status; decoding stops after
    /// it (its results are not modelled).
    Other(u32, Status),
}

impl CbResOp {
    /// The operation's status.
    pub fn status(&self) -> Status {
        match self {
            CbResOp::Recall(s) | CbResOp::Other(_, s) => *s,
            CbResOp::Sequence(r) => r.as_ref().err().copied().unwrap_or(Status::OK),
            CbResOp::Getattr(r) => r.as_ref().err().copied().unwrap_or(Status::OK),
        }
    }
}

impl Xdr for CbResOp {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            CbResOp::Getattr(r) => {
                s.put_u32_be(cb_opnum::CB_GETATTR);
                r.encode(s);
            }
            CbResOp::Recall(st) => {
                s.put_u32_be(cb_opnum::CB_RECALL);
                st.encode(s);
            }
            CbResOp::Sequence(r) => {
                s.put_u32_be(cb_opnum::CB_SEQUENCE);
                r.encode(s);
            }
            CbResOp::Other(op, st) => {
                s.put_u32_be(*op);
                st.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let op = d.u32("nfs_cb_opnum4")?;
        Ok(match op {
            cb_opnum::CB_GETATTR => CbResOp::Getattr(Res::<Fattr4>::decode(d)?),
            cb_opnum::CB_RECALL => CbResOp::Recall(Status::decode(d)?),
            cb_opnum::CB_SEQUENCE => CbResOp::Sequence(Res::<CbSequenceResOk>::decode(d)?),
            _ => CbResOp::Other(op, Status::decode(d)?),
        })
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CbResOp::Recall(_) | CbResOp::Other(..) => 4,
            CbResOp::Sequence(r) => r.encoded_len(),
            CbResOp::Getattr(r) => r.encoded_len(),
        }
    }
}

/// CB_COMPOUND4args.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CbCompoundArgs {
    /// Echoed in the reply.
    pub tag: Utf8Str,
    /// 1 for NFSv4.1 and 4.2 sessions.
    pub minorversion: u32,
    /// Unused by NFSv4.1 (the session names the client).
    pub callback_ident: u32,
    /// The operations; decoding stops after one it does not model.
    pub ops: Vec<CbArgOp>,
}

/// Most operations a CB_COMPOUND may carry before the decoder refuses it.
pub const CB_MAX_OPS: u32 = 64;

impl Xdr for CbCompoundArgs {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.tag.encode(s);
        s.put_u32_be(self.minorversion);
        s.put_u32_be(self.callback_ident);
        s.put_u32_be(self.ops.len() as u32);
        for op in &self.ops {
            op.encode(s);
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let tag = Utf8Str::decode(d)?;
        let minorversion = d.u32("minorversion")?;
        let callback_ident = d.u32("callback_ident")?;
        let n = d.u32("argarray length")?;
        if n > CB_MAX_OPS {
            return Err(crate::XdrError::TooLong {
                what: "CB_COMPOUND argarray",
                len: n.into(),
                max: CB_MAX_OPS.into(),
            });
        }
        let mut ops = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let op = CbArgOp::decode(d)?;
            let stop = matches!(op, CbArgOp::Unsupported(_) | CbArgOp::Illegal(_));
            ops.push(op);
            if stop {
                break;
            }
        }
        Ok(CbCompoundArgs {
            tag,
            minorversion,
            callback_ident,
            ops,
        })
    }
    fn encoded_len(&self) -> usize {
        self.tag.encoded_len() + 12 + self.ops.iter().map(Xdr::encoded_len).sum::<usize>()
    }
}

/// CB_COMPOUND4res.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CbCompoundRes {
    /// The status of the last operation run.
    pub status: Status,
    /// The request's tag.
    pub tag: Utf8Str,
    /// One result per operation run.
    pub results: Vec<CbResOp>,
}

impl Xdr for CbCompoundRes {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.status.encode(s);
        self.tag.encode(s);
        s.put_u32_be(self.results.len() as u32);
        for r in &self.results {
            r.encode(s);
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let status = Status::decode(d)?;
        let tag = Utf8Str::decode(d)?;
        let n = d.u32("resarray length")?;
        if n > CB_MAX_OPS {
            return Err(crate::XdrError::TooLong {
                what: "CB_COMPOUND resarray",
                len: n.into(),
                max: CB_MAX_OPS.into(),
            });
        }
        let mut results = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let r = CbResOp::decode(d)?;
            let stop = matches!(r, CbResOp::Other(..));
            results.push(r);
            if stop {
                break;
            }
        }
        Ok(CbCompoundRes {
            status,
            tag,
            results,
        })
    }
    fn encoded_len(&self) -> usize {
        4 + self.tag.encoded_len() + 4 + self.results.iter().map(Xdr::encoded_len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};

    fn round<T: Xdr + PartialEq + std::fmt::Debug>(v: &T) {
        let mut b = BytesMut::new();
        v.encode(&mut b);
        assert_eq!(b.len(), v.encoded_len(), "{v:?}");
        let mut d = Decoder::new(b.freeze());
        assert_eq!(&T::decode(&mut d).unwrap(), v);
        d.finish("test").unwrap();
    }

    #[test]
    fn cb_compound_arguments_and_results_round_trip() {
        let seq = CbSequenceArgs {
            sessionid: [7; 16],
            sequenceid: 3,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
            referring_call_lists: BoundedVec(vec![ReferringCallList4 {
                sessionid: [7; 16],
                calls: BoundedVec(vec![ReferringCall4 {
                    sequenceid: 9,
                    slotid: 2,
                }]),
            }]),
        };
        round(&CbCompoundArgs {
            tag: Utf8Str(Bytes::from_static(b"recall")),
            minorversion: 1,
            callback_ident: 0,
            ops: vec![
                CbArgOp::Sequence(seq),
                CbArgOp::Recall(CbRecallArgs {
                    stateid: Stateid4 {
                        seqid: 1,
                        other: [5; 12],
                    },
                    truncate: true,
                    fh: Fh4(Bytes::from_static(b"handle")),
                }),
                CbArgOp::Getattr(CbGetattrArgs {
                    fh: Fh4(Bytes::from_static(b"handle")),
                    attr_request: Bitmap4(vec![0x18]),
                }),
            ],
        });
        round(&CbCompoundRes {
            status: Status::BADHANDLE,
            tag: Utf8Str(Bytes::from_static(b"recall")),
            results: vec![
                CbResOp::Sequence(Ok(CbSequenceResOk {
                    sessionid: [7; 16],
                    sequenceid: 3,
                    slotid: 0,
                    highest_slotid: 0,
                    target_highest_slotid: 0,
                })),
                CbResOp::Recall(Status::BADHANDLE),
                CbResOp::Getattr(Ok(Fattr4 {
                    attrmask: Bitmap4(vec![0x18]),
                    attr_vals: super::super::AttrList4(Bytes::from_static(&[1; 16])),
                })),
                CbResOp::Getattr(Err(Status::BADHANDLE)),
            ],
        });
    }

    #[test]
    fn decoding_stops_at_an_operation_it_does_not_model() {
        // CB_LAYOUTRECALL (not modelled) followed by bytes that are not
        // an operation: the list ends at CB_LAYOUTRECALL.
        let mut b = BytesMut::new();
        Utf8Str(Bytes::new()).encode(&mut b);
        b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        b.extend_from_slice(&5u32.to_be_bytes());
        b.extend_from_slice(&[0xff; 8]);
        let mut d = Decoder::new(b.freeze());
        let a = CbCompoundArgs::decode(&mut d).unwrap();
        assert_eq!(a.ops, vec![CbArgOp::Unsupported(5)]);
        let mut b = BytesMut::new();
        Utf8Str(Bytes::new()).encode(&mut b);
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 65]);
        assert!(CbCompoundArgs::decode(&mut Decoder::new(b.freeze())).is_err());
    }
}
