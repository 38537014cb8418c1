//! Strict, zero-copy XDR (RFC 4506) codecs for every message nfsrdma speaks:
//! ONC RPC v2 ([`rpc`]), TCP record marking ([`record`]), RPC-over-RDMA
//! version 1 and the RFC 8797 connection message ([`rpcrdma`]), NFSv3
//! ([`nfs3`]), MOUNT v3 ([`mount`]), the NFSv3 lock manager NLM v4
//! ([`nlm`]) and its status monitor NSM v1 ([`nsm`]), and portmapper v2
//! ([`portmap`]).
//!
//! # Rules
//! - Encoding writes into any [`bytes::BufMut`] (through the [`XdrSink`]
//!   trait, which every `BufMut` implements) and always writes zero padding.
//! - Decoding reads from a [`bytes::Bytes`] through a [`Decoder`]. Variable
//!   length opaques and strings come back as `Bytes` slices of the input: the
//!   decoder never copies them (a 1 MiB WRITE payload stays where it landed).
//! - Every length is checked against the bytes present and against the
//!   field's maximum before anything is allocated. Short or oversized input is
//!   an [`XdrError`], never a panic and never a silent truncation.
//! - Padding bytes are not required to be zero on decode (be liberal in what
//!   you accept).
//! - Large payloads (READ/WRITE data, SYMLINK and READLINK paths: the items
//!   RFC 8267 calls DDP-eligible) are written with [`XdrSink::put_payload`],
//!   so a scatter/gather sink such as [`IoVecSink`] can carry them by
//!   reference instead of copying them, and an RPC-over-RDMA sender can move
//!   them through chunks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use payload::{Attachment, Payload};

#[macro_use]
mod macros;

pub mod mount;
pub mod nfs3;
pub mod nfs4;
pub mod nlm;
pub mod nsm;
mod payload;
pub mod portmap;
pub mod record;
pub mod rpc;
pub mod rpcrdma;

/// A decoding failure. Every variant names what was being decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The input ended before the item was complete.
    #[error("short input decoding {what}: need {needed} bytes, {available} present")]
    Short {
        /// The item being decoded.
        what: &'static str,
        /// Bytes the item needs.
        needed: usize,
        /// Bytes that were left in the input.
        available: usize,
    },
    /// A declared length or count exceeds the field's maximum.
    #[error("{what}: length {len} exceeds the maximum of {max}")]
    TooLong {
        /// The item being decoded.
        what: &'static str,
        /// The declared length or element count.
        len: u64,
        /// The largest value the field allows.
        max: u64,
    },
    /// A discriminant (enum value, union arm, boolean) has no meaning.
    #[error("{what}: invalid value {value}")]
    BadValue {
        /// The item being decoded.
        what: &'static str,
        /// The value found on the wire.
        value: u32,
    },
    /// Bytes were left over after a complete top-level item.
    #[error("{what}: {extra} trailing bytes after a complete message")]
    Trailing {
        /// The item that was decoded.
        what: &'static str,
        /// How many bytes were left.
        extra: usize,
    },
    /// An item is well formed as XDR but breaks a rule of its protocol.
    #[error("{what}: {why}")]
    Invalid {
        /// The item being decoded.
        what: &'static str,
        /// The rule that was broken.
        why: &'static str,
    },
}

/// Result of a decode.
pub type Result<T> = std::result::Result<T, XdrError>;

