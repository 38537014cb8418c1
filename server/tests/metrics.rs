//! `nfsrdmad --metrics ADDR`: the Prometheus endpoint's values move with
//! the calls made, and requests other than `GET /metrics` get the HTTP
//! error that names the problem. Also, through the endpoint: a daemon
//! whose stdout is closed serves all the same.

mod common;

use nfsrdma_xdr::nfs3::{
    Data, Getattr3Args, Nfs3Args, Nfs3Res, NfsFh3, NfsResult, Read3Args, StableHow, Write3Args,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

struct Daemon {
    child: Child,
    nfs: SocketAddr,
    metrics: SocketAddr,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nfsrdmad over TCP on a port of its choice, with its metrics endpoint
/// at `metrics`.
fn nfsrdmad(metrics: &str) -> Command {
    common::nfsrdmad(&["--no-rdma", "--metrics", metrics])
}

fn start() -> Daemon {
    let mut child = nfsrdmad("127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nfsrdmad");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut addr_after = |prefix: &str| -> SocketAddr {
        let mut line = String::new();
        out.read_line(&mut line).expect("read stdout");
        line.trim()
            .strip_prefix(prefix)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
    };
    let nfs = addr_after("nfsrdmad: listening on tcp ");
    let metrics = addr_after("nfsrdmad: metrics on http ");
    Daemon {
        child,
        nfs,
        metrics,
    }
}

/// Sends `request` and returns (status line, headers, body).
fn http(addr: SocketAddr, request: &[u8]) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the endpoint");
    s.write_all(request).unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").unwrap_or((&all, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

fn scrape(addr: SocketAddr) -> String {
    let (status, headers, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{headers}\n{body}");
    assert!(
        headers.contains("Content-Type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert!(
        headers.contains(&format!("Content-Length: {}", body.len())),
        "{headers}"
    );
    body
}

/// The value of the sample named exactly `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn getattr(c: &mut common::RawClient, fh: &NfsFh3) -> Nfs3Res {
    c.nfs(Nfs3Args::Getattr(Getattr3Args { object: fh.clone() }))
}

#[test]
fn values_move_with_the_calls_made() {
    let d = start();
    let before = scrape(d.metrics);
    assert_eq!(
        value(&before, r#"nfsrdmad_store_files{export="/export"}"#),
        Some(1.0),
        "{before}"
    );
    assert_eq!(value(&before, "nfsrdmad_tcp_connections_open"), Some(0.0));
    // No GETATTR yet: no series for it.
    assert!(!before.contains(r#"procedure="GETATTR""#), "{before}");

    let mut c = common::RawClient::connect(d.nfs);
    let root = c.mount("/export");
    for _ in 0..3 {
        assert!(matches!(
            getattr(&mut c, &root),
            Nfs3Res::Getattr(NfsResult::Ok(_))
        ));
    }
    // A handle the server never gave: an error.
    let mut bad = root.0.to_vec();
    bad[8] ^= 0xff;
    assert!(matches!(
        getattr(&mut c, &NfsFh3(bad.into())),
        Nfs3Res::Getattr(NfsResult::Err(_, _))
    ));
    let f = c.create(&root, "f");
    // A 5,000-byte WRITE (size class 16k) and two 4 KiB READs (4k).
    match c.nfs(Nfs3Args::Write(Write3Args {
        file: f.clone(),
        offset: 0,
        count: 5000,
        stable: StableHow::FileSync,
        data: Data::new(bytes::Bytes::from(vec![1u8; 5000])),
    })) {
        Nfs3Res::Write(NfsResult::Ok(_)) => {}
        r => panic!("WRITE: {r:?}"),
    }
    for _ in 0..2 {
        match c.nfs(Nfs3Args::Read(Read3Args {
            file: f.clone(),
            offset: 0,
            count: 4096,
        })) {
            Nfs3Res::Read(NfsResult::Ok(_)) => {}
            r => panic!("READ: {r:?}"),
        }
    }

    let after = scrape(d.metrics);
    let get = |s: &str| value(&after, s).unwrap_or_else(|| panic!("no {s} in\n{after}"));
    assert_eq!(get(r#"nfsrdmad_nfs_calls_total{procedure="GETATTR"}"#), 4.0);
    assert_eq!(
        get(r#"nfsrdmad_nfs_errors_total{procedure="GETATTR"}"#),
        1.0
    );
    assert_eq!(get(r#"nfsrdmad_nfs_calls_total{procedure="CREATE"}"#), 1.0);
    assert_eq!(get(r#"nfsrdmad_nfs_errors_total{procedure="CREATE"}"#), 0.0);
    // The histogram holds every call, its buckets are cumulative up to
    // +Inf, and its sum is a positive time.
    assert_eq!(
        get(r#"nfsrdmad_nfs_service_seconds_count{procedure="GETATTR"}"#),
        4.0
    );
    assert_eq!(
        get(r#"nfsrdmad_nfs_service_seconds_bucket{procedure="GETATTR",le="+Inf"}"#),
        4.0
    );
    let sum = get(r#"nfsrdmad_nfs_service_seconds_sum{procedure="GETATTR"}"#);
    assert!(sum > 0.0 && sum < 10.0, "{sum}");
    let buckets: Vec<f64> = after
        .lines()
        .filter(|l| l.starts_with("nfsrdmad_nfs_service_seconds_bucket") && l.contains("GETATTR"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), 20, "{after}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    // The server's whole share of each call, by transport, procedure and
    // size class; it holds the service time.
    let turn = |proc_: &str, size: &str, part: &str| {
        get(&format!(
            r#"nfsrdmad_turnaround_seconds_{part}{{transport="tcp",procedure="{proc_}",size="{size}"}}"#
        ))
    };
    assert_eq!(turn("GETATTR", "any", "count"), 4.0);
    assert_eq!(turn("WRITE", "16k", "count"), 1.0);
    assert_eq!(turn("READ", "4k", "count"), 2.0);
    assert!(!after.contains(r#"procedure="READ",size="16k""#), "{after}");
    assert!(
        turn("GETATTR", "any", "sum") >= sum,
        "turnaround {} < service time {sum}",
        turn("GETATTR", "any", "sum")
    );
    assert_eq!(get(r#"nfsrdmad_store_files{export="/export"}"#), 2.0);
    assert_eq!(get("nfsrdmad_tcp_connections_open"), 1.0);
    assert!(get("nfsrdmad_tcp_records_total") >= 6.0);
    assert_eq!(get("nfsrdmad_garbage_args_total"), 0.0);
    assert_eq!(get("nfsrdmad_handler_panics_total"), 0.0);
    // Without an RDMA listener there are no RDMA series.
    assert!(!after.contains("nfsrdmad_rdma_"), "{after}");
}

#[test]
fn other_requests_get_the_error_that_names_them() {
    let d = start();
    let (status, headers, body) = http(d.metrics, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.is_empty(), "{body}");
    assert!(!headers.contains("Content-Length: 0"), "{headers}");
    let (status, _, body) = http(d.metrics, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert!(body.contains("/metrics"), "{body}");
    let (status, headers, _) = http(d.metrics, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(headers.contains("Allow: GET, HEAD"), "{headers}");
    let (status, _, _) = http(d.metrics, b"hello\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
    // A head that never ends is cut at its limit, not read for ever.
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.resize(64 * 1024, b'a');
    let (status, _, _) = http(d.metrics, &huge);
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    // The endpoint still serves.
    scrape(d.metrics);
}

#[test]
fn nfsv4_compounds_are_counted_by_operation_and_main_operation() {
    use bytes::Bytes;
    use common::nfs4::V4;
    use nfsrdma_xdr::nfs4::ops::{ReadArgs, WriteArgs};
    use nfsrdma_xdr::nfs4::{ArgOp, ResOp, StableHow4, Status};
    use nfsrdma_xdr::Payload;
    let d = start();
    let before = scrape(d.metrics);
    assert_eq!(value(&before, "nfsrdmad_nfs4_compounds_total"), None);
    let mut v = V4::new(d.nfs, "metrics client");
    let (sid, fh) = v.open("f", true);
    // A 5000-byte WRITE (size class 16k), two 4 KiB READs, and a COMPOUND
    // that fails at its LOOKUP.
    let r = v.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Write(WriteArgs {
            stateid: sid,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from(vec![7u8; 5000])])),
        }),
        ArgOp::Getattr(Default::default()),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    for _ in 0..2 {
        let r = v.run(vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Read(ReadArgs {
                stateid: sid,
                offset: 0,
                count: 4096,
            }),
        ]);
        assert!(matches!(&r.results[2], ResOp::Read(Ok(_))), "{r:?}");
    }
    let r = v.run(vec![ArgOp::Putrootfh, ArgOp::Lookup("missing".into())]);
    assert_eq!(r.status, Status::NOENT);
    let after = scrape(d.metrics);
    // EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE, the OPEN, the WRITE,
    // two READs, the LOOKUP: 8 COMPOUNDs, one failed.
    assert_eq!(value(&after, "nfsrdmad_nfs4_compounds_total"), Some(8.0));
    assert_eq!(
        value(&after, "nfsrdmad_nfs4_compound_errors_total"),
        Some(1.0)
    );
    for (op, calls, errors) in [
        ("SEQUENCE", 6.0, 0.0),
        ("RECLAIM_COMPLETE", 1.0, 0.0),
        ("PUTFH", 3.0, 0.0),
        ("READ", 2.0, 0.0),
        ("WRITE", 1.0, 0.0),
        ("OPEN", 1.0, 0.0),
        ("LOOKUP", 2.0, 1.0),
        ("EXCHANGE_ID", 1.0, 0.0),
    ] {
        let s = format!("nfsrdmad_nfs4_operations_total{{operation=\"{op}\"}}");
        assert_eq!(value(&after, &s), Some(calls), "{s}");
        let s = format!("nfsrdmad_nfs4_operation_errors_total{{operation=\"{op}\"}}");
        assert_eq!(value(&after, &s), Some(errors), "{s}");
    }
    // Turnarounds under the main operation: the WRITE and READs by size,
    // the OPEN COMPOUND (PUTROOTFH, LOOKUP, OPEN, GETFH) under LOOKUP.
    for (op, size, n) in [
        ("WRITE", "16k", 1.0),
        ("READ", "4k", 2.0),
        ("LOOKUP", "any", 2.0),
        ("CREATE_SESSION", "any", 1.0),
    ] {
        let s = format!(
            "nfsrdmad_nfs4_turnaround_seconds_count{{transport=\"tcp\",operation=\"{op}\",size=\"{size}\"}}"
        );
        assert_eq!(value(&after, &s), Some(n), "{s}\n{after}");
    }
    // NFSv3's series do not count them.
    assert_eq!(
        value(&after, "nfsrdmad_nfs_calls_total{procedure=\"READ\"}"),
        None
    );
}

/// The lines nfsrdmad prints on stdout are for whoever started it; one
/// that stopped reading (closed the pipe before the first line) does not
/// stop the daemon: it serves, and exits cleanly on SIGTERM.
#[test]
fn a_daemon_whose_stdout_reader_is_gone_serves_and_stops_cleanly() {
    let metrics = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap()
    };
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = nfsrdmad(&metrics.to_string())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nfsrdmad");
    // The endpoint comes up after every stdout line but the last.
    let mut body = None;
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            let err = stderr(&mut child);
            panic!("nfsrdmad exited ({status}) with its stdout closed:\n{err}");
        }
        if TcpStream::connect(metrics).is_ok() {
            body = Some(scrape(metrics));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let body = body.expect("the metrics endpoint did not come up within 20 s");
    assert_eq!(value(&body, "nfsrdmad_tcp_connections_open"), Some(0.0));
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = child.wait().unwrap();
    let err = stderr(&mut child);
    assert!(status.success(), "{err}");
}

/// What a daemon that has exited wrote on stderr.
fn stderr(child: &mut Child) -> String {
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut err)
        .expect("read stderr");
    err
}
