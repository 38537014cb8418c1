//! The RPC-over-RDMA version 1 transport header.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::rpcrdma::{FixedHeader, RdmaHeader};
use nfsrdma_xdr::{Decoder, Xdr};

fuzz_target!(|data: &[u8]| {
    let _ = FixedHeader::peek(data);
    let mut d = Decoder::new(Bytes::copy_from_slice(data));
    if let Ok(h) = RdmaHeader::decode(&mut d) {
        let enc = h.to_bytes();
        assert_eq!(enc.len(), h.encoded_len());
        assert_eq!(RdmaHeader::from_bytes(enc).unwrap(), h);
    }
});
