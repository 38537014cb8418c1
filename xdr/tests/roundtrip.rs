//! Property tests: every wire type round-trips, reports its exact encoded
//! length, and refuses every truncation of a valid encoding and any trailing
//! bytes.

use bytes::{BufMut, Bytes, BytesMut};
use nfsrdma_xdr::{
    mount, nfs3, nlm, nsm, portmap, rpc, rpcrdma, CountingSink, IoVecSink, Xdr, XdrError,
};
use proptest::prelude::*;

fn check<T: Xdr + PartialEq + std::fmt::Debug>(v: &T) -> Result<(), TestCaseError> {
    let b = v.to_bytes();
    prop_assert_eq!(
        b.len(),
        v.encoded_len(),
        "encoded_len disagrees with encode"
    );
    prop_assert_eq!(b.len() % 4, 0, "XDR streams are multiples of four bytes");
    let mut counting = CountingSink::default();
    v.encode(&mut counting);
    prop_assert_eq!(counting.0, b.len());

    // Scatter/gather encoding produces the same stream.
    let mut sg = IoVecSink::new();
    v.encode(&mut sg);
    let joined: Vec<u8> = sg.into_parts().iter().flat_map(|p| p.to_vec()).collect();
    prop_assert_eq!(&joined[..], &b[..]);

    let back = T::from_bytes(b.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, v);

    // Every strict prefix is short input (checked at up to 64 cut points).
    let step = (b.len() / 64).max(1);
    for cut in (0..b.len()).step_by(step) {
        match T::from_bytes(b.slice(..cut)) {
            Err(XdrError::Short { .. }) => {}
            other => prop_assert!(false, "prefix of {} bytes gave {:?}", cut, other),
        }
    }

    // Trailing bytes after a complete item are reported.
    let mut longer = BytesMut::from(&b[..]);
    longer.put_u32(0);
    let trailing = matches!(
        T::from_bytes(longer.freeze()),
        Err(XdrError::Trailing { extra: 4, .. })
    );
    prop_assert!(trailing, "trailing bytes were not reported");
    Ok(())
}

macro_rules! roundtrip {
    ($($name:ident: $ty:ty,)*) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
            $(
                #[test]
                fn $name(v in any::<$ty>()) {
                    check(&v)?;
                }
            )*
        }
    };
}

