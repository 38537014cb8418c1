//! RPC-over-RDMA messages captured on the wire between two Soft-RoCE guests
//! (fixtures/rpcrdma, made by scripts/capture-rpcrdma): the Linux kernel
//! client's calls must pass the responder core as calls whose chunk lists
//! fit their NFS arguments, and the replies of the kernel nfsd and of
//! nfsrdmad must pass the requester core's reply checks against their
//! calls, with results that decode.

use bytes::Bytes;
use nfsrdma_rpcrdma::requester::{self, CallPlan, CallShape, Reply, ReplyMessage};
use nfsrdma_rpcrdma::responder::{self, IncomingCall, Received, ResponderConfig};
use nfsrdma_xdr::nfs3::{Nfs3Args, Nfs3Res, NfsProc3, NfsResult};
use nfsrdma_xdr::rpc::{AcceptStat, MessageBody, ReplyBody};
use nfsrdma_xdr::rpcrdma::{proc_, RdmaHeader};
use nfsrdma_xdr::{Decoder, Payload, Xdr};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const NFS_PROGRAM: u32 = 100_003;
const NFSACL_PROGRAM: u32 = 100_227;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/rpcrdma")
}

/// One line of index.tsv.
#[derive(Debug)]
struct Entry {
    file: String,
    kind: String,
    capture: String,
    xid: u32,
    procedure: String,
    rdma_proc: String,
    layout: String,
    bytes: Bytes,
}

impl Entry {
    /// The pair number the extractor gave a call and its reply.
    fn pair(&self) -> u32 {
        let name = self.file.rsplit('/').next().unwrap();
        name[..4].parse().unwrap()
    }
}

fn load() -> Vec<Entry> {
    let root = dir();
    let index =
        std::fs::read_to_string(root.join("index.tsv")).expect("fixtures/rpcrdma/index.tsv");
    let mut out = Vec::new();
    for line in index
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 8, "index line {line:?}");
        let bytes = std::fs::read(root.join(f[0])).unwrap_or_else(|e| panic!("{}: {e}", f[0]));
        assert_eq!(
            bytes.len(),
            f[7].parse::<usize>().unwrap(),
            "{}: size",
            f[0]
        );
        let name = f[0].rsplit('/').next().unwrap();
        assert!(
            name.ends_with(&format!("-{}-{}.bin", f[4], f[6])),
            "{}: name does not match procedure {} and layout {}",
            f[0],
            f[4],
            f[6]
        );
        out.push(Entry {
            file: f[0].to_string(),
            kind: f[1].to_string(),
            capture: f[2].to_string(),
            xid: u32::from_str_radix(f[3].trim_start_matches("0x"), 16).unwrap(),
            procedure: f[4].to_string(),
            rdma_proc: f[5].to_string(),
            layout: f[6].to_string(),
            bytes: Bytes::from(bytes),
        });
    }
    // Every message file is listed.
    let listed: Vec<&str> = out.iter().map(|e| e.file.as_str()).collect();
    for d in std::fs::read_dir(&root).unwrap() {
        let d = d.unwrap();
        if !d.file_type().unwrap().is_dir() {
            continue;
        }
        let folder = d.file_name().into_string().unwrap();
        for f in std::fs::read_dir(d.path()).unwrap() {
            let name = format!("{folder}/{}", f.unwrap().file_name().into_string().unwrap());
            assert!(
                listed.contains(&name.as_str()),
                "{name} is not in index.tsv"
            );
        }
    }
    out
}

/// The settings of the captured connections as the responder sees them:
/// the Linux client's 4 KiB inline thresholds, remote invalidation on.
fn config() -> ResponderConfig {
    ResponderConfig {
        inline_send: 4096,
        inline_recv: 4096,
        credits: 128,
        remote_invalidation: true,
        max_call: (1 << 20) + 64 * 1024,
    }
}

