//! The RFC 8797 connection private message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::rpcrdma::CmPrivate;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = CmPrivate::decode(data) {
        assert_eq!(CmPrivate::decode(&m.encode()).unwrap(), m);
        assert!((1024..=256 * 1024).contains(&m.send_size));
        assert!((1024..=256 * 1024).contains(&m.recv_size));
    }
    let _ = CmPrivate::from_peer(Some(data));
});