roundtrip! {
    rpc_opaque_auth: rpc::OpaqueAuth,
    rpc_auth_sys: rpc::AuthSysParms,
    rpc_auth_stat: rpc::AuthStat,
    rpc_call_body: rpc::CallBody,
    rpc_accept_stat: rpc::AcceptStat,
    rpc_accepted_reply: rpc::AcceptedReply,
    rpc_rejected_reply: rpc::RejectedReply,
    rpc_reply_body: rpc::ReplyBody,
    rpc_message: rpc::RpcMessage,

    rdma_segment: rpcrdma::RdmaSegment,
    rdma_read_segment: rpcrdma::ReadSegment,
    rdma_write_chunk: rpcrdma::WriteChunk,
    rdma_chunk_lists: rpcrdma::ChunkLists,
    rdma_padded: rpcrdma::PaddedBody,
    rdma_error: rpcrdma::RdmaError,
    rdma_header: rpcrdma::RdmaHeader,

    nfs_stat: nfs3::NfsStat3,
    nfs_ftype: nfs3::Ftype3,
    nfs_stable_how: nfs3::StableHow,
    nfs_proc: nfs3::NfsProc3,
    nfs_fh: nfs3::NfsFh3,
    nfs_filename: nfs3::Filename3,
    nfs_path: nfs3::NfsPath3,
    nfs_data: nfs3::Data,
    nfs_specdata: nfs3::SpecData3,
    nfs_time: nfs3::NfsTime3,
    nfs_fattr: nfs3::Fattr3,
    nfs_post_op_attr: nfs3::PostOpAttr,
    nfs_wcc_attr: nfs3::WccAttr,
    nfs_wcc_data: nfs3::WccData,
    nfs_set_time: nfs3::SetTime,
    nfs_sattr: nfs3::Sattr3,
    nfs_diropargs: nfs3::DirOpArgs3,
    nfs_createhow: nfs3::CreateHow3,
    nfs_mknoddata: nfs3::MknodData3,
    nfs_entry: nfs3::Entry3,
    nfs_dirlist: nfs3::DirList3,
    nfs_entryplus: nfs3::EntryPlus3,
    nfs_dirlistplus: nfs3::DirListPlus3,
    nfs_getattr_args: nfs3::Getattr3Args,
    nfs_getattr_res: nfs3::Getattr3Res,
    nfs_setattr_args: nfs3::Setattr3Args,
    nfs_setattr_res: nfs3::Setattr3Res,
    nfs_lookup_args: nfs3::Lookup3Args,
    nfs_lookup_res: nfs3::Lookup3Res,
    nfs_access_args: nfs3::Access3Args,
    nfs_access_res: nfs3::Access3Res,
    nfs_readlink_args: nfs3::Readlink3Args,
    nfs_readlink_res: nfs3::Readlink3Res,
    nfs_read_args: nfs3::Read3Args,
    nfs_read_res: nfs3::Read3Res,
    nfs_write_args: nfs3::Write3Args,
    nfs_write_res: nfs3::Write3Res,
    nfs_create_args: nfs3::Create3Args,
    nfs_create_res: nfs3::Create3Res,
    nfs_mkdir_args: nfs3::Mkdir3Args,
    nfs_mkdir_res: nfs3::Mkdir3Res,
    nfs_symlink_args: nfs3::Symlink3Args,
    nfs_symlink_res: nfs3::Symlink3Res,
    nfs_mknod_args: nfs3::Mknod3Args,
    nfs_mknod_res: nfs3::Mknod3Res,
    nfs_remove_args: nfs3::Remove3Args,
    nfs_remove_res: nfs3::Remove3Res,
    nfs_rmdir_res: nfs3::Rmdir3Res,
    nfs_rename_args: nfs3::Rename3Args,
    nfs_rename_res: nfs3::Rename3Res,
    nfs_link_args: nfs3::Link3Args,
    nfs_link_res: nfs3::Link3Res,
    nfs_readdir_args: nfs3::Readdir3Args,
    nfs_readdir_res: nfs3::Readdir3Res,
    nfs_readdirplus_args: nfs3::Readdirplus3Args,
    nfs_readdirplus_res: nfs3::Readdirplus3Res,
    nfs_fsroot_args: nfs3::FsRootArgs,
    nfs_fsstat_res: nfs3::Fsstat3Res,
    nfs_fsinfo_res: nfs3::Fsinfo3Res,
    nfs_pathconf_res: nfs3::Pathconf3Res,
    nfs_commit_args: nfs3::Commit3Args,
    nfs_commit_res: nfs3::Commit3Res,

    mount_dirpath: mount::DirPath,
    mount_name: mount::Name,
    mount_fhandle: mount::FHandle3,
    mount_stat: mount::MountStat3,
    mount_res_ok: mount::MountRes3Ok,
    mount_res: mount::MountRes3,
    mount_body: mount::MountBody,
    mount_list: mount::MountList,
    mount_export_node: mount::ExportNode,
    mount_exports: mount::Exports,

    pmap_mapping: portmap::Mapping,
    pmap_list: portmap::PmapList,

    nlm_netobj: nlm::NetObj,
    nlm_caller_name: nlm::CallerName,
    nlm_notify_name: nlm::NotifyName,
    nlm_stat: nlm::Nlm4Stat,
    nlm_lock: nlm::Nlm4Lock,
    nlm_holder: nlm::Nlm4Holder,
    nlm_lockargs: nlm::Nlm4LockArgs,
    nlm_cancargs: nlm::Nlm4CancArgs,
    nlm_testargs: nlm::Nlm4TestArgs,
    nlm_unlockargs: nlm::Nlm4UnlockArgs,
    nlm_res: nlm::Nlm4Res,
    nlm_testrply: nlm::Nlm4TestReply,
    nlm_testres: nlm::Nlm4TestRes,
    nlm_fsh_mode: nlm::Fsh4Mode,
    nlm_fsh_access: nlm::Fsh4Access,
    nlm_share: nlm::Nlm4Share,
    nlm_shareargs: nlm::Nlm4ShareArgs,
    nlm_shareres: nlm::Nlm4ShareRes,
    nlm_notify: nlm::Nlm4Notify,

    nsm_name: nsm::SmName,
    nsm_res: nsm::SmRes,
    nsm_stat_res: nsm::SmStatRes,
    nsm_stat: nsm::SmStat,
    nsm_my_id: nsm::MyId,
    nsm_mon_id: nsm::MonId,
    nsm_mon: nsm::Mon,
    nsm_stat_chge: nsm::StatChge,
    nsm_status: nsm::SmStatus,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arguments and results decode by procedure number to the same value.
    #[test]
    fn nfs3_args_by_procedure(args in any::<nfs3::Nfs3Args>()) {
        let mut b = BytesMut::new();
        args.encode(&mut b);
        prop_assert_eq!(b.len(), args.encoded_len());
        let mut d = nfsrdma_xdr::Decoder::new(b.freeze());
        let back = nfs3::Nfs3Args::decode(args.proc_(), &mut d).unwrap();
        d.finish("args").unwrap();
        prop_assert_eq!(back, args);
    }

    #[test]
    fn nfs3_results_by_procedure(res in any::<nfs3::Nfs3Res>()) {
        let mut b = BytesMut::new();
        res.encode(&mut b);
        prop_assert_eq!(b.len(), res.encoded_len());
        let mut d = nfsrdma_xdr::Decoder::new(b.freeze());
        let back = nfs3::Nfs3Res::decode(res.proc_(), &mut d).unwrap();
        d.finish("res").unwrap();
        prop_assert_eq!(back, res);
    }

    #[test]
    fn cm_private_round_trips(m in any::<rpcrdma::CmPrivate>()) {
        prop_assert_eq!(rpcrdma::CmPrivate::decode(&m.encode()).unwrap(), m);
    }

    /// Decoding arbitrary bytes as any top-level type never panics.
    #[test]
    fn random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..512)) {
        let b = Bytes::from(raw);
        let _ = rpc::RpcMessage::from_bytes(b.clone());
        let _ = rpcrdma::RdmaHeader::from_bytes(b.clone());
        let _ = rpcrdma::CmPrivate::decode(&b);
        let _ = mount::MountRes3::from_bytes(b.clone());
        let _ = mount::Exports::from_bytes(b.clone());
        let _ = portmap::PmapList::from_bytes(b.clone());
        let _ = nlm::Nlm4LockArgs::from_bytes(b.clone());
        let _ = nlm::Nlm4TestRes::from_bytes(b.clone());
        let _ = nlm::Nlm4ShareArgs::from_bytes(b.clone());
        let _ = nlm::Nlm4Notify::from_bytes(b.clone());
        let _ = nsm::Mon::from_bytes(b.clone());
        let _ = nsm::SmStatus::from_bytes(b.clone());
        for p in nfs3::NfsProc3::ALL {
            let _ = nfs3::Nfs3Args::decode(p, &mut nfsrdma_xdr::Decoder::new(b.clone()));
            let _ = nfs3::Nfs3Res::decode(p, &mut nfsrdma_xdr::Decoder::new(b.clone()));
        }
    }
}

