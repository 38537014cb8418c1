//! ONC RPC record marking over a byte stream (RFC 5531 §11).
//!
//! Each fragment is preceded by a four-byte marker: the high bit says "last
//! fragment of the record", the low 31 bits give the fragment's length.
//! [`RecordReader`] reassembles records with a maximum record size; a peer
//! that claims more is refused as soon as the marker arrives, before any of
//! the claimed bytes are buffered. A claim within the maximum is not trusted
//! either: the receive buffer grows as the bytes arrive, never more than
//! [`DEFAULT_RESERVE_AHEAD`] (or the reader's own setting) ahead of them.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The last-fragment bit of a record marker.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Largest length one fragment can carry.
pub const MAX_FRAGMENT: u32 = 0x7fff_ffff;
/// Bytes a [`RecordReader`] reserves at most ahead of those received for the
/// rest of a fragment, unless [`RecordReader::with_reserve_ahead`] says
/// otherwise.
pub const DEFAULT_RESERVE_AHEAD: usize = 64 * 1024;

/// A record-marking failure; the stream cannot be resynchronised after one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The record grew past the reader's maximum.
    #[error("record of at least {claimed} bytes exceeds the maximum record size of {max}")]
    TooLarge {
        /// Bytes the record would hold (already buffered plus the new fragment's claim).
        claimed: u64,
        /// The reader's maximum.
        max: usize,
    },
    /// More fragments than the reader allows in one record.
    #[error("record has more than {max} fragments")]
    TooManyFragments {
        /// The reader's maximum.
        max: usize,
    },
}

/// The four-byte marker for a fragment of `len` bytes.
pub fn marker(len: u32, last: bool) -> [u8; 4] {
    debug_assert!(len <= MAX_FRAGMENT);
    let v = (len & MAX_FRAGMENT) | if last { LAST_FRAGMENT } else { 0 };
    v.to_be_bytes()
}

/// Appends `record` as one fragment.
pub fn write_record<B: BufMut>(out: &mut B, record: &[u8]) {
    out.put_slice(&marker(record.len() as u32, true));
    out.put_slice(record);
}

/// Reassembles records from a byte stream.
///
/// Feed received bytes with [`RecordReader::extend`] (or read straight into
/// [`RecordReader::buffer_mut`]), then take complete records with
/// [`RecordReader::next_record`]. A record that arrives as a single fragment
/// is returned as a slice of the receive buffer (no copy); a multi-fragment
/// record is joined into one buffer.
///
/// A marker's claim does not allocate: while a fragment's body is awaited
/// the reader makes room for at most its reserve-ahead (64 KiB by default)
/// beyond the bytes buffered, so a peer that claims a large fragment and
/// sends little of it costs little.
#[derive(Debug)]
pub struct RecordReader {
    max_record: usize,
    max_fragments: usize,
    reserve_ahead: usize,
    buf: BytesMut,
    /// Fragments of the record being assembled (all but the last).
    pending: Vec<Bytes>,
    pending_len: usize,
    /// The marker of the fragment whose body is being waited for.
    current: Option<(usize, bool)>,
}

impl RecordReader {
    /// Fragments per record allowed by [`RecordReader::new`].
    pub const DEFAULT_MAX_FRAGMENTS: usize = 1024;

    /// A reader refusing records larger than `max_record` bytes.
    pub fn new(max_record: usize) -> Self {
        RecordReader {
            max_record,
            max_fragments: Self::DEFAULT_MAX_FRAGMENTS,
            reserve_ahead: DEFAULT_RESERVE_AHEAD,
            buf: BytesMut::new(),
            pending: Vec::new(),
            pending_len: 0,
            current: None,
        }
    }

    /// Sets the largest number of fragments one record may have.
    pub fn with_max_fragments(mut self, n: usize) -> Self {
        self.max_fragments = n.max(1);
        self
    }

    /// Sets how far ahead of the bytes received the reader may reserve room
    /// for the rest of a fragment: a small value for untrusted peers, up to
    /// `usize::MAX` (room for the whole claimed fragment at its marker) for a
    /// peer that is trusted to send what it claims.
    pub fn with_reserve_ahead(mut self, n: usize) -> Self {
        self.reserve_ahead = n;
        self
    }

    /// The largest record accepted.
    pub fn max_record(&self) -> usize {
        self.max_record
    }

    /// Bytes still missing before the fragment being received is complete
    /// (before the next marker is: the rest of its four bytes).
    pub fn wanted(&self) -> usize {
        match self.current {
            Some((len, _)) => len.saturating_sub(self.buf.len()),
            None => 4usize.saturating_sub(self.buf.len()),
        }
    }

