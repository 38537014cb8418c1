//! The data the bench writes: every byte is a function of its file offset
//! and of the pass that wrote it, so a read can be checked without keeping
//! what was written.

use bytes::Bytes;

/// The 64-bit word that covers file offsets `8 * index .. 8 * index + 8`
/// in pass `pass` (a splitmix64 finalizer over both).
fn word(index: u64, pass: u64) -> u64 {
    let mut z = index
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(pass.wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The byte at file offset `offset` in pass `pass`.
pub fn byte_at(offset: u64, pass: u64) -> u8 {
    word(offset / 8, pass).to_le_bytes()[(offset % 8) as usize]
}

/// Fills `buf` with the bytes of file offsets `offset ..` in pass `pass`.
pub fn fill(buf: &mut [u8], offset: u64, pass: u64) {
    let mut i = 0usize;
    // Up to the next 8-byte boundary one byte at a time, then whole words.
    while i < buf.len() && !(offset + i as u64).is_multiple_of(8) {
        buf[i] = byte_at(offset + i as u64, pass);
        i += 1;
    }
    let mut chunks = buf[i..].chunks_exact_mut(8);
    let mut index = (offset + i as u64) / 8;
    for c in &mut chunks {
        c.copy_from_slice(&word(index, pass).to_le_bytes());
        index += 1;
    }
    let rest = chunks.into_remainder();
    let base = index * 8;
    for (j, b) in rest.iter_mut().enumerate() {
        *b = byte_at(base + j as u64, pass);
    }
}

/// A record of `len` bytes at `offset` in pass `pass`.
pub fn record(offset: u64, len: usize, pass: u64) -> Bytes {
    let mut v = vec![0u8; len];
    fill(&mut v, offset, pass);
    Bytes::from(v)
}

/// The first difference between `data` (the bytes read at `offset`, in
/// pieces) and pass `pass`: its file offset, the byte expected and the
/// byte found. `scratch` is reused between calls.
pub fn first_mismatch(
    parts: &[Bytes],
    offset: u64,
    pass: u64,
    scratch: &mut Vec<u8>,
) -> Option<(u64, u8, u8)> {
    let mut at = offset;
    for p in parts {
        scratch.clear();
        scratch.resize(p.len(), 0);
        fill(scratch, at, pass);
        if scratch[..] != p[..] {
            let i = scratch
                .iter()
                .zip(p.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some((at + i as u64, scratch[i], p[i]));
        }
        at += p.len() as u64;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_agrees_with_byte_at_at_any_alignment() {
        for offset in [0u64, 1, 7, 8, 13, 4093] {
            for len in [0usize, 1, 5, 8, 9, 64, 100] {
                let r = record(offset, len, 3);
                for (i, b) in r.iter().enumerate() {
                    assert_eq!(*b, byte_at(offset + i as u64, 3));
                }
            }
        }
    }

    #[test]
    fn passes_differ_and_mismatches_are_located() {
        assert_ne!(record(0, 64, 1), record(0, 64, 2));
        let good = record(4096, 4096, 5);
        let mut scratch = Vec::new();
        let parts = [good.slice(0..1000), good.slice(1000..4096)];
        assert_eq!(first_mismatch(&parts, 4096, 5, &mut scratch), None);
        let mut bad = good.to_vec();
        bad[1500] ^= 0xff;
        let bad = Bytes::from(bad);
        let parts = [bad.slice(0..1000), bad.slice(1000..4096)];
        let (at, want, got) = first_mismatch(&parts, 4096, 5, &mut scratch).unwrap();
        assert_eq!(at, 4096 + 1500);
        assert_eq!(want ^ 0xff, got);
    }
}
