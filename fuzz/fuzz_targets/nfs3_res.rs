//! NFSv3 results; the first byte picks the procedure.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::nfs3::{Nfs3Res, NfsProc3};
use nfsrdma_xdr::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let p = NfsProc3::ALL[usize::from(sel) % NfsProc3::ALL.len()];
    let mut d = Decoder::new(Bytes::copy_from_slice(rest));
    if let Ok(a) = Nfs3Res::decode(p, &mut d) {
        let mut enc = Vec::new();
        a.encode(&mut enc);
        assert_eq!(enc.len(), a.encoded_len());
        let back = Nfs3Res::decode(p, &mut Decoder::new(enc.into())).unwrap();
        assert_eq!(back, a);
    }
});
