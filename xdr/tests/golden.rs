//! Byte-exact golden vectors from fixtures/xdr, written by hand from the RFC
//! layouts: each decodes to the expected value and re-encodes to the same
//! bytes.

use bytes::Bytes;
use nfsrdma_xdr::mount::{self, MountRes3, MountRes3Ok};
use nfsrdma_xdr::nfs3::{self, NfsResult};
use nfsrdma_xdr::rpc::{self, AcceptStat, AuthSysParms, OpaqueAuth, RejectedReply, RpcMessage};
use nfsrdma_xdr::rpcrdma::{
    ChunkLists, CmPrivate, RdmaBody, RdmaError, RdmaHeader, RdmaSegment, ReadSegment, WriteChunk,
};
use nfsrdma_xdr::{portmap, BoundedVec, Decoder, List, Xdr};
use std::path::PathBuf;

fn fixture(name: &str) -> Bytes {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/xdr")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap();
        for word in line.split_whitespace() {
            assert!(word.len() % 2 == 0, "{name}: odd hex word {word}");
            for i in (0..word.len()).step_by(2) {
                out.push(u8::from_str_radix(&word[i..i + 2], 16).unwrap());
            }
        }
    }
    Bytes::from(out)
}

fn golden<T: Xdr + PartialEq + std::fmt::Debug>(name: &str, expected: T) {
    let bytes = fixture(name);
    let decoded = T::from_bytes(bytes.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(decoded, expected, "{name}: decoded value");
    assert_eq!(&expected.to_bytes()[..], &bytes[..], "{name}: encoding");
    assert_eq!(expected.encoded_len(), bytes.len(), "{name}: encoded_len");
}

fn seg(handle: u32, length: u32, offset: u64) -> RdmaSegment {
    RdmaSegment {
        handle,
        length,
        offset,
    }
}

#[test]
fn rdma_msg_without_chunks_is_28_bytes() {
    assert_eq!(fixture("rdma_msg_no_chunks.hex").len(), 28);
    golden(
        "rdma_msg_no_chunks.hex",
        RdmaHeader {
            xid: 0x01020304,
            vers: 1,
            credit: 32,
            body: RdmaBody::Msg(ChunkLists::default()),
        },
    );
}

#[test]
fn rdma_read_list_two_segments_one_position() {
    golden(
        "rdma_msg_read_list_two_segments.hex",
        RdmaHeader {
            xid: 0xabcd,
            vers: 1,
            credit: 128,
            body: RdmaBody::Msg(ChunkLists {
                read_list: List(vec![
                    ReadSegment {
                        position: 148,
                        target: seg(0x1111, 4096, 0x1000_0000),
                    },
                    ReadSegment {
                        position: 148,
                        target: seg(0x2222, 2048, 0x2000_0000),
                    },
                ]),
                ..Default::default()
            }),
        },
    );
}

#[test]
fn rdma_write_list_two_chunks() {
    golden(
        "rdma_msg_write_list_two_chunks.hex",
        RdmaHeader {
            xid: 7,
            vers: 1,
            credit: 16,
            body: RdmaBody::Msg(ChunkLists {
                write_list: List(vec![
                    WriteChunk::new(vec![seg(0x3333, 65536, 0x1_0000_0000)]),
                    WriteChunk::new(vec![
                        seg(0x4444, 4096, 0x2000),
                        seg(0x5555, 512, 0xffff_ffff_ffff_f000),
                    ]),
                ]),
                ..Default::default()
            }),
        },
    );
}

#[test]
fn rdma_nomsg_with_reply_chunk() {
    golden(
        "rdma_nomsg_reply_chunk.hex",
        RdmaHeader {
            xid: 9,
            vers: 1,
            credit: 64,
            body: RdmaBody::Nomsg(ChunkLists {
                reply_chunk: Some(WriteChunk::new(vec![seg(0x6666, 10768, 0x4000)])),
                ..Default::default()
            }),
        },
    );
}

#[test]
fn rdma_errors() {
    golden(
        "rdma_error_vers.hex",
        RdmaHeader {
            xid: 0x11,
            vers: 1,
            credit: 1,
            body: RdmaBody::Error(RdmaError::Vers { low: 1, high: 1 }),
        },
    );
    golden(
        "rdma_error_chunk.hex",
        RdmaHeader {
            xid: 0x12,
            vers: 1,
            credit: 1,
            body: RdmaBody::Error(RdmaError::Chunk),
        },
    );
}

#[test]
fn rfc8797_message_4k_4k_with_remote_invalidation() {
    let bytes = fixture("rfc8797_4k_4k_ri.hex");
    let m = CmPrivate {
        remote_invalidation: true,
        send_size: 4096,
        recv_size: 4096,
    };
    assert_eq!(&m.encode()[..], &bytes[..]);
    assert_eq!(CmPrivate::decode(&bytes).unwrap(), m);
}

#[test]
fn rpc_call_with_auth_sys_and_getattr_args() {
    let bytes = fixture("rpc_call_nfs3_getattr_auth_sys.hex");
    let mut d = Decoder::new(bytes.clone());
    let msg = RpcMessage::decode(&mut d).unwrap();
    let cred = AuthSysParms {
        stamp: 0,
        machinename: "host".into(),
        uid: 1000,
        gid: 100,
        gids: BoundedVec(vec![10]),
    };
    let expected = RpcMessage::call(0x12345678, nfs3::PROGRAM, 3, 1, OpaqueAuth::auth_sys(&cred));
    assert_eq!(msg, expected);
    assert_eq!(msg.as_call().unwrap().cred.as_auth_sys().unwrap(), cred);
    let args = nfs3::Nfs3Args::decode(nfs3::NfsProc3::Getattr, &mut d).unwrap();
    d.finish("call").unwrap();
    let args_expected = nfs3::Nfs3Args::Getattr(nfs3::Getattr3Args {
        object: nfs3::NfsFh3::new(vec![1, 2, 3, 4, 5, 6, 7, 8]),
    });
    assert_eq!(args, args_expected);
    let mut enc = expected.to_bytes().to_vec();
    args_expected.encode(&mut enc);
    assert_eq!(&enc[..], &bytes[..]);
}

#[test]
fn rpc_replies() {
    golden(
        "rpc_reply_prog_mismatch.hex",
        RpcMessage::accepted(0xbeef, AcceptStat::ProgMismatch { low: 3, high: 3 }),
    );
    golden(
        "rpc_reply_auth_error.hex",
        RpcMessage::denied(0xcafe, RejectedReply::AuthError(rpc::AuthStat::TooWeak)),
    );
}

#[test]
fn nfs3_vectors() {
    golden(
        "nfs3_read3res_ok.hex",
        NfsResult::<_, nfs3::AttrOnly>::Ok(nfs3::Read3ResOk {
            file_attributes: None,
            count: 5,
            eof: true,
            data: "hello".into(),
        }),
    );
    let t = |n| nfs3::NfsTime3 {
        seconds: 0x5f5e1000,
        nseconds: n,
    };
    golden(
        "nfs3_lookup3res_noent.hex",
        nfs3::Lookup3Res::Err(
            nfs3::NfsStat3::Noent,
            nfs3::Lookup3ResFail {
                dir_attributes: Some(nfs3::Fattr3 {
                    type_: nfs3::Ftype3::Dir,
                    mode: 0o755,
                    nlink: 2,
                    uid: 0,
                    gid: 0,
                    size: 4096,
                    used: 4096,
                    rdev: Default::default(),
                    fsid: 1,
                    fileid: 1,
                    atime: t(1),
                    mtime: t(2),
                    ctime: t(3),
                }),
            },
        ),
    );
    golden(
        "nfs3_create3args_exclusive.hex",
        nfs3::Create3Args {
            where_: nfs3::DirOpArgs3 {
                dir: nfs3::NfsFh3::new(vec![0xaa, 0xbb, 0xcc, 0xdd]),
                name: "foo".into(),
            },
            how: nfs3::CreateHow3::Exclusive([1, 2, 3, 4, 5, 6, 7, 8]),
        },
    );
}

#[test]
fn mount_vectors() {
    golden(
        "mount_mnt_ok.hex",
        MountRes3::Ok(MountRes3Ok {
            fhandle: mount::FHandle3::new(vec![0, 0, 0, 1]),
            auth_flavors: BoundedVec(vec![rpc::flavor::AUTH_SYS, rpc::flavor::AUTH_NONE]),
        }),
    );
    golden(
        "mount_exports.hex",
        mount::Exports::from_vec(vec![mount::ExportNode {
            ex_dir: "/export".into(),
            ex_groups: List(vec!["*".into()]),
        }]),
    );
}

#[test]
fn portmap_vector() {
    golden(
        "pmap_getport_mount_tcp.hex",
        portmap::Mapping {
            prog: mount::PROGRAM,
            vers: 3,
            prot: portmap::IPPROTO_TCP,
            port: 0,
        },
    );
}

#[test]
fn nfs4_compound_vectors() {
    use nfsrdma_xdr::nfs4::attr::{n, AttrWriter};
    use nfsrdma_xdr::nfs4::ops::{SequenceArgs, SequenceResOk};
    use nfsrdma_xdr::nfs4::{ArgOp, Bitmap4, Compound4Args, Compound4Res, Ftype4, ResOp, Status};
    let session = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
    golden(
        "nfs4_compound_args_sequence.hex",
        Compound4Args {
            tag: Default::default(),
            minorversion: 1,
            ops: vec![
                ArgOp::Sequence(SequenceArgs {
                    sessionid: session,
                    sequenceid: 1,
                    slotid: 0,
                    highest_slotid: 0,
                    cachethis: false,
                }),
                ArgOp::Putrootfh,
                ArgOp::Getattr(Bitmap4::from_bits([n::TYPE, n::CHANGE, n::SIZE, n::MODE])),
            ],
        },
    );
    let mut w = AttrWriter::new();
    w.put(n::TYPE, &Ftype4::Reg);
    w.put(n::CHANGE, &5u64);
    w.put(n::SIZE, &4096u64);
    w.put(n::MODE, &0o644u32);
    golden(
        "nfs4_compound_res_getattr.hex",
        Compound4Res {
            status: Status::OK,
            tag: Default::default(),
            results: vec![
                ResOp::Sequence(Ok(SequenceResOk {
                    sessionid: session,
                    sequenceid: 1,
                    slotid: 0,
                    highest_slotid: 63,
                    target_highest_slotid: 63,
                    status_flags: 0,
                })),
                ResOp::Putrootfh(Ok(())),
                ResOp::Getattr(Ok(w.finish())),
            ],
        },
    );
}

/// The owner handle the Linux client builds: "<pid>@<nodename>".
const LINUX_OWNER: &str = "1234@client";

#[test]
fn nlm4_lockargs_as_the_linux_client_sends_it() {
    use nfsrdma_xdr::nlm::{Nlm4Lock, Nlm4LockArgs};
    let fh: Vec<u8> = [
        0x0100_0601u32,
        0,
        2,
        0x8a7b_6c5d,
        0x4e3f_2a1b,
        0x0c1d_2e3f,
        0x4051_6273,
        12345,
        0x1a2b_3c4d,
    ]
    .iter()
    .flat_map(|w| w.to_be_bytes())
    .collect();
    assert_eq!(fh.len(), 36);
    let args = Nlm4LockArgs {
        cookie: vec![0x35, 0x12, 0, 0].into(),
        block: true,
        exclusive: true,
        alock: Nlm4Lock {
            caller_name: "client".into(),
            fh: fh.into(),
            oh: LINUX_OWNER.into(),
            svid: 1234,
            l_offset: 0,
            l_len: 0,
        },
        reclaim: false,
        state: 3,
    };
    // cookie 8, block and exclusive 8, caller_name 12, fh 40, oh 16, svid 4,
    // offset and length 16, reclaim 4, state 4.
    assert_eq!(fixture("nlm_lockargs_linux.hex").len(), 112);
    golden("nlm_lockargs_linux.hex", args);
}

#[test]
fn nlm4_results_and_share_and_free_all() {
    use nfsrdma_xdr::nlm::{
        Fsh4Access, Fsh4Mode, Nlm4Holder, Nlm4Notify, Nlm4Res, Nlm4Share, Nlm4ShareArgs, Nlm4Stat,
        Nlm4TestReply, Nlm4TestRes,
    };
    let cookie = || nfsrdma_xdr::nlm::NetObj::new(vec![0x35, 0x12, 0, 0]);
    golden(
        "nlm_testres_denied.hex",
        Nlm4TestRes {
            cookie: cookie(),
            stat: Nlm4TestReply::Denied(Nlm4Holder {
                exclusive: true,
                svid: 4321,
                oh: "4321@other".into(),
                l_offset: 1 << 32,
                l_len: 4096,
            }),
        },
    );
    golden(
        "nlm_res_blocked.hex",
        Nlm4Res {
            cookie: cookie(),
            stat: Nlm4Stat::Blocked,
        },
    );
    golden(
        "nlm_shareargs.hex",
        Nlm4ShareArgs {
            cookie: vec![0x36, 0x12, 0, 0].into(),
            share: Nlm4Share {
                caller_name: "client".into(),
                fh: vec![0, 0, 0, 1, 0, 0, 0, 2].into(),
                oh: LINUX_OWNER.into(),
                mode: Fsh4Mode::DenyWrite,
                access: Fsh4Access::ReadWrite,
            },
            reclaim: true,
        },
    );
    golden(
        "nlm_notify.hex",
        Nlm4Notify {
            name: "host1".into(),
            state: 7,
        },
    );
}

#[test]
fn nlm4_notify_state_is_one_word() {
    use nfsrdma_xdr::nlm::Nlm4Notify;
    // Name (4 + 8) and a 32-bit state: what the Linux lock manager decodes.
    assert_eq!(fixture("nlm_notify.hex").len(), 16);
    // A 64-bit state (hyper 7) decodes as state 0 with a word left over.
    let mut hyper = fixture("nlm_notify.hex")[..12].to_vec();
    hyper.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 7]);
    assert!(matches!(
        Nlm4Notify::from_bytes(hyper.into()),
        Err(nfsrdma_xdr::XdrError::Trailing { extra: 4, .. })
    ));
}

