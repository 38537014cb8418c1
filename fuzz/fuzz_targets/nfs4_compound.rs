//! NFSv4 COMPOUND arguments (the server's lenient decoder: the operations
//! that decode must encode back to themselves) and results (strict).
//! The first byte picks which.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::nfs4::{Compound4Args, Compound4Res};
use nfsrdma_xdr::{Decoder, Xdr};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let input = Bytes::copy_from_slice(rest);
    if sel & 1 == 0 {
        if let Ok((a, _cut)) = Compound4Args::decode_lenient(&mut Decoder::new(input)) {
            let mut enc = Vec::new();
            a.encode(&mut enc);
            assert_eq!(enc.len(), a.encoded_len());
            let back = Compound4Args::decode(&mut Decoder::new(enc.into())).unwrap();
            assert_eq!(back, a);
        }
    } else if let Ok(r) = Compound4Res::decode(&mut Decoder::new(input)) {
        let mut enc = Vec::new();
        r.encode(&mut enc);
        assert_eq!(enc.len(), r.encoded_len());
        let back = Compound4Res::decode(&mut Decoder::new(enc.into())).unwrap();
        assert_eq!(back, r);
    }
});