#[test]
fn oversized_lengths_are_refused_per_field() {
    fn claim(len: u32) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u32(len);
        b.put_bytes(b'x', nfsrdma_xdr::roundup(len as usize));
        b.freeze()
    }
    let too_long = |e: XdrError| matches!(e, XdrError::TooLong { .. });
    assert!(too_long(nfs3::NfsFh3::from_bytes(claim(65)).unwrap_err()));
    assert!(nfs3::NfsFh3::from_bytes(claim(64)).is_ok());
    assert!(too_long(
        nfs3::Filename3::from_bytes(claim(4097)).unwrap_err()
    ));
    assert!(too_long(
        mount::DirPath::from_bytes(claim(1025)).unwrap_err()
    ));
    assert!(too_long(mount::Name::from_bytes(claim(256)).unwrap_err()));
    assert!(too_long(
        rpc::MachineName::from_bytes(claim(256)).unwrap_err()
    ));
    assert!(too_long(rpc::AuthBody::from_bytes(claim(401)).unwrap_err()));
    // A WRITE claiming 4 GiB of data with none present.
    let mut b = BytesMut::new();
    b.put_u32(0xffff_ffff);
    assert!(too_long(nfs3::Data::from_bytes(b.freeze()).unwrap_err()));
    // A Write chunk claiming 10,000 segments.
    let mut b = BytesMut::new();
    b.put_u32(10_000);
    b.put_bytes(0, 16 * 10_000);
    assert!(too_long(
        rpcrdma::WriteChunk::from_bytes(b.freeze()).unwrap_err()
    ));
}