/// Bytes of padding that follow `len` bytes of opaque data.
pub const fn pad_len(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// `len` rounded up to a multiple of four (XDR roundup).
pub const fn roundup(len: usize) -> usize {
    len + pad_len(len)
}

/// Where encoded XDR goes.
///
/// Every [`BufMut`] is a sink (payloads are copied into it). A sink may also
/// take payloads by reference: see [`IoVecSink`].
pub trait XdrSink {
    /// Appends raw bytes.
    fn put_raw(&mut self, bytes: &[u8]);

    /// Appends a DDP-eligible payload: the contents of an opaque (after its
    /// length word) and its XDR padding. The default copies it; a sink may
    /// instead keep references to its pieces, or (an RPC-over-RDMA sender)
    /// move contents and padding out of the stream into a chunk.
    fn put_payload(&mut self, payload: &Payload) {
        for p in payload.parts() {
            self.put_raw(p);
        }
        self.put_padding(pad_len(payload.len()));
    }

    /// Appends a big-endian u32.
    fn put_u32_be(&mut self, v: u32) {
        self.put_raw(&v.to_be_bytes());
    }

    /// Appends a big-endian u64.
    fn put_u64_be(&mut self, v: u64) {
        self.put_raw(&v.to_be_bytes());
    }

    /// Appends `n` (0..=3) zero padding bytes.
    fn put_padding(&mut self, n: usize) {
        self.put_raw(&[0u8; 3][..n]);
    }
}

impl<B: BufMut> XdrSink for B {
    fn put_raw(&mut self, bytes: &[u8]) {
        self.put_slice(bytes);
    }
}

/// A scatter/gather sink: small items are gathered into one growing buffer,
/// payloads of at least [`IoVecSink::BY_REFERENCE_MIN`] bytes are kept as
/// references to the caller's `Bytes` (no copy). The result is a list of
/// buffers for `writev` or for a list of RDMA scatter/gather entries.
#[derive(Debug)]
pub struct IoVecSink {
    head: BytesMut,
    parts: Vec<Bytes>,
    len: usize,
}

impl Default for IoVecSink {
    fn default() -> Self {
        IoVecSink::with_capacity(Self::INITIAL_CAPACITY)
    }
}

impl IoVecSink {
    /// Payloads at least this long are carried by reference.
    pub const BY_REFERENCE_MIN: usize = 512;

    /// Room the gathering buffer of [`IoVecSink::new`] starts with: the
    /// header and results of most RPC messages (a READ or WRITE reply
    /// without its data, a GETATTR reply) in one allocation, where
    /// growing from nothing would take several.
    pub const INITIAL_CAPACITY: usize = 256;

    /// An empty sink (its buffer sized for a typical message, growing
    /// as needed).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty sink whose gathering buffer has room for `n` bytes (so
    /// that a message of known length is gathered without regrowing it).
    pub fn with_capacity(n: usize) -> Self {
        IoVecSink {
            head: BytesMut::with_capacity(n),
            parts: Vec::new(),
            len: 0,
        }
    }

    /// Total bytes encoded so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing has been encoded.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The encoded stream as a list of buffers, in order.
    pub fn into_parts(mut self) -> Vec<Bytes> {
        if !self.head.is_empty() {
            self.parts.push(self.head.split().freeze());
        }
        self.parts
    }
}

impl XdrSink for IoVecSink {
    fn put_raw(&mut self, bytes: &[u8]) {
        self.head.extend_from_slice(bytes);
        self.len += bytes.len();
    }

    // The fixed-size words, most of a message's items, without the
    // general copy of `put_raw`.
    fn put_u32_be(&mut self, v: u32) {
        self.head.put_u32(v);
        self.len += 4;
    }

    fn put_u64_be(&mut self, v: u64) {
        self.head.put_u64(v);
        self.len += 8;
    }

    fn put_payload(&mut self, payload: &Payload) {
        for p in payload.parts() {
            if p.len() < Self::BY_REFERENCE_MIN {
                self.put_raw(p);
                continue;
            }
            if !self.head.is_empty() {
                self.parts.push(self.head.split().freeze());
            }
            self.parts.push(p.clone());
            self.len += p.len();
        }
        self.put_padding(pad_len(payload.len()));
    }
}

/// A sink that only counts bytes (used to check `encoded_len`).
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingSink(pub usize);

impl XdrSink for CountingSink {
    fn put_raw(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
    fn put_payload(&mut self, payload: &Payload) {
        self.0 += roundup(payload.len());
    }
}

/// Reads XDR items from a `Bytes` without copying opaque data.
#[derive(Debug, Clone)]
pub struct Decoder {
    buf: Bytes,
    consumed: usize,
    ddp: Option<DdpItem>,
    /// The input is lent for a short time (see [`Decoder::lent`]).
    lent: bool,
}

/// A DDP-eligible item that arrived outside the XDR stream (an RPC-over-RDMA
/// Read chunk): the stream keeps the item's length word, the contents would
/// have started at stream offset `position`, and they are taken from `data`.
#[derive(Debug, Clone)]
struct DdpItem {
    /// `None`: the first DDP-eligible item, wherever it is.
    position: Option<usize>,
    data: Payload,
}

impl Decoder {
    /// A decoder over `buf`.
    pub fn new(buf: Bytes) -> Self {
        Decoder {
            buf,
            consumed: 0,
            ddp: None,
            lent: false,
        }
    }

    /// A decoder over a reduced XDR stream whose one DDP-eligible payload was
    /// moved out of the stream (RFC 8166 §3.4): the payload's contents would
    /// have begun at stream offset `position` (just after its length word);
    /// [`Decoder::payload`] returns `data` there instead of reading the
    /// stream. `position` counts from the start of `buf`.
    pub fn with_ddp(buf: Bytes, position: usize, data: Payload) -> Self {
        Decoder {
            buf,
            consumed: 0,
            ddp: Some(DdpItem {
                position: Some(position),
                data,
            }),
            lent: false,
        }
    }

    /// A decoder over a reduced stream whose first DDP-eligible item was
    /// moved out of it, wherever that item is: how a requester decodes a
    /// reply whose READ data or READLINK path arrived in a Write chunk (the
    /// Write list carries no positions).
    pub fn with_ddp_first(buf: Bytes, data: Payload) -> Self {
        Decoder {
            buf,
            consumed: 0,
            ddp: Some(DdpItem {
                position: None,
                data,
            }),
            lent: false,
        }
    }

    /// The input is lent, and must be given back once decoding is done (a
    /// receive buffer that is posted again when no `Bytes` over it is
    /// left): nothing this decoder returns is a slice of it. The first
    /// time a value would be one (a non-empty opaque, or the undecoded
    /// rest), the rest of the input is copied, once, and values are
    /// sliced from the copy; a message without such values is never
    /// copied. Payloads taken from a DDP item are returned as they are.
    pub fn lent(mut self) -> Self {
        self.lent = true;
        self
    }

    /// True while the decoder still reads the lent input itself (nothing
    /// has been copied out of it).
    pub fn reads_lent_input(&self) -> bool {
        self.lent
    }

    /// A lent input is copied (once) before anything is sliced from it.
    fn own_input(&mut self) {
        if self.lent {
            self.buf = Bytes::copy_from_slice(&self.buf);
            self.lent = false;
        }
    }

    /// Bytes not yet decoded.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Offset of the next item from the start of the input.
    pub fn position(&self) -> usize {
        self.consumed
    }

    /// True when a DDP item was supplied and has not been consumed yet.
    pub fn ddp_pending(&self) -> bool {
        self.ddp.is_some()
    }

    /// The undecoded rest of the input (a copy of it when the input is
    /// lent).
    pub fn into_rest(mut self) -> Bytes {
        self.own_input();
        self.buf
    }

    /// Fails with [`XdrError::Trailing`] unless the input is used up (and any
    /// DDP item was consumed).
    pub fn finish(self, what: &'static str) -> Result<()> {
        if !self.buf.is_empty() {
            return Err(XdrError::Trailing {
                what,
                extra: self.buf.len(),
            });
        }
        if self.ddp.is_some() {
            return Err(XdrError::Invalid {
                what,
                why: "a chunk was supplied at a position where no payload is",
            });
        }
        Ok(())
    }

    fn need(&self, what: &'static str, n: usize) -> Result<()> {
        if self.buf.len() < n {
            return Err(XdrError::Short {
                what,
                needed: n,
                available: self.buf.len(),
            });
        }
        Ok(())
    }

    fn advance(&mut self, n: usize) {
        self.buf.advance(n);
        self.consumed += n;
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.need(what, 4)?;
        self.consumed += 4;
        Ok(self.buf.get_u32())
    }

    /// An unsigned 64-bit integer (XDR hyper).
    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.need(what, 8)?;
        self.consumed += 8;
        Ok(self.buf.get_u64())
    }

    /// A signed 32-bit integer.
    pub fn i32(&mut self, what: &'static str) -> Result<i32> {
        self.u32(what).map(|v| v as i32)
    }

    /// A boolean: 0 or 1, anything else is an error.
    pub fn bool(&mut self, what: &'static str) -> Result<bool> {
        match self.u32(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(XdrError::BadValue { what, value }),
        }
    }

    /// A count of elements that each take at least `min_elem` bytes on the
    /// wire, checked against `max` and against the bytes present (so no
    /// allocation is sized by an unchecked peer value).
    pub fn count(&mut self, what: &'static str, max: u32, min_elem: usize) -> Result<usize> {
        let n = self.u32(what)?;
        if n > max {
            return Err(XdrError::TooLong {
                what,
                len: n.into(),
                max: max.into(),
            });
        }
        let n = n as usize;
        self.need(what, n.saturating_mul(min_elem.max(1)))?;
        Ok(n)
    }

    /// `len` bytes of fixed-length opaque data plus padding, as a slice.
    pub fn fixed_bytes(&mut self, what: &'static str, len: usize) -> Result<Bytes> {
        let padded = roundup(len);
        self.need(what, padded)?;
        if len == 0 {
            self.advance(padded);
            return Ok(Bytes::new());
        }
        self.own_input();
        let out = self.buf.slice(..len);
        self.advance(padded);
        Ok(out)
    }

    /// A fixed-length opaque into an array.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let padded = roundup(N);
        self.need(what, padded)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[..N]);
        self.advance(padded);
        Ok(out)
    }

    /// A variable-length opaque (or string) of at most `max` bytes, as a
    /// slice of the input.
    pub fn opaque(&mut self, what: &'static str, max: u32) -> Result<Bytes> {
        let len = self.u32(what)?;
        if len > max {
            return Err(XdrError::TooLong {
                what,
                len: len.into(),
                max: max.into(),
            });
        }
        self.fixed_bytes(what, len as usize)
    }

    /// A DDP-eligible variable-length opaque of at most `max` bytes. When
    /// this decoder carries a DDP item at the current position (just after
    /// the length word), the contents come from it, and the declared length
    /// must equal the item's length; otherwise this is [`Decoder::opaque`].
    pub fn payload(&mut self, what: &'static str, max: u32) -> Result<Payload> {
        let len = self.u32(what)?;
        if len > max {
            return Err(XdrError::TooLong {
                what,
                len: len.into(),
                max: max.into(),
            });
        }
        if self
            .ddp
            .as_ref()
            .is_some_and(|d| d.position.is_none_or(|p| p == self.consumed))
        {
            let item = self.ddp.take().expect("checked above");
            if item.data.len() != len as usize {
                return Err(XdrError::Invalid {
                    what,
                    why: "chunk length differs from the length in the XDR stream",
                });
            }
            return Ok(item.data);
        }
        self.fixed_bytes(what, len as usize).map(Payload::from)
    }
}

