//! NLM and NSM over UDP: a client's status monitor sends SM_NOTIFY over UDP
//! after it restarts, and some lock managers call over UDP. Only those two
//! programs are served here (NFS and MOUNT are TCP and RDMA only); each
//! datagram is one call, answered from the socket it came to.

use crate::service::{CallContext, Service};
use nfsrdma_xdr::rpc::{AcceptStat, MessageBody, RpcMessage};
use nfsrdma_xdr::{nlm, nsm, Decoder, Xdr};
use std::sync::Arc;
use tokio::net::UdpSocket;
use tokio::sync::watch;

/// The largest datagram taken.
const MAX_DATAGRAM: usize = 64 * 1024;

/// Serves NLM and NSM calls arriving on `sock` until `shutdown` turns true.
pub async fn serve(service: Arc<Service>, sock: UdpSocket, mut shutdown: watch::Receiver<bool>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "UDP receive failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let msg = bytes::Bytes::copy_from_slice(&buf[..n]);
        let mut d = Decoder::new(msg);
        let Ok(header) = RpcMessage::decode(&mut d) else {
            tracing::debug!(peer = %peer, "undecodable UDP datagram dropped");
            continue;
        };
        let MessageBody::Call(call) = &header.body else {
            continue;
        };
        let ctx = CallContext::from(peer);
        let reply = if call.prog == nlm::PROGRAM || call.prog == nsm::PROGRAM {
            service.handle_call(&ctx, header.xid, call, d)
        } else {
            Some(crate::service::Reply {
                header: RpcMessage::accepted(header.xid, AcceptStat::ProgUnavail),
                body: crate::service::ReplyBody::Void,
                class: None,
            })
        };
        if let Some(r) = reply {
            let mut out = bytes::BytesMut::new();
            r.encode(&mut out);
            if out.len() <= MAX_DATAGRAM {
                let _ = sock.send_to(&out, peer).await;
            }
        }
    }
}
