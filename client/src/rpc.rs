//! Typed RPC calls over any [`Transport`].

use crate::error::ClientError;
use crate::transport::{ReplyExpect, RpcCall, Transport};
use nfsrdma_xdr::rpc::OpaqueAuth;
use nfsrdma_xdr::{Xdr, XdrSink};

/// Where a call goes: program, version, procedure, and a name for logs.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// Name for logs and errors.
    pub name: &'static str,
}

/// Calls `target` with `args` and decodes a result of type `R`. Bytes
/// after the result are ignored.
pub async fn call<A, R>(
    t: &dyn Transport,
    cred: &OpaqueAuth,
    target: Target,
    args: &A,
    expect: ReplyExpect,
) -> Result<R, ClientError>
where
    A: Xdr + Sync,
    R: Xdr,
{
    let encode = |s: &mut dyn XdrSink| args.encode(s);
    let mut d = t
        .call(RpcCall {
            prog: target.prog,
            vers: target.vers,
            proc_: target.proc_,
            name: target.name,
            cred,
            args: &encode,
            expect,
        })
        .await?;
    Ok(R::decode(&mut d)?)
}