fn call_layout(c: &IncomingCall) -> String {
    let mut parts = Vec::new();
    if c.read_chunks.first().is_some_and(|r| r.position == 0) {
        parts.push("long");
    } else if !c.read_chunks.is_empty() {
        parts.push("read");
    }
    if !c.write_list.is_empty() {
        parts.push("write");
    }
    if c.reply_chunk.is_some() {
        parts.push("reply");
    }
    if parts.is_empty() {
        "inline".into()
    } else {
        parts.join("+")
    }
}

fn nfs_proc_name(p: NfsProc3) -> String {
    format!("{p:?}").to_uppercase()
}

/// What a checked call tells about its reply.
struct CallFacts {
    call: IncomingCall,
    /// The NFSv3 procedure, when the call is an NFSv3 call.
    nfs: Option<NfsProc3>,
}

fn check_call(e: &Entry) -> CallFacts {
    let call = match responder::receive(e.bytes.clone(), &config()) {
        Received::Call(c) => c,
        other => panic!("{}: not classified as a call: {other:?}", e.file),
    };
    assert_eq!(call.xid, e.xid, "{}: xid", e.file);
    assert_eq!(call_layout(&call), e.layout, "{}: chunk layout", e.file);
    // The chunks' data is not in the capture: stand-ins of the announced sizes.
    let data: Vec<Payload> = call
        .read_chunks
        .iter()
        .map(|c| Payload::from(vec![0xa5u8; c.total_len() as usize]))
        .collect();
    let mut d = call
        .assemble(data)
        .unwrap_or_else(|err| panic!("{}: {err}", e.file));
    if call.read_chunks.first().is_some_and(|c| c.position == 0) {
        // A long call: the RPC message itself was in the chunk.
        return CallFacts { call, nfs: None };
    }
    let msg = nfsrdma_xdr::rpc::RpcMessage::decode(&mut d)
        .unwrap_or_else(|err| panic!("{}: RPC header: {err}", e.file));
    assert_eq!(msg.xid, call.xid, "{}: RPC xid vs rdma_xid", e.file);
    let body = msg
        .as_call()
        .unwrap_or_else(|| panic!("{}: not an RPC call", e.file));
    assert_eq!(body.rpcvers, 2, "{}", e.file);
    let nfs = match (body.prog, body.vers) {
        (NFS_PROGRAM, 3) => {
            let p = NfsProc3::from_u32(body.proc_)
                .unwrap_or_else(|| panic!("{}: NFSv3 procedure {}", e.file, body.proc_));
            assert_eq!(nfs_proc_name(p), e.procedure, "{}: procedure", e.file);
            Some(p)
        }
        (NFSACL_PROGRAM, 3) => {
            assert!(e.procedure.starts_with("ACL-"), "{}", e.file);
            None
        }
        (prog, vers) => panic!("{}: unexpected program {prog} version {vers}", e.file),
    };
    let Some(p) = nfs else {
        return CallFacts { call, nfs };
    };
    let args =
        Nfs3Args::decode(p, &mut d).unwrap_or_else(|err| panic!("{}: {p:?} args: {err}", e.file));
    assert_eq!(d.remaining(), 0, "{}: bytes after the arguments", e.file);
    let non_zero_read = call.read_chunks.iter().find(|c| c.position != 0);
    match &args {
        Nfs3Args::Write(w) => {
            assert_eq!(w.data.0.len(), w.count as usize, "{}: WRITE count", e.file);
            match non_zero_read {
                // The data travelled in the Read chunk, unpadded.
                Some(c) => assert_eq!(c.total_len(), u64::from(w.count), "{}", e.file),
                // Inline only if the call fits the inline threshold.
                None => assert!(e.bytes.len() <= 4096, "{}", e.file),
            }
            // A call over the threshold must not travel inline.
            if w.count > 4096 {
                assert!(non_zero_read.is_some(), "{}: large WRITE inline", e.file);
            }
        }
        Nfs3Args::Symlink(s) => {
            let path_len = s.symlink.symlink_data.0.len() as u64;
            if let Some(c) = non_zero_read {
                assert_eq!(c.total_len(), path_len, "{}: SYMLINK path chunk", e.file);
            }
        }
        Nfs3Args::Read(r) => {
            // The Linux client offers a Write chunk for data that may not
            // fit its receive buffers, sized to the count asked for.
            if r.count >= 4096 {
                let w = call.write_list.first().unwrap_or_else(|| {
                    panic!("{}: READ of {} without a Write chunk", e.file, r.count)
                });
                assert!(
                    w.total_len() >= u64::from(r.count),
                    "{}: Write chunk too small",
                    e.file
                );
            }
            if let Some(w) = call.write_list.first() {
                assert!(
                    w.total_len() >= u64::from(r.count),
                    "{}: Write chunk too small",
                    e.file
                );
            }
        }
        Nfs3Args::Readdirplus(r) => {
            // A reply that may be larger than 4 KiB needs a Reply chunk
            // that can take all of it.
            let room = call.reply_chunk.as_ref().map_or(0, |c| c.total_len());
            assert!(
                r.maxcount <= 4096 || room >= u64::from(r.maxcount),
                "{}: READDIRPLUS maxcount {} with a Reply chunk of {room}",
                e.file,
                r.maxcount
            );
        }
        _ => {}
    }
    if !matches!(args, Nfs3Args::Write(_) | Nfs3Args::Symlink(_)) {
        assert!(
            non_zero_read.is_none(),
            "{}: Read chunk in a {p:?} call",
            e.file
        );
    }
    if !matches!(args, Nfs3Args::Read(_) | Nfs3Args::Readlink(_)) {
        assert!(
            call.write_list.is_empty(),
            "{}: Write chunk in a {p:?} call",
            e.file
        );
    }
    CallFacts { call, nfs }
}

