//! Encoding an RPC message with its DDP-eligible item moved out of the XDR
//! stream (RFC 8166 §3.4: "reduction").
//!
//! The item's length word stays in the stream; its contents and XDR padding
//! leave it. The item's position is the stream offset where the contents
//! would have begun.

use bytes::Bytes;
use nfsrdma_xdr::{IoVecSink, Payload, XdrSink};

/// A sink that gathers the stream like [`IoVecSink`] and, when reducing,
/// takes the first DDP-eligible payload out of it.
#[derive(Debug, Default)]
pub struct ReducingSink {
    stream: IoVecSink,
    reduce: bool,
    moved: Option<(usize, Payload)>,
    /// Length the stream would have without reduction.
    full_len: usize,
}

impl ReducingSink {
    /// A sink that reduces (`true`) or keeps everything in the stream.
    pub fn new(reduce: bool) -> Self {
        ReducingSink {
            reduce,
            ..Default::default()
        }
    }

    /// [`ReducingSink::new`] with room for a stream of `n` bytes.
    pub fn with_capacity(reduce: bool, n: usize) -> Self {
        ReducingSink {
            stream: IoVecSink::with_capacity(n),
            reduce,
            ..Default::default()
        }
    }

    /// Bytes in the (reduced) stream.
    pub fn len(&self) -> usize {
        self.stream.len()
    }

    /// True when nothing was encoded.
    pub fn is_empty(&self) -> bool {
        self.stream.is_empty() && self.moved.is_none()
    }

    /// Bytes the stream would hold had nothing been moved out.
    pub fn full_len(&self) -> usize {
        self.full_len
    }

    /// The moved item: its position and contents (without padding).
    pub fn moved(&self) -> Option<&(usize, Payload)> {
        self.moved.as_ref()
    }

    /// The stream's buffers and the moved item.
    pub fn finish(self) -> (Vec<Bytes>, Option<(usize, Payload)>) {
        (self.stream.into_parts(), self.moved)
    }
}

impl XdrSink for ReducingSink {
    fn put_raw(&mut self, bytes: &[u8]) {
        self.full_len += bytes.len();
        self.stream.put_raw(bytes);
    }

    fn put_u32_be(&mut self, v: u32) {
        self.full_len += 4;
        self.stream.put_u32_be(v);
    }

    fn put_u64_be(&mut self, v: u64) {
        self.full_len += 8;
        self.stream.put_u64_be(v);
    }

    fn put_payload(&mut self, payload: &Payload) {
        self.full_len += nfsrdma_xdr::roundup(payload.len());
        if self.reduce && self.moved.is_none() {
            self.moved = Some((self.stream.len(), payload.clone()));
        } else {
            self.stream.put_payload(payload);
        }
    }
}

/// The lengths a [`ReducingSink`] that reduces would find, without keeping
/// anything: a first pass that tells how a message will travel before it
/// is gathered once into a buffer of the right size.
#[derive(Debug, Default, Clone, Copy)]
pub struct SizingSink {
    full_len: usize,
    reduced_len: usize,
    moved: bool,
}

impl SizingSink {
    /// Bytes of the whole stream.
    pub fn full_len(&self) -> usize {
        self.full_len
    }

    /// Bytes of the stream with its first DDP-eligible item moved out
    /// ([`SizingSink::full_len`] when it has none).
    pub fn reduced_len(&self) -> usize {
        self.reduced_len
    }

    /// True when the stream has a DDP-eligible item.
    pub fn has_item(&self) -> bool {
        self.moved
    }
}

impl XdrSink for SizingSink {
    fn put_raw(&mut self, bytes: &[u8]) {
        self.full_len += bytes.len();
        self.reduced_len += bytes.len();
    }

    fn put_payload(&mut self, payload: &Payload) {
        let n = nfsrdma_xdr::roundup(payload.len());
        self.full_len += n;
        if self.moved {
            self.reduced_len += n;
        } else {
            self.moved = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfsrdma_xdr::nfs3::{Data, NfsFh3, StableHow, Write3Args};
    use nfsrdma_xdr::{Decoder, Xdr};

    #[test]
    fn sizing_agrees_with_the_sinks_that_keep_the_bytes() {
        for (data, two) in [(0usize, false), (5, false), (4096, false), (700, true)] {
            let a = Write3Args {
                file: NfsFh3::from("handle"),
                offset: 4096,
                count: data as u32,
                stable: StableHow::FileSync,
                data: Data::from(vec![7u8; data]),
            };
            let encode = |s: &mut dyn XdrSink| {
                a.encode(s);
                if two {
                    a.encode(s);
                }
            };
            let mut size = SizingSink::default();
            encode(&mut size);
            let mut reduced = ReducingSink::new(true);
            encode(&mut reduced);
            assert_eq!(size.full_len(), reduced.full_len());
            assert_eq!(size.reduced_len(), reduced.len());
            assert_eq!(size.has_item(), reduced.moved().is_some());
            let mut whole = IoVecSink::new();
            encode(&mut whole);
            assert_eq!(size.full_len(), whole.len());
        }
        let mut none = SizingSink::default();
        none.put_u32_be(1);
        assert_eq!(
            (none.full_len(), none.reduced_len(), none.has_item()),
            (4, 4, false)
        );
    }

    #[test]
    fn write_args_reduce_to_their_length_word_and_decode_back() {
        let a = Write3Args {
            file: NfsFh3::from("handle"),
            offset: 4096,
            count: 5,
            stable: StableHow::FileSync,
            data: Data::from("hello"),
        };
        let mut s = ReducingSink::new(true);
        a.encode(&mut s);
        assert_eq!(s.full_len(), a.encoded_len());
        let (parts, moved) = s.finish();
        let stream: Vec<u8> = parts.iter().flat_map(|p| p.to_vec()).collect();
        let (pos, data) = moved.unwrap();
        // fh (4 + 8) + offset 8 + count 4 + stable 4 + length word 4
        assert_eq!(pos, 32);
        assert_eq!(stream.len(), 32, "contents and padding left the stream");
        assert_eq!(&stream[28..32], &[0, 0, 0, 5], "the length word stays");
        let mut d = Decoder::with_ddp(Bytes::from(stream), pos, data);
        assert_eq!(Write3Args::decode(&mut d).unwrap(), a);
        d.finish("write").unwrap();
    }

    #[test]
    fn without_reduction_the_stream_is_whole() {
        let a = Data::from("abc");
        let mut s = ReducingSink::new(false);
        a.encode(&mut s);
        assert!(s.moved().is_none());
        assert_eq!(s.len(), 8);
    }
}