/// A type with an XDR encoding.
pub trait Xdr: Sized {
    /// Appends the encoding of `self`.
    fn encode<S: XdrSink + ?Sized>(&self, sink: &mut S);
    /// Reads one value.
    fn decode(d: &mut Decoder) -> Result<Self>;
    /// Exact number of bytes [`Xdr::encode`] writes.
    fn encoded_len(&self) -> usize;

    /// Encodes into a fresh buffer.
    fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut b);
        b.freeze()
    }

    /// Decodes one value that must use all of `buf`.
    fn from_bytes(buf: Bytes) -> Result<Self> {
        let mut d = Decoder::new(buf);
        let v = Self::decode(&mut d)?;
        d.finish(std::any::type_name::<Self>())?;
        Ok(v)
    }
}

impl Xdr for u32 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(*self);
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.u32("unsigned int")
    }
    fn encoded_len(&self) -> usize {
        4
    }
}

impl Xdr for i32 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(*self as u32);
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.i32("int")
    }
    fn encoded_len(&self) -> usize {
        4
    }
}

impl Xdr for u64 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u64_be(*self);
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.u64("unsigned hyper")
    }
    fn encoded_len(&self) -> usize {
        8
    }
}

impl Xdr for bool {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(u32::from(*self));
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.bool("bool")
    }
    fn encoded_len(&self) -> usize {
        4
    }
}

