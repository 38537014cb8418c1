use super::attr::{n, AttrWriter, SetAttrs, SetTime4};
use super::ops::*;
use super::*;
use crate::nfs3::Data;
use crate::Payload;
use bytes::Bytes;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: String = s.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

fn enc<T: Xdr + std::fmt::Debug>(v: &T) -> Vec<u8> {
    let mut out = Vec::new();
    v.encode(&mut out);
    assert_eq!(out.len(), v.encoded_len(), "encoded_len of {v:?}");
    out
}

fn dec<T: Xdr>(b: &[u8]) -> crate::Result<T> {
    let mut d = Decoder::new(Bytes::copy_from_slice(b));
    let v = T::decode(&mut d)?;
    d.finish("test")?;
    Ok(v)
}

#[test]
#[should_panic(expected = "out of order")]
fn attributes_out_of_order_are_refused_by_the_writer() {
    let mut w = AttrWriter::new();
    w.put(n::SIZE, &1u64);
    w.put(n::TYPE, &Ftype4::Reg);
}

#[test]
fn an_undecodable_operation_cuts_the_list_where_it_stands() {
    // PUTROOTFH, GETFH, then a LOOKUP whose name runs past the end.
    let mut b = hex("00000000 00000001 00000003 00000018 0000000a 0000000f 00000010 6162");
    let (a, cut) =
        Compound4Args::decode_lenient(&mut Decoder::new(Bytes::from(b.clone()))).unwrap();
    assert_eq!(a.ops, vec![ArgOp::Putrootfh, ArgOp::Getfh]);
    match cut {
        Some(OpsCut::Garbage { at, op, .. }) => assert_eq!((at, op), (2, opnum::LOOKUP)),
        other => panic!("expected a cut at LOOKUP, got {other:?}"),
    }
    // The strict decoder refuses the whole.
    assert!(dec::<Compound4Args>(&b).is_err());
    // An undefined operation number ends decoding as ILLEGAL, a defined
    // unmodelled one (DELEGPURGE) as unsupported, whatever follows.
    b = hex("00000000 00000001 00000003 00000018 00002710 ffffffff");
    let (a, cut) = Compound4Args::decode_lenient(&mut Decoder::new(Bytes::from(b))).unwrap();
    assert_eq!(
        (a.ops, cut),
        (vec![ArgOp::Putrootfh, ArgOp::Illegal(10000)], None)
    );
    b = hex("00000000 00000002 00000002 00000007 ffffffff");
    let (a, _) = Compound4Args::decode_lenient(&mut Decoder::new(Bytes::from(b))).unwrap();
    assert_eq!(a.ops, vec![ArgOp::Unsupported(opnum::DELEGPURGE)]);
    // A count past the limit is refused before anything is allocated.
    b = hex("00000000 00000001 7fffffff");
    let (a, cut) = Compound4Args::decode_lenient(&mut Decoder::new(Bytes::from(b))).unwrap();
    assert_eq!((a.ops.len(), cut), (0, Some(OpsCut::TooMany(0x7fff_ffff))));
}