    /// The receive buffer, to read into directly.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Appends received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered but not yet returned as part of a record.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.pending_len
    }

    /// The next complete record, `Ok(None)` when more bytes are needed.
    pub fn next_record(&mut self) -> Result<Option<Bytes>, RecordError> {
        loop {
            let (len, last) = match self.current {
                Some(c) => c,
                None => {
                    if self.buf.len() < 4 {
                        return Ok(None);
                    }
                    let m = self.buf.get_u32();
                    let len = (m & MAX_FRAGMENT) as usize;
                    let last = m & LAST_FRAGMENT != 0;
                    let total = self.pending_len as u64 + len as u64;
                    if total > self.max_record as u64 {
                        return Err(RecordError::TooLarge {
                            claimed: total,
                            max: self.max_record,
                        });
                    }
                    if !last && self.pending.len() + 1 >= self.max_fragments {
                        return Err(RecordError::TooManyFragments {
                            max: self.max_fragments,
                        });
                    }
                    self.current = Some((len, last));
                    (len, last)
                }
            };
            if self.buf.len() < len {
                // Room for (part of) the rest of this fragment, no further
                // ahead of the bytes received than allowed.
                let want = (len - self.buf.len()).min(self.reserve_ahead);
                if self.buf.capacity() - self.buf.len() < want {
                    self.buf.reserve(want);
                }
                return Ok(None);
            }
            self.current = None;
            let frag = self.buf.split_to(len).freeze();
            if last {
                if self.pending.is_empty() {
                    return Ok(Some(frag));
                }
                let mut joined = BytesMut::with_capacity(self.pending_len + frag.len());
                for p in self.pending.drain(..) {
                    joined.extend_from_slice(&p);
                }
                joined.extend_from_slice(&frag);
                self.pending_len = 0;
                return Ok(Some(joined.freeze()));
            }
            self.pending_len += frag.len();
            self.pending.push(frag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_fragment_record_is_not_copied() {
        let mut r = RecordReader::new(1 << 20);
        let mut wire = BytesMut::new();
        write_record(&mut wire, &[5u8; 100]);
        write_record(&mut wire, b"abcd");
        r.extend(&wire);
        let a = r.next_record().unwrap().unwrap();
        assert_eq!(&a[..], &[5u8; 100][..]);
        let b = r.next_record().unwrap().unwrap();
        assert_eq!(&b[..], b"abcd");
        assert_eq!(r.next_record().unwrap(), None);
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn fragments_are_joined_and_bytes_may_trickle_in() {
        let mut wire = BytesMut::new();
        wire.put_slice(&marker(3, false));
        wire.put_slice(b"abc");
        wire.put_slice(&marker(0, false));
        wire.put_slice(&marker(2, true));
        wire.put_slice(b"de");
        let mut r = RecordReader::new(100);
        for (i, byte) in wire.iter().enumerate() {
            r.extend(&[*byte]);
            let got = r.next_record().unwrap();
            if i + 1 < wire.len() {
                assert_eq!(got, None, "record complete too early at byte {i}");
            } else {
                assert_eq!(&got.unwrap()[..], b"abcde");
            }
        }
    }

    #[test]
    fn a_4_gib_claim_is_refused_at_the_marker() {
        let mut r = RecordReader::new(1 << 20);
        r.extend(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            r.next_record(),
            Err(RecordError::TooLarge {
                claimed: 0x7fff_ffff,
                max: 1 << 20
            })
        );
    }

    #[test]
    fn a_large_claim_allocates_only_as_bytes_arrive() {
        // A claim of 1 GiB within a 2 GiB maximum, then 10 bytes.
        let mut r = RecordReader::new(2 << 30);
        r.extend(&marker(1 << 30, true));
        r.extend(&[7; 10]);
        assert_eq!(r.next_record(), Ok(None));
        assert_eq!(r.wanted(), (1 << 30) - 10);
        assert!(
            r.buffer_mut().capacity() <= 2 * DEFAULT_RESERVE_AHEAD,
            "reserved {} bytes for 10 received",
            r.buffer_mut().capacity()
        );
        // The buffer keeps growing with what arrives, and the record comes
        // out whole.
        let mut r = RecordReader::new(1 << 20);
        let body: Vec<u8> = (0..(1 << 20) - 4).map(|i| i as u8).collect();
        r.extend(&marker(body.len() as u32, true));
        let mut peak = 0;
        for chunk in body.chunks(10_000) {
            assert_eq!(r.next_record(), Ok(None));
            let cap = r.buffer_mut().capacity();
            peak = peak.max(cap);
            assert!(
                cap <= 2 * (r.buffered() + DEFAULT_RESERVE_AHEAD),
                "capacity {cap} for {} bytes buffered",
                r.buffered()
            );
            r.extend(chunk);
        }
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &body[..]);
        assert!(peak >= body.len() / 2, "peak {peak}");
    }

    #[test]
    fn a_trusted_peer_may_have_its_claim_reserved_at_once() {
        let mut r = RecordReader::new(1 << 20).with_reserve_ahead(usize::MAX);
        r.extend(&marker(1 << 19, true));
        assert_eq!(r.next_record(), Ok(None));
        assert!(r.buffer_mut().capacity() >= 1 << 19);
    }

    #[test]
    fn oversize_across_fragments_is_refused() {
        let mut r = RecordReader::new(10);
        r.extend(&marker(8, false));
        r.extend(&[0; 8]);
        r.extend(&marker(3, true));
        assert!(matches!(
            r.next_record(),
            Err(RecordError::TooLarge { claimed: 11, .. })
        ));
    }

    #[test]
    fn endless_empty_fragments_are_refused() {
        let mut r = RecordReader::new(10).with_max_fragments(4);
        for _ in 0..5 {
            r.extend(&marker(0, false));
        }
        assert!(matches!(
            r.next_record(),
            Err(RecordError::TooManyFragments { max: 4 })
        ));
    }
}