/// A Linux-style LOCK call (as in fixtures/xdr/nlm_lockargs_linux.hex).
fn linux_lockargs() -> nlm::Nlm4LockArgs {
    nlm::Nlm4LockArgs {
        cookie: vec![0x35, 0x12, 0, 0].into(),
        block: true,
        exclusive: true,
        alock: nlm::Nlm4Lock {
            caller_name: "client".into(),
            fh: vec![7u8; 36].into(),
            oh: "1234@client".into(),
            svid: 1234,
            l_offset: 0,
            l_len: 0,
        },
        reclaim: false,
        state: 3,
    }
}

/// `len` bytes of `b'x'` as an XDR opaque (length word, bytes, padding).
fn opaque_of(b: &mut BytesMut, len: usize) {
    b.put_u32(len as u32);
    b.put_bytes(b'x', nfsrdma_xdr::roundup(len));
}

#[test]
fn nlm_caller_name_longer_than_1024_is_refused() {
    let lockargs = |caller_len: usize| {
        let mut b = BytesMut::new();
        opaque_of(&mut b, 4); // cookie
        b.put_u32(1); // block
        b.put_u32(1); // exclusive
        opaque_of(&mut b, caller_len); // caller_name
        opaque_of(&mut b, 36); // fh
        opaque_of(&mut b, 11); // oh
        b.put_u32(1234); // svid
        b.put_u64(0); // l_offset
        b.put_u64(0); // l_len
        b.put_u32(0); // reclaim
        b.put_u32(3); // state
        b.freeze()
    };
    let ok = nlm::Nlm4LockArgs::from_bytes(lockargs(1024)).unwrap();
    assert_eq!(ok.alock.caller_name.len(), 1024);
    assert_eq!(
        nlm::Nlm4LockArgs::from_bytes(lockargs(1025)).unwrap_err(),
        XdrError::TooLong {
            what: "caller_name",
            len: 1025,
            max: 1024
        }
    );
    // The share reservation's caller_name has the same limit.
    let mut b = BytesMut::new();
    opaque_of(&mut b, 4);
    opaque_of(&mut b, 1025);
    assert!(matches!(
        nlm::Nlm4ShareArgs::from_bytes(b.freeze()),
        Err(XdrError::TooLong {
            what: "caller_name",
            ..
        })
    ));
}