impl Xdr for () {
    fn encode<S: XdrSink + ?Sized>(&self, _: &mut S) {}
    fn decode(_: &mut Decoder) -> Result<Self> {
        Ok(())
    }
    fn encoded_len(&self) -> usize {
        0
    }
}

/// Fixed-length opaque data (`opaque x[N]`).
impl<const N: usize> Xdr for [u8; N] {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_raw(self);
        s.put_padding(pad_len(N));
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.array("fixed opaque")
    }
    fn encoded_len(&self) -> usize {
        roundup(N)
    }
}

/// XDR optional data (`T *x`): a boolean, then the value when true.
impl<T: Xdr> Xdr for Option<T> {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            None => s.put_u32_be(0),
            Some(v) => {
                s.put_u32_be(1);
                v.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        if d.bool("optional-data discriminant")? {
            Ok(Some(T::decode(d)?))
        } else {
            Ok(None)
        }
    }
    fn encoded_len(&self) -> usize {
        4 + self.as_ref().map_or(0, Xdr::encoded_len)
    }
}

/// Writes a variable-length opaque: length, bytes, zero padding.
pub fn encode_opaque<S: XdrSink + ?Sized>(s: &mut S, data: &[u8]) {
    s.put_u32_be(data.len() as u32);
    s.put_raw(data);
    s.put_padding(pad_len(data.len()));
}

