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

    fn put_payload(&mut self, payload: &Payload) {
        self.full_len += nfsrdma_xdr::roundup(payload.len());
        if self.reduce && self.moved.is_none() {
            self.moved = Some((self.stream.len(), payload.clone()));
        } else {
            self.stream.put_payload(payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfsrdma_xdr::nfs3::{Data, NfsFh3, StableHow, Write3Args};
    use nfsrdma_xdr::{Decoder, Xdr};

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