fn plan_of(call: &IncomingCall) -> CallPlan {
    CallPlan {
        xid: call.xid,
        shape: CallShape::Inline,
        inline: Vec::new(),
        read: None,
        write_chunk: call.write_list.first().map(|w| w.total_len() as u32),
        reply_chunk: call.reply_chunk.as_ref().map(|r| r.total_len() as u32),
    }
}

/// Checks a reply against its call; returns its layout.
fn check_reply(e: &Entry, facts: &CallFacts) -> String {
    let h = RdmaHeader::decode(&mut Decoder::new(e.bytes.clone()))
        .unwrap_or_else(|err| panic!("{}: reply header: {err}", e.file));
    assert_eq!(h.xid, facts.call.xid, "{}: xid", e.file);
    assert_eq!(h.vers, 1, "{}", e.file);
    assert!(h.credit >= 1, "{}: no credits granted", e.file);
    let expected_proc = match e.rdma_proc.as_str() {
        "RDMA_MSG" => proc_::RDMA_MSG,
        "RDMA_NOMSG" => proc_::RDMA_NOMSG,
        "RDMA_ERROR" => proc_::RDMA_ERROR,
        other => panic!("{}: unexpected {other}", e.file),
    };
    assert_eq!(h.body.proc_(), expected_proc, "{}", e.file);
    let reply = requester::parse_reply(e.bytes.clone(), &plan_of(&facts.call))
        .unwrap_or_else(|err| panic!("{}: {err}", e.file));
    let Reply::Message {
        message, written, ..
    } = reply
    else {
        return "error".into();
    };
    let layout = match (&message, written) {
        (ReplyMessage::InReplyChunk(n), w) => {
            assert!(*n > 0, "{}: empty Reply chunk", e.file);
            if w.is_some_and(|w| w > 0) {
                "write-list+reply-chunk"
            } else {
                "reply-chunk"
            }
        }
        (ReplyMessage::Inline(_), Some(w)) if w > 0 => "write-list",
        (ReplyMessage::Inline(_), _) => "inline",
    };
    if let ReplyMessage::Inline(msg) = message {
        // The RPC reply follows; DDP data written into the Write chunk is
        // not in the capture: a stand-in of the written size.
        let ddp = written.map(|n| Payload::from(vec![0x5au8; n as usize]));
        let mut d: Decoder = requester::reply_decoder(msg, ddp);
        let m = nfsrdma_xdr::rpc::RpcMessage::decode(&mut d)
            .unwrap_or_else(|err| panic!("{}: RPC reply header: {err}", e.file));
        assert_eq!(m.xid, facts.call.xid, "{}: RPC xid", e.file);
        let MessageBody::Reply(ReplyBody::Accepted(a)) = m.body else {
            panic!("{}: not an accepted RPC reply", e.file);
        };
        if facts.nfs.is_some() {
            assert_eq!(a.stat, AcceptStat::Success, "{}", e.file);
        } else {
            // NFSACL: nfsrdmad does not serve it and says so.
            assert!(
                matches!(a.stat, AcceptStat::Success | AcceptStat::ProgUnavail),
                "{}: {:?}",
                e.file,
                a.stat
            );
        }
        if let Some(p) = facts.nfs {
            let res = Nfs3Res::decode(p, &mut d)
                .unwrap_or_else(|err| panic!("{}: {p:?} result: {err}", e.file));
            assert_eq!(d.remaining(), 0, "{}: bytes after the result", e.file);
            if let (Nfs3Res::Read(NfsResult::Ok(r)), Some(w)) = (&res, written) {
                assert_eq!(r.count, w, "{}: READ count vs bytes written", e.file);
                assert_eq!(r.data.0.len(), w as usize, "{}", e.file);
            }
            if let Nfs3Res::Read(NfsResult::Ok(r)) = &res {
                assert_eq!(r.data.0.len(), r.count as usize, "{}", e.file);
            }
        }
    }
    layout.into()
}

