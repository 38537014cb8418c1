//! Record-marking reassembly with the input fed in pieces whose sizes come
//! from the input itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::record::RecordReader;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let piece = usize::from(data[0] % 17) + 1;
    let mut r = RecordReader::new(4096).with_max_fragments(64);
    let mut out = 0usize;
    for chunk in data[1..].chunks(piece) {
        r.extend(chunk);
        loop {
            match r.next_record() {
                Ok(Some(rec)) => {
                    assert!(rec.len() <= 4096);
                    out += rec.len();
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    // Records never hold more than what came in.
    assert!(out + r.buffered() <= data.len());
});