/// Writes a DDP-eligible variable-length opaque through
/// [`XdrSink::put_payload`].
pub fn encode_payload<S: XdrSink + ?Sized>(s: &mut S, data: &Payload) {
    s.put_u32_be(data.len() as u32);
    s.put_payload(data);
}

/// A counted array (`T x<MAX>`) whose maximum is `MAX` elements.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BoundedVec<T, const MAX: u32>(pub Vec<T>);

impl<T: Xdr, const MAX: u32> Xdr for BoundedVec<T, MAX> {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(self.0.len() as u32);
        for v in &self.0 {
            v.encode(s);
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let n = d.count("array", MAX, 4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(T::decode(d)?);
        }
        Ok(BoundedVec(v))
    }
    fn encoded_len(&self) -> usize {
        4 + self.0.iter().map(Xdr::encoded_len).sum::<usize>()
    }
}

/// An XDR linked list (`struct node { T item; node *next; }`), the shape
/// NFSv3 directory listings, MOUNT's DUMP/EXPORT and portmap's DUMP use.
/// Encoded as `1 item 1 item ... 0`; decoded iteratively (a long list cannot
/// exhaust the stack) with at most `MAX` items.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List<T, const MAX: u32 = { u32::MAX }>(pub Vec<T>);

impl<T, const MAX: u32> List<T, MAX> {
    /// A list holding `items`.
    pub fn from_vec(items: Vec<T>) -> Self {
        List(items)
    }
}

impl<T: Xdr, const MAX: u32> Xdr for List<T, MAX> {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        for v in &self.0 {
            s.put_u32_be(1);
            v.encode(s);
        }
        s.put_u32_be(0);
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let mut v = Vec::new();
        while d.bool("list continuation")? {
            if v.len() as u64 >= u64::from(MAX) {
                return Err(XdrError::TooLong {
                    what: "list",
                    len: v.len() as u64 + 1,
                    max: MAX.into(),
                });
            }
            v.push(T::decode(d)?);
        }
        Ok(List(v))
    }
    fn encoded_len(&self) -> usize {
        4 + self.0.iter().map(|v| 4 + v.encoded_len()).sum::<usize>()
    }
}

#[cfg(feature = "arbitrary")]
mod arbitrary_impls {
    use super::{BoundedVec, List};
    use proptest::prelude::*;