#[test]
fn write_data_is_a_payload_and_read_data_goes_out_as_one() {
    let big = Bytes::from(vec![7u8; 64 * 1024]);
    let data = Payload::from_parts([big.clone(), Bytes::from_static(b" v4")]);
    let w = ArgOp::Write(WriteArgs {
        stateid: Stateid4::ANONYMOUS,
        offset: 7,
        stable: StableHow4::FileSync,
        data: Data(data.clone()),
    });
    let mut sink = crate::IoVecSink::new();
    w.encode(&mut sink);
    let parts = sink.into_parts();
    assert!(
        parts.iter().any(|p| p.as_ptr() == big.as_ptr()),
        "the payload travels by reference"
    );
    let back: ArgOp = dec(&enc(&w)).unwrap();
    match back {
        ArgOp::Write(a) => assert_eq!(a.data.0.to_contiguous(), data.to_contiguous()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn settable_attributes_are_read_and_others_refused() {
    let s = SetAttrs {
        size: Some(10),
        mode: Some(0o600),
        owner: Some(Utf8Str::from("1000")),
        owner_group: None,
        atime: Some(SetTime4::Server),
        mtime: Some(SetTime4::Client(Time4 {
            seconds: 5,
            nseconds: 6,
        })),
    };
    let f = s.to_fattr();
    let all = Bitmap4::from_bits(0..80);
    assert_eq!(SetAttrs::from_fattr(&f, &all).unwrap(), s);
    // A supported attribute that cannot be set, one that is not supported,
    // values cut short, values left over.
    let mut w = AttrWriter::new();
    w.put(n::TYPE, &Ftype4::Reg);
    assert_eq!(SetAttrs::from_fattr(&w.finish(), &all), Err(Status::INVAL));
    let mut w = AttrWriter::new();
    w.put(n::SIZE, &1u64);
    let f = w.finish();
    assert_eq!(
        SetAttrs::from_fattr(&f, &Bitmap4::from_bits([n::MODE])),
        Err(Status::ATTRNOTSUPP)
    );
    let short = Fattr4 {
        attrmask: f.attrmask.clone(),
        attr_vals: AttrList4(f.attr_vals.slice(..4)),
    };
    assert_eq!(SetAttrs::from_fattr(&short, &all), Err(Status::BADXDR));
    let mut long = f.attr_vals.to_vec();
    long.extend_from_slice(&[0; 4]);
    let long = Fattr4 {
        attrmask: f.attrmask,
        attr_vals: AttrList4(long.into()),
    };
    assert_eq!(SetAttrs::from_fattr(&long, &all), Err(Status::BADXDR));
}

#[test]
fn bitmaps_set_test_and_intersect() {
    let b = Bitmap4::from_bits([0, 31, 32, 75]);
    assert_eq!(b.0, vec![0x8000_0001, 1, 0x800]);
    assert_eq!(b.bits().collect::<Vec<_>>(), vec![0, 31, 32, 75]);
    assert!(b.has(75) && !b.has(74) && !b.has(200));
    assert_eq!(b.and(&Bitmap4::from_bits([31, 40])).0, vec![0x8000_0000]);
    assert!(
        dec::<Bitmap4>(&hex("00000009")).is_err(),
        "more than 8 words"
    );
}

#[test]
fn statuses_map_from_nfsv3_by_number() {
    use crate::nfs3::NfsStat3;
    assert_eq!(Status::from(NfsStat3::Noent), Status::NOENT);
    assert_eq!(Status::from(NfsStat3::Stale), Status::STALE);
    assert_eq!(Status::from(NfsStat3::BadCookie), Status::BAD_COOKIE);
    assert_eq!(Status::from(NfsStat3::NotSync), Status::NOT_SAME);
    assert_eq!(Status::from(NfsStat3::Jukebox), Status::DELAY);
    assert_eq!(Status::BADSESSION.name(), "NFS4ERR_BADSESSION");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn compound_arguments_round_trip(a in any::<Compound4Args>()) {
        let b = enc(&a);
        prop_assert_eq!(dec::<Compound4Args>(&b).unwrap(), a);
    }

    #[test]
    fn compound_results_round_trip(r in any::<Compound4Res>()) {
        let b = enc(&r);
        prop_assert_eq!(dec::<Compound4Res>(&b).unwrap(), r);
    }

    #[test]
    fn set_attributes_round_trip(s in any::<SetAttrs>()) {
        let all = Bitmap4::from_bits(0..80);
        prop_assert_eq!(SetAttrs::from_fattr(&s.to_fattr(), &all).unwrap(), s);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Compound4Args::decode_lenient(&mut Decoder::new(Bytes::from(b.clone())));
        let _ = dec::<Compound4Res>(&b);
    }
}

#[test]
fn operation_names_match_their_numbers() {
    use super::opnum::{self, name};
    for (n, want) in [
        (opnum::ACCESS, "ACCESS"),
        (opnum::WRITE, "WRITE"),
        (opnum::RELEASE_LOCKOWNER, "RELEASE_LOCKOWNER"),
        (opnum::SECINFO_NO_NAME, "SECINFO_NO_NAME"),
        (opnum::SEQUENCE, "SEQUENCE"),
        (opnum::RECLAIM_COMPLETE, "RECLAIM_COMPLETE"),
        (opnum::ALLOCATE, "ALLOCATE"),
        (opnum::SEEK, "SEEK"),
        (opnum::CLONE, "CLONE"),
        (opnum::LAST, "REMOVEXATTR"),
    ] {
        assert_eq!(name(n), want, "{n}");
    }
    for n in [0, 1, 2, opnum::LAST + 1, opnum::ILLEGAL] {
        assert_eq!(name(n), "ILLEGAL", "{n}");
    }
}

#[test]
fn open_claims_carry_the_rfc_numbers() {
    // RFC 8881 §18.16.1: CLAIM_DELEG_CUR_FH = 5 (with the delegation's
    // stateid), CLAIM_DELEG_PREV_FH = 6 (void).
    let sid = Stateid4 {
        seqid: 7,
        other: [9; 12],
    };
    let mut b = bytes::BytesMut::new();
    ops::OpenClaim4::DelegCurFh(sid).encode(&mut b);
    let mut want = vec![0, 0, 0, 5, 0, 0, 0, 7];
    want.extend_from_slice(&[9; 12]);
    assert_eq!(&b[..], &want[..]);
    let mut b = bytes::BytesMut::new();
    ops::OpenClaim4::DelegPrevFh.encode(&mut b);
    assert_eq!(&b[..], &[0, 0, 0, 6]);
    let mut d = crate::Decoder::new(bytes::Bytes::from(want));
    assert_eq!(
        ops::OpenClaim4::decode(&mut d).unwrap(),
        ops::OpenClaim4::DelegCurFh(sid)
    );
}