#[test]
fn nsm_vectors() {
    use nfsrdma_xdr::nlm;
    use nfsrdma_xdr::nsm::{Mon, MonId, MyId, SmRes, SmStatRes, SmStatus, StatChge};
    let priv_ = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    golden(
        "nsm_mon.hex",
        Mon {
            mon_id: MonId {
                mon_name: "client".into(),
                my_id: MyId {
                    my_name: "server".into(),
                    my_prog: nlm::PROGRAM as i32,
                    my_vers: 3,
                    my_proc: 16,
                },
            },
            priv_,
        },
    );
    golden(
        "nsm_sm_stat_res.hex",
        SmStatRes {
            res_stat: SmRes::Succ,
            state: 5,
        },
    );
    golden(
        "nsm_stat_chge.hex",
        StatChge {
            mon_name: "client".into(),
            state: 5,
        },
    );
    golden(
        "nsm_status.hex",
        SmStatus {
            mon_name: "client".into(),
            state: 5,
            priv_,
        },
    );
}

#[test]
fn nlm_and_nsm_program_and_procedure_numbers() {
    use nfsrdma_xdr::{nlm, nsm};
    assert_eq!((nlm::PROGRAM, nlm::VERSION), (100021, 4));
    assert_eq!((nsm::PROGRAM, nsm::VERSION), (100024, 1));
    let p = |v: &[u32]| v.to_vec();
    {
        use nlm::proc_::*;
        assert_eq!(
            p(&[
                NULL,
                TEST,
                LOCK,
                CANCEL,
                UNLOCK,
                GRANTED,
                TEST_MSG,
                LOCK_MSG,
                CANCEL_MSG,
                UNLOCK_MSG,
                GRANTED_MSG,
                TEST_RES,
                LOCK_RES,
                CANCEL_RES,
                UNLOCK_RES,
                GRANTED_RES
            ]),
            (0..=15).collect::<Vec<u32>>()
        );
        assert_eq!(p(&[SHARE, UNSHARE, NM_LOCK, FREE_ALL]), [20, 21, 22, 23]);
    }
    {
        use nsm::proc_::*;
        assert_eq!(
            p(&[NULL, STAT, MON, UNMON, UNMON_ALL, SIMU_CRASH, NOTIFY]),
            (0..=6).collect::<Vec<u32>>()
        );
    }
    assert_eq!(
        (nlm::LM_MAXSTRLEN, nlm::LM_MAXNAMELEN, nlm::MAXNETOBJ_SZ),
        (1024, 1025, 1024)
    );
    assert_eq!(nsm::SM_MAXSTRLEN, 1024);
}