    impl<T: Arbitrary + 'static, const MAX: u32> Arbitrary for BoundedVec<T, MAX> {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            proptest::collection::vec(any::<T>(), 0..=(MAX as usize).min(8))
                .prop_map(BoundedVec)
                .boxed()
        }
    }

    impl<T: Arbitrary + 'static, const MAX: u32> Arbitrary for List<T, MAX> {
        type Parameters = ();
        type Strategy = BoxedStrategy<Self>;
        fn arbitrary_with(_: ()) -> Self::Strategy {
            proptest::collection::vec(any::<T>(), 0..=(MAX as usize).min(8))
                .prop_map(List)
                .boxed()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_is_a_slice_of_the_input() {
        let mut b = BytesMut::new();
        encode_opaque(&mut b, &[7u8; 1000]);
        let input = b.freeze();
        let mut d = Decoder::new(input.clone());
        let out = d.opaque("data", 4096).unwrap();
        assert_eq!(out.len(), 1000);
        // Same memory as the input: no copy was made.
        assert_eq!(out.as_ptr(), input[4..].as_ptr());
        d.finish("data").unwrap();
    }

    /// A lent input whose release is observable.
    struct Loan(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl AsRef<[u8]> for Loan {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Loan {
        fn drop(&mut self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn loan(bytes: &[u8]) -> (Bytes, std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let back = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        (Bytes::from_owner(Loan(bytes.to_vec(), back.clone())), back)
    }

    #[test]
    fn a_lent_input_is_copied_once_before_the_first_slice_and_never_kept() {
        let mut b = BytesMut::new();
        b.put_u32(7);
        encode_opaque(&mut b, b"");
        b.put_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        encode_opaque(&mut b, b"handle");
        encode_opaque(&mut b, b"name");
        b.put_u32(9);
        let (input, given_back) = loan(&b);
        let range = input.as_ptr_range();
        let mut d = Decoder::new(input).lent();
        assert_eq!(d.u32("a").unwrap(), 7);
        assert!(d.opaque("empty", 16).unwrap().is_empty());
        assert_eq!(d.array::<8>("verf").unwrap(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(d.reads_lent_input(), "no slice yet, so no copy yet");
        let handle = d.opaque("fh", 64).unwrap();
        assert!(!d.reads_lent_input());
        // The decoder let go of the input when it copied it.
        assert!(given_back.load(std::sync::atomic::Ordering::SeqCst));
        let name = d.opaque("name", 64).unwrap();
        assert_eq!((&handle[..], &name[..]), (&b"handle"[..], &b"name"[..]));
        for v in [&handle, &name] {
            assert!(!range.contains(&v.as_ptr()), "a slice of the lent input");
        }
        assert_eq!(d.u32("b").unwrap(), 9);
        d.finish("message").unwrap();
    }

    #[test]
    fn a_lent_input_without_slices_is_given_back_uncopied() {
        let mut b = BytesMut::new();
        b.put_u32(1);
        b.put_u64(2);
        encode_opaque(&mut b, b"");
        let (input, given_back) = loan(&b);
        let mut d = Decoder::new(input).lent();
        assert_eq!((d.u32("a").unwrap(), d.u64("b").unwrap()), (1, 2));
        assert!(d.opaque("empty", 4).unwrap().is_empty());
        assert!(d.reads_lent_input());
        assert!(!given_back.load(std::sync::atomic::Ordering::SeqCst));
        d.finish("message").unwrap();
        assert!(given_back.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn the_rest_of_a_lent_input_is_a_copy() {
        let (input, given_back) = loan(b"\0\0\0\x01rest");
        let mut d = Decoder::new(input).lent();
        d.u32("a").unwrap();
        let rest = d.into_rest();
        assert_eq!(&rest[..], b"rest");
        assert!(given_back.load(std::sync::atomic::Ordering::SeqCst));
        // Without `lent` the rest is the input itself.
        let (input, given_back) = loan(b"\0\0\0\x01rest");
        let mut d = Decoder::new(input);
        d.u32("a").unwrap();
        let rest = d.into_rest();
        assert!(!given_back.load(std::sync::atomic::Ordering::SeqCst));
        drop(rest);
        assert!(given_back.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn padding_is_written_as_zero_and_accepted_as_anything() {
        let mut b = BytesMut::new();
        encode_opaque(&mut b, b"abcde");
        assert_eq!(&b[..], b"\0\0\0\x05abcde\0\0\0");
        let dirty = Bytes::from_static(b"\0\0\0\x05abcde\xff\x01\x02");
        let mut d = Decoder::new(dirty);
        assert_eq!(&d.opaque("s", 10).unwrap()[..], b"abcde");
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn short_and_oversized_opaques_are_errors() {
        let mut d = Decoder::new(Bytes::from_static(b"\0\0\0\x08abcd"));
        assert!(matches!(
            d.opaque("s", 100),
            Err(XdrError::Short {
                needed: 8,
                available: 4,
                ..
            })
        ));
        let mut d = Decoder::new(Bytes::from_static(b"\xff\xff\xff\xff"));
        assert!(matches!(d.opaque("s", 100), Err(XdrError::TooLong { .. })));
        // Padding missing at the very end is short input too.
        let mut d = Decoder::new(Bytes::from_static(b"\0\0\0\x03abc"));
        assert!(matches!(d.opaque("s", 100), Err(XdrError::Short { .. })));
    }

    #[test]
    fn counts_are_checked_against_bytes_present() {
        // A claim of 1,000,000 elements with no data must fail before any
        // allocation, even under a generous maximum.
        let mut d = Decoder::new(Bytes::from_static(b"\0\x0f\x42\x40"));
        assert!(matches!(
            d.count("n", u32::MAX, 4),
            Err(XdrError::Short { .. })
        ));
    }

    #[test]
    fn bool_rejects_other_values() {
        let mut d = Decoder::new(Bytes::from_static(b"\0\0\0\x02"));
        assert_eq!(
            d.bool("b"),
            Err(XdrError::BadValue {
                what: "b",
                value: 2
            })
        );
    }

    #[test]
    fn list_decodes_iteratively_and_enforces_max() {
        let mut b = BytesMut::new();
        for i in 0..200_000u32 {
            b.put_u32(1);
            b.put_u32(i);
        }
        b.put_u32(0);
        let l = List::<u32>::from_bytes(b.clone().freeze()).unwrap();
        assert_eq!(l.0.len(), 200_000);
        let e = List::<u32, 10>::from_bytes(b.freeze()).unwrap_err();
        assert!(matches!(e, XdrError::TooLong { max: 10, .. }));
    }

    #[test]
    fn iovec_sink_keeps_large_payloads_by_reference() {
        let payload = Payload::from(Bytes::from(vec![1u8; 4097]));
        let mut s = IoVecSink::new();
        s.put_u32_be(9);
        encode_payload(&mut s, &payload);
        s.put_u32_be(10);
        assert_eq!(s.len(), 4 + 4 + 4097 + 3 + 4);
        let parts = s.into_parts();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1].as_ptr(), payload.parts()[0].as_ptr());
        let joined: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        let mut flat = BytesMut::new();
        flat.put_u32(9);
        encode_payload(&mut flat, &payload);
        flat.put_u32(10);
        assert_eq!(joined, flat.to_vec());
    }

    #[test]
    fn ddp_payload_is_taken_from_the_chunk() {
        // Reduced stream: a u32, then the payload's length word, then a u32
        // that followed the payload.
        let mut b = BytesMut::new();
        b.put_u32(42);
        b.put_u32(5);
        b.put_u32(43);
        let chunk = Bytes::from_static(b"hello");
        let mut d = Decoder::with_ddp(b.clone().freeze(), 8, chunk.clone().into());
        assert_eq!(d.u32("a").unwrap(), 42);
        let p = d.payload("data", 100).unwrap();
        assert_eq!(p.parts()[0].as_ptr(), chunk.as_ptr());
        assert_eq!(d.u32("b").unwrap(), 43);
        d.finish("m").unwrap();

        // A length that disagrees with the chunk is an error.
        let mut d = Decoder::with_ddp(b.clone().freeze(), 8, "hell".into());
        d.u32("a").unwrap();
        assert!(d.payload("data", 100).is_err());

        // A chunk that no payload claims is reported by finish().
        let mut d = Decoder::with_ddp(b.freeze(), 4, chunk.into());
        d.u32("a").unwrap();
        d.u32("b").unwrap();
        d.u32("c").unwrap();
        assert!(d.finish("m").is_err());
    }
}