#[test]
fn captured_messages_pass_the_protocol_cores() {
    let entries = load();
    let mut calls: BTreeMap<u32, (&Entry, CallFacts)> = BTreeMap::new();
    let mut replies: Vec<&Entry> = Vec::new();
    for e in &entries {
        let folder = e.file.split('/').next().unwrap();
        match e.kind.as_str() {
            "call" => {
                assert!(
                    folder.ends_with("-client-calls"),
                    "{}: call outside a calls folder",
                    e.file
                );
                let facts = check_call(e);
                assert!(
                    calls.insert(e.pair(), (e, facts)).is_none(),
                    "{}: pair number",
                    e.file
                );
            }
            "reply" => {
                assert!(
                    folder.ends_with("-replies"),
                    "{}: reply outside a replies folder",
                    e.file
                );
                replies.push(e);
            }
            other => panic!("{}: kind {other}", e.file),
        }
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut count = |what: &str| *seen.entry(what.to_string()).or_default() += 1;
    for (call, _) in calls.values() {
        for part in call.layout.split('+') {
            count(&format!("call {part}"));
        }
        count(&format!(
            "call from {}",
            call.file.split('/').next().unwrap()
        ));
    }
    for r in &replies {
        let (call, facts) = calls
            .get(&r.pair())
            .unwrap_or_else(|| panic!("{}: no call with its number", r.file));
        assert_eq!(call.capture, r.capture, "{}: capture", r.file);
        assert_eq!(call.procedure, r.procedure, "{}: procedure", r.file);
        let layout = check_reply(r, facts);
        assert_eq!(layout, r.layout, "{}: reply layout", r.file);
        for part in layout.split('+') {
            count(&format!("reply {part}"));
        }
        count(&format!("reply from {}", r.file.split('/').next().unwrap()));
    }
    eprintln!("captured fixtures: {seen:#?}");
    for want in [
        "call inline",
        "call read",
        "call write",
        "call reply",
        "reply inline",
        "reply write-list",
        "reply reply-chunk",
        "call from linux-client-calls",
        "reply from knfsd-replies",
        "reply from nfsrdmad-replies",
    ] {
        assert!(
            seen.get(want).copied().unwrap_or(0) > 0,
            "no captured {want}"
        );
    }
}
