//! The responder's handling of a received message: classification against
//! a connection's settings (taken from the first bytes), assembly of the
//! call from chunk data of the announced sizes, and reply planning.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_rpcrdma::responder::{self, Received, ResponderConfig};
use nfsrdma_xdr::{Payload, XdrSink};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let cfg = ResponderConfig {
        inline_send: 1024 * (u32::from(data[0] % 8) + 1),
        inline_recv: 4096,
        credits: u32::from(data[1]) + 1,
        remote_invalidation: data[2] & 1 == 1,
        max_call: 1 << 20,
    };
    match responder::receive(Bytes::copy_from_slice(&data[3..]), &cfg) {
        Received::Call(call) => {
            let chunks: Vec<Payload> = call
                .read_chunks
                .iter()
                .map(|c| Payload::from(vec![0x5au8; c.total_len() as usize]))
                .collect();
            if let Ok(mut d) = call.assemble(chunks) {
                while d.u32("word").is_ok() {}
            }
            let _ = call.invalidate_rkey(&cfg);
            let echo = call.inline.clone();
            let _ = responder::plan_reply(&call, &cfg, |s: &mut dyn XdrSink| {
                s.put_raw(&echo);
                nfsrdma_xdr::encode_payload(s, &Payload::from(vec![1u8; 3000]));
            });
        }
        Received::Discard(_) => {}
        Received::Error { reply, .. } => assert!(reply.len() >= 20),
    }
});