#[test]
fn nlm_netobj_longer_than_1024_is_refused() {
    let mut claim = BytesMut::new();
    opaque_of(&mut claim, 1025);
    assert_eq!(
        nlm::NetObj::from_bytes(claim.freeze()).unwrap_err(),
        XdrError::TooLong {
            what: "netobj",
            len: 1025,
            max: 1024
        }
    );
    let mut claim = BytesMut::new();
    opaque_of(&mut claim, 1024);
    assert!(nlm::NetObj::from_bytes(claim.freeze()).is_ok());
    // In every netobj position: cookie, fh, oh, holder's oh.
    let cookie_too_long = {
        let mut b = BytesMut::new();
        opaque_of(&mut b, 1025);
        b.put_u32(3);
        b.freeze()
    };
    assert!(matches!(
        nlm::Nlm4Res::from_bytes(cookie_too_long),
        Err(XdrError::TooLong { what: "netobj", .. })
    ));
    let mut b = BytesMut::new();
    opaque_of(&mut b, 4); // cookie
    b.put_u32(0); // exclusive
    opaque_of(&mut b, 6); // caller_name
    opaque_of(&mut b, 1025); // fh
    assert!(matches!(
        nlm::Nlm4TestArgs::from_bytes(b.freeze()),
        Err(XdrError::TooLong { what: "netobj", .. })
    ));
    let mut b = BytesMut::new();
    opaque_of(&mut b, 4); // cookie
    opaque_of(&mut b, 6); // caller_name
    opaque_of(&mut b, 8); // fh
    b.put_u32(u32::MAX); // oh claiming 4 GiB with nothing behind it
    assert!(matches!(
        nlm::Nlm4UnlockArgs::from_bytes(b.freeze()),
        Err(XdrError::TooLong { what: "netobj", .. })
    ));
    let mut b = BytesMut::new();
    opaque_of(&mut b, 4); // cookie
    b.put_u32(1); // NLM4_DENIED
    b.put_u32(1); // exclusive
    b.put_u32(1); // svid
    opaque_of(&mut b, 2000); // oh
    assert!(matches!(
        nlm::Nlm4TestRes::from_bytes(b.freeze()),
        Err(XdrError::TooLong { what: "netobj", .. })
    ));
    // FREE_ALL's name allows one byte more (LM_MAXNAMELEN).
    let mut b = BytesMut::new();
    opaque_of(&mut b, 1025);
    b.put_u32(1);
    assert!(nlm::Nlm4Notify::from_bytes(b.freeze()).is_ok());
    let mut b = BytesMut::new();
    opaque_of(&mut b, 1026);
    b.put_u32(1);
    assert!(matches!(
        nlm::Nlm4Notify::from_bytes(b.freeze()),
        Err(XdrError::TooLong {
            len: 1026,
            max: 1025,
            ..
        })
    ));
    // NSM names stop at SM_MAXSTRLEN.
    let mut b = BytesMut::new();
    opaque_of(&mut b, 1025);
    b.put_u32(1);
    assert!(matches!(
        nsm::StatChge::from_bytes(b.freeze()),
        Err(XdrError::TooLong {
            len: 1025,
            max: 1024,
            ..
        })
    ));
}

