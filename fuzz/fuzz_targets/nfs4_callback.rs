//! The NFSv4.1 callback program's CB_COMPOUND arguments and results
//! (what the server sends a client on its backchannel, and the client's
//! reply, which the server decodes): whatever decodes encodes back to
//! itself. The first byte picks which.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::nfs4::cb::{CbCompoundArgs, CbCompoundRes};
use nfsrdma_xdr::{Decoder, Xdr};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let input = Bytes::copy_from_slice(rest);
    if sel & 1 == 0 {
        if let Ok(a) = CbCompoundArgs::decode(&mut Decoder::new(input)) {
            let mut enc = Vec::new();
            a.encode(&mut enc);
            assert_eq!(enc.len(), a.encoded_len());
            let back = CbCompoundArgs::decode(&mut Decoder::new(enc.into())).unwrap();
            assert_eq!(back, a);
        }
    } else if let Ok(r) = CbCompoundRes::decode(&mut Decoder::new(input)) {
        let mut enc = Vec::new();
        r.encode(&mut enc);
        assert_eq!(enc.len(), r.encoded_len());
        let back = CbCompoundRes::decode(&mut Decoder::new(enc.into())).unwrap();
        assert_eq!(back, r);
    }
});
