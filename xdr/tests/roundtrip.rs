//! Property tests: every wire type round-trips, reports its exact encoded
//! length, and refuses every truncation of a valid encoding and any trailing
//! bytes.

use bytes::{BufMut, Bytes, BytesMut};
use nfsrdma_xdr::{mount, nfs3, portmap, rpc, rpcrdma, CountingSink, IoVecSink, Xdr, XdrError};
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
