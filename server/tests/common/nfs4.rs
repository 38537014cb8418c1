//! A raw NFSv4.1/4.2 client over TCP for the server's tests: one client
//! record and session, COMPOUNDs with SEQUENCE, opens and locks.

use super::RawClient;
use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::nfs4::attr::SetAttrs;
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::{BoundedVec, Xdr};

/// A client with one session.
pub struct V4 {
    pub c: RawClient,
    pub clientid: u64,
    pub sid: SessionId4,
    pub seq: Vec<u32>,
    pub owner: &'static str,
}

pub fn compound(c: &mut RawClient, minor: u32, tag: &str, ops: Vec<ArgOp>) -> Compound4Res {
    let a = Compound4Args {
        tag: Utf8Str(Bytes::copy_from_slice(tag.as_bytes())),
        minorversion: minor,
        ops,
    };
    let mut b = BytesMut::new();
    a.encode(&mut b);
    let (h, mut d) = c.call(PROGRAM, VERSION, PROC_COMPOUND, &b);
    super::assert_success(&h);
    let r = Compound4Res::decode(&mut d).unwrap();
    d.finish("COMPOUND4res").unwrap();
    r
}

pub fn fore() -> ChannelAttrs4 {
    ChannelAttrs4 {
        headerpadsize: 0,
        maxrequestsize: 1 << 20,
        maxresponsesize: 1 << 20,
        maxresponsesize_cached: 8192,
        maxoperations: 16,
        maxrequests: 8,
        rdma_ird: BoundedVec(vec![]),
    }
}

pub fn exchange_id(owner: &str, verifier: u8) -> ArgOp {
    ArgOp::ExchangeId(ExchangeIdArgs {
        clientowner: ClientOwner4 {
            verifier: [verifier; 8],
            ownerid: Opaque4(Bytes::copy_from_slice(owner.as_bytes())),
        },
        flags: 0,
        state_protect: StateProtectA::None,
        client_impl_id: BoundedVec(vec![]),
    })
}

/// CREATE_SESSION without a backchannel: the server calls nothing back,
/// and grants no delegation.
pub fn create_session(clientid: u64, sequence: u32) -> ArgOp {
    let ArgOp::CreateSession(mut a) = create_session_back(clientid, sequence) else {
        unreachable!()
    };
    a.flags = 0;
    ArgOp::CreateSession(a)
}

/// CREATE_SESSION asking for a backchannel on the connection.
pub fn create_session_back(clientid: u64, sequence: u32) -> ArgOp {
    ArgOp::CreateSession(CreateSessionArgs {
        clientid,
        sequence,
        flags: session_flags::CONN_BACK_CHAN,
        fore_chan_attrs: fore(),
        back_chan_attrs: fore(),
        cb_program: 0x4000_0000,
        sec_parms: BoundedVec(vec![CallbackSecParms::None]),
    })
}

/// COPY (synchronous, within the server) of the whole source, the saved
/// handle, to the start of the current one.
pub fn copy_whole(src: Stateid4, dst: Stateid4) -> ArgOp {
    ArgOp::Copy(CopyArgs {
        src_stateid: src,
        dst_stateid: dst,
        src_offset: 0,
        dst_offset: 0,
        count: 0,
        consecutive: true,
        synchronous: true,
        source_server: BoundedVec(vec![]),
    })
}

pub fn ok<T: std::fmt::Debug>(r: &Res<T>) -> &T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

impl V4 {
    /// A client record and session, and RECLAIM_COMPLETE: it may open.
    pub fn new(addr: std::net::SocketAddr, owner: &'static str) -> V4 {
        let mut v = V4::reclaiming(addr, owner);
        let r = v.run(vec![ArgOp::ReclaimComplete(false)]);
        assert_eq!(r.status, Status::OK, "{r:?}");
        v
    }

    /// A client record and session that has not said RECLAIM_COMPLETE:
    /// after a server's restart, it may reclaim. No backchannel.
    pub fn reclaiming(addr: std::net::SocketAddr, owner: &'static str) -> V4 {
        V4::session(addr, owner, false)
    }

    /// As [`V4::reclaiming`], with a backchannel on the connection whose
    /// probe (CB_NULL) was answered.
    pub fn reclaiming_with_back(addr: std::net::SocketAddr, owner: &'static str) -> V4 {
        V4::session(addr, owner, true)
    }

    /// As [`V4::new`], with a backchannel on the connection whose probe
    /// (CB_NULL) was answered.
    pub fn with_back(addr: std::net::SocketAddr, owner: &'static str) -> V4 {
        let mut v = V4::session(addr, owner, true);
        let r = v.run(vec![ArgOp::ReclaimComplete(false)]);
        assert_eq!(r.status, Status::OK, "{r:?}");
        v
    }