#[test]
fn nlm_bad_enum_and_bool_values_are_refused() {
    let with_stat = |stat: u32| {
        let mut b = BytesMut::new();
        opaque_of(&mut b, 4);
        b.put_u32(stat);
        b.freeze()
    };
    assert!(nlm::Nlm4Res::from_bytes(with_stat(9)).is_ok());
    for bad in [10, 0xffff_ffff] {
        let e = XdrError::BadValue {
            what: "nlm4_stats",
            value: bad,
        };
        assert_eq!(nlm::Nlm4Res::from_bytes(with_stat(bad)).unwrap_err(), e);
        assert_eq!(nlm::Nlm4TestRes::from_bytes(with_stat(bad)).unwrap_err(), e);
        let mut shareres = BytesMut::from(&with_stat(bad)[..]);
        shareres.put_u32(0);
        assert_eq!(
            nlm::Nlm4ShareRes::from_bytes(shareres.freeze()).unwrap_err(),
            e
        );
    }
    // A share's mode and access are enums too.
    let share = |mode: u32, access: u32| {
        let mut b = BytesMut::new();
        opaque_of(&mut b, 4);
        opaque_of(&mut b, 6);
        opaque_of(&mut b, 8);
        opaque_of(&mut b, 11);
        b.put_u32(mode);
        b.put_u32(access);
        b.put_u32(0);
        b.freeze()
    };
    assert!(nlm::Nlm4ShareArgs::from_bytes(share(3, 3)).is_ok());
    assert!(matches!(
        nlm::Nlm4ShareArgs::from_bytes(share(4, 3)),
        Err(XdrError::BadValue {
            what: "fsh4_mode",
            value: 4
        })
    ));
    assert!(matches!(
        nlm::Nlm4ShareArgs::from_bytes(share(3, 4)),
        Err(XdrError::BadValue {
            what: "fsh4_access",
            value: 4
        })
    ));
    // block = 2 is not a boolean.
    let mut lock = linux_lockargs().to_bytes().to_vec();
    lock[8..12].copy_from_slice(&2u32.to_be_bytes());
    assert!(matches!(
        nlm::Nlm4LockArgs::from_bytes(lock.into()),
        Err(XdrError::BadValue { value: 2, .. })
    ));
    // NSM's res has two values.
    assert!(matches!(
        nsm::SmStatRes::from_bytes(Bytes::from_static(&[0, 0, 0, 2, 0, 0, 0, 1])),
        Err(XdrError::BadValue {
            what: "sm_res",
            value: 2
        })
    ));
}

#[test]
fn truncated_nlm4_lockargs_is_short_input() {
    let full = linux_lockargs().to_bytes();
    assert_eq!(full.len(), 112);
    assert_eq!(
        nlm::Nlm4LockArgs::from_bytes(full.clone()).unwrap(),
        linux_lockargs()
    );
    for cut in 0..full.len() {
        match nlm::Nlm4LockArgs::from_bytes(full.slice(..cut)) {
            Err(XdrError::Short { .. }) => {}
            other => panic!("lockargs cut to {cut} bytes gave {other:?}"),
        }
    }
    // Cut inside the state word, the last field.
    assert!(matches!(
        nlm::Nlm4LockArgs::from_bytes(full.slice(..110)),
        Err(XdrError::Short {
            needed: 4,
            available: 2,
            ..
        })
    ));
    // DENIED without its holder.
    let mut b = BytesMut::new();
    opaque_of(&mut b, 4);
    b.put_u32(1);
    assert!(matches!(
        nlm::Nlm4TestRes::from_bytes(b.freeze()),
        Err(XdrError::Short { .. })
    ));
    // SM_MON without all 16 bytes of priv.
    let mon = nsm::Mon::default().to_bytes();
    assert!(matches!(
        nsm::Mon::from_bytes(mon.slice(..mon.len() - 1)),
        Err(XdrError::Short { .. })
    ));
}

#[test]
fn nlm_denied_test_reply_carries_its_holder() {
    // Only DENIED has an arm: every other status is the status word alone.
    for v in 0..=9u32 {
        let stat = nlm::Nlm4Stat::from_u32(v).unwrap();
        let r = if stat == nlm::Nlm4Stat::Denied {
            nlm::Nlm4TestReply::Denied(nlm::Nlm4Holder::default())
        } else {
            nlm::Nlm4TestReply::Other(stat)
        };
        let b = r.to_bytes();
        assert_eq!(&b[..4], &v.to_be_bytes());
        let expected = if v == 1 { 4 + 4 + 4 + 4 + 8 + 8 } else { 4 };
        assert_eq!(b.len(), expected, "status {v}");
        assert_eq!(nlm::Nlm4TestReply::from_bytes(b).unwrap(), r);
    }
}
