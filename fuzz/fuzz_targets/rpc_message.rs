//! An RPC message header, then (for NFSv3 calls) the procedure's arguments.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::{nfs3, rpc, Xdr};

fuzz_target!(|data: &[u8]| {
    let Ok((msg, mut rest)) = rpc::split_message(Bytes::copy_from_slice(data)) else {
        return;
    };
    // A decoded header re-encodes to something that decodes to itself.
    assert_eq!(rpc::RpcMessage::from_bytes(msg.to_bytes()).unwrap(), msg);
    if let Some(call) = msg.as_call() {
        let _ = call.cred.as_auth_sys();
        if call.prog == nfs3::PROGRAM {
            if let Some(p) = nfs3::NfsProc3::from_u32(call.proc_) {
                let _ = nfs3::Nfs3Args::decode(p, &mut rest);
            }
        }
    }
});