    fn session(addr: std::net::SocketAddr, owner: &'static str, back: bool) -> V4 {
        let mut c = RawClient::connect(addr);
        let r = compound(&mut c, 1, "eid", vec![exchange_id(owner, 1)]);
        let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
            panic!("{r:?}");
        };
        assert_eq!(
            e.flags & exchgid::CONFIRMED_R,
            0,
            "a new record is unconfirmed"
        );
        let (clientid, seq) = (e.clientid, e.sequenceid);
        let cs = if back {
            create_session_back(clientid, seq)
        } else {
            create_session(clientid, seq)
        };
        let r = compound(&mut c, 1, "cs", vec![cs]);
        let ResOp::CreateSession(Ok(s)) = &r.results[0] else {
            panic!("{r:?}");
        };
        assert_eq!(
            s.flags & session_flags::CONN_BACK_CHAN != 0,
            back,
            "a backchannel on the session's TCP connection when asked for"
        );
        assert_eq!(s.fore_chan_attrs.maxrequests, 8);
        if back {
            // The server probes the backchannel with CB_NULL: answered
            // here, the path is up, and SEQUENCE reports no flag.
            let call = c
                .next_call(std::time::Duration::from_secs(10))
                .expect("CB_NULL on the new session's connection");
            let (h, _) = nfsrdma_xdr::rpc::split_message(call).unwrap();
            let body = h.as_call().expect("a call");
            assert_eq!((body.prog, body.vers, body.proc_), (0x4000_0000, 1, 0));
        }
        V4 {
            c,
            clientid,
            sid: s.sessionid,
            seq: vec![0; 8],
            owner,
        }
    }

    pub fn seq_op(&mut self, slot: u32, cachethis: bool) -> ArgOp {
        self.seq[slot as usize] += 1;
        ArgOp::Sequence(SequenceArgs {
            sessionid: self.sid,
            sequenceid: self.seq[slot as usize],
            slotid: slot,
            highest_slotid: 7,
            cachethis,
        })
    }

    /// SEQUENCE (slot 0, reply not cached) and `ops`, minor version 2.
    pub fn run(&mut self, ops: Vec<ArgOp>) -> Compound4Res {
        self.run_cached(ops, false)
    }

    pub fn run_cached(&mut self, ops: Vec<ArgOp>, cachethis: bool) -> Compound4Res {
        let mut all = vec![self.seq_op(0, cachethis)];
        all.extend(ops);
        let r = compound(&mut self.c, 2, "t", all);
        // No status flag: in particular no CB_PATH_DOWN, which would send
        // a Linux client to BIND_CONN_TO_SESSION after every call.
        assert_eq!(
            ok(match &r.results[0] {
                ResOp::Sequence(s) => s,
                other => panic!("{other:?}"),
            })
            .status_flags,
            0
        );
        r
    }

    pub fn open(&mut self, name: &str, create: bool) -> (Stateid4, Fh4) {
        let how = create.then(|| CreateHow4::Unchecked(SetAttrs::default().to_fattr()));
        let r = self.run(vec![
            ArgOp::Putrootfh,
            ArgOp::Lookup("export".into()),
            ArgOp::Open(OpenArgs {
                seqid: 0,
                share_access: share::ACCESS_BOTH,
                share_deny: 0,
                owner: StateOwner4 {
                    clientid: self.clientid,
                    owner: Opaque4(Bytes::from_static(self.owner.as_bytes())),
                },
                openhow: how,
                claim: OpenClaim4::Null(Utf8Str(Bytes::copy_from_slice(name.as_bytes()))),
            }),
            ArgOp::Getfh,
        ]);
        assert_eq!(r.status, Status::OK, "{r:?}");
        let ResOp::Open(Ok(o)) = &r.results[3] else {
            panic!("{r:?}")
        };
        let ResOp::Getfh(Ok(fh)) = &r.results[4] else {
            panic!("{r:?}")
        };
        (o.stateid, fh.clone())
    }

    pub fn lock(
        &mut self,
        fh: &Fh4,
        open: Stateid4,
        offset: u64,
        length: u64,
    ) -> LockRes<Stateid4> {
        let r = self.run(vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Lock(LockArgs {
                locktype: LockType4::Write,
                reclaim: false,
                offset,
                length,
                locker: Locker4::New(OpenToLockOwner {
                    open_seqid: 0,
                    open_stateid: open,
                    lock_seqid: 0,
                    lock_owner: StateOwner4 {
                        clientid: self.clientid,
                        owner: Opaque4(Bytes::from_static(b"lock owner")),
                    },
                }),
            }),
        ]);
        match r.results.last() {
            Some(ResOp::Lock(l)) => l.clone(),
            other => panic!("{other:?}"),
        }
    }
}
