//! [`Payload`]: the bytes of one DDP-eligible item, possibly in several
//! pieces (for example the store blocks a READ covers), carried without
//! copying.

use bytes::{Bytes, BytesMut};

/// The contents of a DDP-eligible item as one or more `Bytes` pieces, in
/// order. Equality and hashing look at the contents, not at how they are cut.
#[derive(Clone, Default)]
pub struct Payload {
    repr: Repr,
    len: usize,
    attachment: Option<Attachment>,
}

/// Something the producer of a payload attaches for its consumer (for
/// example the registered blocks an RDMA Read landed the data in, which a
/// store can take over instead of copying). Not part of the contents.
pub type Attachment = std::sync::Arc<dyn std::any::Any + Send + Sync>;

#[derive(Clone)]
enum Repr {
    One(Bytes),
    Many(Vec<Bytes>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::One(Bytes::new())
    }
}

impl Payload {
    /// An empty payload.
    pub fn new() -> Self {
        Payload::default()
    }

    /// A payload made of `parts`, in order (empty parts are dropped).
    pub fn from_parts(parts: impl IntoIterator<Item = Bytes>) -> Self {
        let mut v: Vec<Bytes> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        let len = v.iter().map(Bytes::len).sum();
        let repr = match v.len() {
            0 => Repr::One(Bytes::new()),
            1 => Repr::One(v.pop().expect("one part")),
            _ => Repr::Many(v),
        };
        Payload {
            repr,
            len,
            attachment: None,
        }
    }

    /// The payload with `a` attached.
    pub fn with_attachment(mut self, a: Attachment) -> Self {
        self.attachment = Some(a);
        self
    }

    /// What the producer attached, if anything.
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the payload holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Bytes] {
        match &self.repr {
            Repr::One(b) => std::slice::from_ref(b),
            Repr::Many(v) => v,
        }
    }

    /// Appends a piece.
    pub fn push(&mut self, part: Bytes) {
        if part.is_empty() {
            return;
        }
        self.len += part.len();
        match &mut self.repr {
            Repr::One(b) if b.is_empty() => *b = part,
            Repr::One(b) => {
                let first = std::mem::take(b);
                self.repr = Repr::Many(vec![first, part]);
            }
            Repr::Many(v) => v.push(part),
        }
    }

    /// The contents as one buffer: free for a single piece, a copy for
    /// several.
    pub fn to_contiguous(&self) -> Bytes {
        match &self.repr {
            Repr::One(b) => b.clone(),
            Repr::Many(v) => {
                let mut out = BytesMut::with_capacity(self.len);
                for p in v {
                    out.extend_from_slice(p);
                }
                out.freeze()
            }
        }
    }

    /// The bytes in `range`, sharing this payload's pieces (no copy).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Payload {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "slice out of range"
        );
        let mut out = Payload::new();
        let mut at = 0usize;
        for p in self.parts() {
            let (s, e) = (at, at + p.len());
            at = e;
            if e <= range.start || s >= range.end {
                continue;
            }
            let from = range.start.max(s) - s;
            let to = range.end.min(e) - s;
            out.push(p.slice(from..to));
        }
        out
    }

    /// Iterates over every byte (for checksums and tests).
    pub fn bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.parts().iter().flat_map(|p| p.iter().copied())
    }

    /// Copies the contents into `out` (which must be `len()` long).
    pub fn copy_to_slice(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len, "copy_to_slice: length mismatch");
        let mut at = 0;
        for p in self.parts() {
            out[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Self {
        Payload {
            len: b.len(),
            repr: Repr::One(b),
            attachment: None,
        }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        Payload::from(Bytes::from(v))
    }
}

impl From<&'static str> for Payload {
    fn from(s: &'static str) -> Self {
        Payload::from(Bytes::from_static(s.as_bytes()))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.bytes().eq(other.bytes())
    }
}

impl Eq for Payload {}

impl std::hash::Hash for Payload {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.len);
        for p in self.parts() {
            state.write(p);
        }
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.len <= 64 {
            write!(f, "Payload({:?})", self.to_contiguous())
        } else {
            write!(
                f,
                "Payload({} bytes in {} parts)",
                self.len,
                self.parts().len()
            )
        }
    }
}

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for Payload {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4)
            .prop_map(|parts| Payload::from_parts(parts.into_iter().map(Bytes::from)))
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_compare_by_contents() {
        let a = Payload::from_parts([Bytes::from_static(b"ab"), Bytes::from_static(b"cde")]);
        let b = Payload::from(Bytes::from_static(b"abcde"));
        assert_eq!(a, b);
        assert_eq!(a.len(), 5);
        assert_eq!(a.parts().len(), 2);
        assert_eq!(&a.to_contiguous()[..], b"abcde");
        let mut c = Payload::new();
        c.push(Bytes::from_static(b"ab"));
        c.push(Bytes::new());
        c.push(Bytes::from_static(b"cde"));
        assert_eq!(c, a);
        let mut out = [0u8; 5];
        c.copy_to_slice(&mut out);
        assert_eq!(&out, b"abcde");
    }

    #[test]
    fn slices_share_pieces() {
        let a = Payload::from_parts([
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"defg"),
            Bytes::from_static(b"hi"),
        ]);
        assert_eq!(a.slice(0..9), a);
        assert_eq!(a.slice(2..8).to_contiguous(), Bytes::from_static(b"cdefgh"));
        assert_eq!(a.slice(2..8).parts().len(), 3);
        assert_eq!(a.slice(3..7).parts().len(), 1);
        assert!(a.slice(4..4).is_empty());
    }

    #[test]
    fn single_piece_is_not_copied() {
        let b = Bytes::from(vec![1u8; 100]);
        let p = Payload::from(b.clone());
        assert_eq!(p.to_contiguous().as_ptr(), b.as_ptr());
    }
}
