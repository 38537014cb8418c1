//! `nfsrdma bench` against the server in-process: option checking, a short
//! latency run and a short throughput run (tables, JSON checked against
//! docs/bench.schema.json, CSV, SVG), RDMA variants that cannot connect,
//! and a corrupted read caught by the verification.

mod common;

use clap::Parser;
use common::*;
use nfsrdma_client::bench::{self, BenchArgs, BenchError, HookFuture, Hooks};
use nfsrdma_client::cli::ConnArgs;
use nfsrdma_client::xdr::nfs3::{NfsFh3, NfsProc3, StableHow};
use nfsrdma_client::Client;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

/// The bench's options as the library sees them.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(flatten)]
    bench: BenchArgs,
}

fn parse(args: &[&str]) -> Result<Args, String> {
    Args::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .map_err(|e| e.to_string())
}

fn server_args(s: &TestServer) -> Vec<String> {
    let port = s.addr.port().to_string();
    [
        "--port",
        &port,
        "--mount-port",
        &port,
        "--uid",
        "0",
        "--gid",
        "0",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

fn nfsrdma(pre: &[String], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nfsrdma"))
        .args(pre)
        .args(args)
        .output()
        .expect("run nfsrdma")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nfsrdma-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}, stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

// ---- a small JSON Schema checker ------------------------------------------
//
// Covers the keywords docs/bench.schema.json uses: type, const, enum,
// properties, required, additionalProperties, items, minimum, maximum,
// oneOf and local $ref. `pattern` is checked by the tests themselves.

fn schema() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench.schema.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("read the schema")).expect("schema")
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        other => panic!("unknown type {other} in the schema"),
    }
}

fn check(root: &Value, s: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
    let obj = s.as_object().expect("a schema is an object");
    for key in obj.keys() {
        assert!(
            [
                "$schema",
                "$id",
                "title",
                "description",
                "$defs",
                "type",
                "const",
                "enum",
                "properties",
                "required",
                "additionalProperties",
                "items",
                "minimum",
                "maximum",
                "oneOf",
                "$ref",
                "pattern",
            ]
            .contains(&key.as_str()),
            "the test's checker does not know the keyword {key}"
        );
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/").expect("local $ref");
        check(root, &root["$defs"][name], v, at, errs);
    }
    if let Some(t) = obj.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap(), v)),
            _ => panic!("bad type keyword"),
        };
        if !ok {
            errs.push(format!("{at}: {v} is not of type {t}"));
            return;
        }
    }
    if let Some(c) = obj.get("const") {
        if c != v {
            errs.push(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(Value::Array(options)) = obj.get("enum") {
        if !options.contains(v) {
            errs.push(format!("{at}: {v} is not one of {options:?}"));
        }
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = obj.get("minimum").and_then(Value::as_f64) {
            if n < min {
                errs.push(format!("{at}: {n} is below {min}"));
            }
        }
        if let Some(max) = obj.get("maximum").and_then(Value::as_f64) {
            if n > max {
                errs.push(format!("{at}: {n} is above {max}"));
            }
        }
    }
    if let Some(Value::Array(options)) = obj.get("oneOf") {
        let matching = options
            .iter()
            .filter(|o| {
                let mut e = Vec::new();
                check(root, o, v, at, &mut e);
                e.is_empty()
            })
            .count();
        if matching != 1 {
            errs.push(format!("{at}: {matching} of oneOf match"));
        }
    }
    if let Value::Object(map) = v {
        if let Some(Value::Array(req)) = obj.get("required") {
            for r in req {
                if !map.contains_key(r.as_str().unwrap()) {
                    errs.push(format!("{at}: {} is missing", r.as_str().unwrap()));
                }
            }
        }
        let props = obj.get("properties").and_then(Value::as_object);
        for (k, val) in map {
            let path = format!("{at}.{k}");
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(root, ps, val, &path, errs),
                None => match obj.get("additionalProperties") {
                    Some(Value::Bool(false)) => errs.push(format!("{path}: not in the schema")),
                    Some(extra @ Value::Object(_)) => check(root, extra, val, &path, errs),
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(items), Some(item_schema)) = (v, obj.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check(root, item_schema, item, &format!("{at}[{i}]"), errs);
        }
    }
}

fn validate(doc: &Value) {
    let root = schema();
    let mut errs = Vec::new();
    check(&root, &root, doc, "$", &mut errs);
    assert!(
        errs.is_empty(),
        "the JSON does not fit the schema:\n{}",
        errs.join("\n")
    );
    let date = doc["date"].as_str().unwrap();
    let b = date.as_bytes();
    assert!(
        date.len() == 20
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[19] == b'Z'
            && date.chars().filter(char::is_ascii_digit).count() == 14,
        "{date}"
    );
}

#[test]
fn the_checker_catches_what_it_should() {
    let mut doc: Value = serde_json::json!({"schema": "nfsrdma-bench/1"});
    let root = schema();
    let mut errs = Vec::new();
    check(&root, &root, &doc, "$", &mut errs);
    assert!(
        errs.iter().any(|e| e.contains("tool is missing")),
        "{errs:?}"
    );
    doc["extra"] = Value::Bool(true);
    errs.clear();
    check(&root, &root, &doc, "$", &mut errs);
    assert!(errs.iter().any(|e| e.contains("$.extra")), "{errs:?}");
}

// ---- option checking ------------------------------------------------------

#[test]
fn options_are_checked_with_clear_messages() {
    let cases: &[(&[&str], &str)] = &[
        (&["-s", "4x", "h:/e"], "is not a size"),
        (&["-s", "1k", "h:/e"], "the file size must be 4k to 1t"),
        (
            &["--mode", "fast", "h:/e"],
            "invalid value 'fast' for '--mode <MODE>'",
        ),
        (&["-r", "4k,2m", "h:/e"], "above the largest, 1 MiB"),
        (&["-r", "", "h:/e"], "empty list"),
        (&["-r", "4k,,8k", "h:/e"], "has an empty item"),
        (
            &["--mix", "101", "h:/e"],
            "--mix is the percentage of reads",
        ),
        (&["--mix=-3", "h:/e"], "--mix is the percentage of reads"),
        (&["--bs", "2m", "h:/e"], "above the largest, 1 MiB"),
        (&["--runtime", "ten", "h:/e"], "is not a duration"),
        (&["--transport", "tcp,", "h:/e"], "--transport"),
        (
            &["--poll", "busy,sometimes", "h:/e"],
            "invalid value 'sometimes'",
        ),
        (&["--jobs", "0", "h:/e"], "--jobs"),
        (
            &["--server-pid", "12,x", "h:/e"],
            "\"x\" is not a process ID",
        ),
        (&["--server-pid", "0", "h:/e"], "\"0\" is not a process ID"),
        (
            &["--server-metrics", "https://h:9420/metrics", "h:/e"],
            "give an http:// URL",
        ),
        (
            &["--server-metrics", "http://h/metrics", "h:/e"],
            "the URL needs HOST:PORT",
        ),
        (&["h"], "is not SERVER:/path"),
    ];
    for (args, want) in cases {
        let err = parse(args).expect_err(&format!("{args:?} parsed"));
        assert!(err.contains(want), "{args:?}: {err:?} lacks {want:?}");
    }
    // The binary says the same and exits non-zero without a panic.
    let o = nfsrdma(&[], &["bench", "-r", "4k,2m", "h:/e"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("above the largest, 1 MiB"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A PID that names no process is refused before anything runs.
    let a = parse(&["--server-pid", "999999999", "h:/e"]).unwrap();
    let err = bench::Plan::from_args(&a.conn, &a.bench).unwrap_err();
    assert!(
        err.to_string()
            .contains("--server-pid 999999999: no such process"),
        "{err}"
    );
    // A list is for bench only.
    let o = nfsrdma(&[], &["ls", "--poll", "busy,event", "h:/e"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--poll takes a list only with `nfsrdma bench`"),
        "{err}"
    );
}

#[test]
fn lists_make_one_variant_per_combination() {
    let a = parse(&[
        "--poll",
        "busy,event",
        "--remote-inv",
        "on,off",
        "--inline",
        "1k,4k",
        "-r",
        "4k,64k,1m",
        "-s",
        "4m",
        "srv:/export/dir",
    ])
    .unwrap();
    let plan = bench::Plan::from_args(&a.conn, &a.bench).unwrap();
    assert_eq!(plan.variants.len(), 8);
    assert_eq!(plan.record_sizes, vec![4096, 65536, 1 << 20]);
    assert_eq!(plan.file_size, 4 << 20);
    assert_eq!(plan.server, "srv");
    assert_eq!(plan.path, "/export/dir");
    let labels: Vec<&str> = plan.variants.iter().map(|v| v.label.as_str()).collect();
    assert_eq!(labels, ["A", "B", "C", "D", "E", "F", "G", "H"]);
    assert_eq!(
        plan.variants[0].describe(),
        "transport=tcp remote-inv=on reg=mw poll=busy inline=1k"
    );
    assert_eq!(
        plan.variants[7].describe(),
        "transport=tcp remote-inv=off reg=mw poll=event inline=4k"
    );
    assert!(!plan.variants[7].options.rdma.remote_inv);
    // --inline reaches the connection options of each variant.
    assert_eq!(plan.variants[0].options.rdma.inline, 1024);
    assert_eq!(plan.variants[7].options.rdma.inline, 4096);
    // Defaults: one variant, the iozone record sizes, 128 MiB.
    let a = parse(&["srv:/export"]).unwrap();
    let plan = bench::Plan::from_args(&a.conn, &a.bench).unwrap();
    assert_eq!(plan.variants.len(), 1);
    assert_eq!(plan.file_size, 128 << 20);
    assert_eq!(
        plan.record_sizes,
        [1, 2, 4, 8, 16, 32, 64].map(|k| k << 10).to_vec()
    );
    assert!(a.conn.check_single().is_ok());
}

// ---- runs -------------------------------------------------------------------

#[test]
fn latency_run_writes_table_json_csv_and_svg() {
    let s = TestServer::start(EXPORTS);
    let dir = tmpdir("latency");
    let (json, csv, svg) = (dir.join("r.json"), dir.join("r.csv"), dir.join("r.svg"));
    let o = nfsrdma(
        &server_args(&s),
        &[
            "bench",
            "127.0.0.1:/export",
            "-s",
            "1m",
            "-r",
            "4k,64k",
            "--poll",
            "busy,event",
            "--rounds",
            "2",
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let out = ok(&o);
    // The iozone-shaped table first, then the percentiles.
    let iozone = out.find("QD1 latency, median").expect(&out);
    let pct = out.find("Latency percentiles").expect(&out);
    assert!(iozone < pct, "{out}");
    let header = out[iozone..].lines().nth(1).unwrap();
    for col in ["write:A", "write:B", "rewrite:A", "read:B", "reread:B"] {
        assert!(header.contains(col), "{header}");
    }
    let rows: Vec<&str> = out[iozone..pct]
        .lines()
        .skip(2)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[0].trim_start().starts_with("4k") && rows[1].trim_start().starts_with("64k"));
    assert_eq!(rows[0].split_whitespace().count(), 1 + 8, "{}", rows[0]);
    assert!(out.contains("n/a"), "breakdown column: {out}");

    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    validate(&doc);
    assert_eq!(doc["mode"], "latency");
    assert_eq!(doc["server"], "127.0.0.1");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(doc["host"]["kernel"], kernel.trim());
    assert!(doc["host"]["cpus"].as_u64().unwrap() >= 1);
    assert_eq!(doc["config"]["file_size_bytes"], 1 << 20);
    assert_eq!(doc["variants"].as_array().unwrap().len(), 2);
    assert_eq!(doc["variants"][1]["poll"], "event");
    assert_eq!(doc["variants"][0]["status"], "ok");
    let lat = doc["latency"].as_array().unwrap();
    assert_eq!(lat.len(), 2 * 4 * 2);
    for row in lat {
        let want = if row["record_size_bytes"] == 4096 {
            256
        } else {
            16
        };
        assert_eq!(row["summary"]["samples"], want, "{row}");
        let m = &row["summary"];
        assert!(m["min_us"].as_f64() <= m["median_us"].as_f64());
        assert!(m["median_us"].as_f64() <= m["p99_us"].as_f64());
        assert!(m["p99_us"].as_f64() <= m["max_us"].as_f64());
    }

    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert_eq!(header, bench::report::CSV_HEADER);
    let ncols = header.split(',').count();
    let body: Vec<&str> = lines.collect();
    assert_eq!(body.len(), 16);
    for l in &body {
        assert_eq!(l.split(',').count(), ncols, "{l}");
        assert!(l.contains(",latency,"), "{l}");
    }

    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg "), "{chart}");
    assert!(chart.trim_end().ends_with("</svg>"));
    // Four panels (write, rewrite, read, reread), one line per variant.
    assert_eq!(chart.matches("<polyline").count(), 8);
    // The bench files are gone.
    let c = tokio::runtime::Runtime::new().unwrap();
    let names = c.block_on(async {
        let cl = connect(&s, "/export").await;
        cl.readdir_all(cl.root()).await.unwrap()
    });
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn throughput_run_reports_iops_and_cpu() {
    let s = TestServer::start(EXPORTS);
    let server_pid = std::process::id().to_string();
    let metrics_url = format!("http://{}/metrics", s.metrics);
    let dir = tmpdir("throughput");
    let (json, csv, svg) = (dir.join("t.json"), dir.join("t.csv"), dir.join("t.svg"));
    let o = nfsrdma(
        &server_args(&s),
        &[
            "bench",
            "127.0.0.1:/export",
            "--mode",
            "throughput",
            "-s",
            "1m",
            "--jobs",
            "2",
            "--iodepth",
            "2",
            "--rw",
            "randrw",
            "--mix",
            "70",
            "--bs",
            "4k",
            "--bytes",
            "2m",
            "--rounds",
            "2",
            "--server-pid",
            &server_pid,
            "--server-metrics",
            &metrics_url,
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let out = ok(&o);
    assert!(out.contains("the server's mean turnaround"), "{out}");
    assert!(
        out.contains("Throughput: randrw (70% reads), bs 4 KiB, 2 job(s) x iodepth 2"),
        "{out}"
    );
    assert!(out.contains("client cores"), "{out}");
    // The server runs in this test process: its CPU is this PID's.
    assert!(
        out.contains(&format!(
            "server CPU: user + system time of PIDs [{server_pid}]"
        )),
        "{out}"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    validate(&doc);
    assert_eq!(doc["mode"], "throughput");
    assert_eq!(doc["config"]["throughput"]["read_percent"], 70);
    assert_eq!(doc["config"]["throughput"]["bytes"], 2 << 20);
    assert!(doc["latency"].is_null());
    let row = &doc["throughput"][0];
    // --bytes bounds the run exactly: 2 MiB of 4 KiB calls.
    assert_eq!(row["ops"], 512);
    assert_eq!(row["bytes"], 2 << 20);
    assert_eq!(
        row["read_ops"].as_u64().unwrap() + row["write_ops"].as_u64().unwrap(),
        512
    );
    assert_eq!(row["latency"]["samples"], 512);
    assert!(row["server_cpu_cores"].as_f64().unwrap() >= 0.0, "{row}");
    // The server counted exactly the run's calls (the file was laid out
    // before the first slice), and its share of each is part of the
    // client's latency.
    let counters = &row["server_counters"];
    let calls = |p: &str| {
        counters[format!("nfsrdmad_nfs_calls_total{{procedure=\"{p}\"}}")]
            .as_f64()
            .unwrap_or(0.0)
    };
    assert_eq!(calls("READ") + calls("WRITE"), 512.0, "{counters}");
    assert_eq!(
        calls("READ"),
        row["read_ops"].as_f64().unwrap(),
        "{counters}"
    );
    let server = row["server_turnaround_us"].as_f64().unwrap();
    let client = row["latency"]["mean_us"].as_f64().unwrap();
    assert!(
        server > 0.0 && server < client,
        "server {server} us, client {client} us"
    );
    assert_eq!(doc["config"]["throughput"]["server_metrics"], metrics_url);
    assert_eq!(
        doc["config"]["throughput"]["server_pids"],
        serde_json::json!([std::process::id()])
    );
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv_text.lines().count(), 2);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(chart.matches("<polyline").count(), 1);
}

/// A metrics endpoint that does not answer ends a run with an error
/// naming it, not with counters missing from the report.
#[test]
fn an_unreachable_server_metrics_endpoint_is_a_clear_error() {
    let s = TestServer::start(EXPORTS);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{closed}/metrics");
    let o = nfsrdma(
        &server_args(&s),
        &[
            "bench",
            "127.0.0.1:/export",
            "--mode",
            "throughput",
            "-s",
            "64k",
            "--bs",
            "4k",
            "--bytes",
            "64k",
            "--rounds",
            "1",
            "--server-metrics",
            &url,
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("--server-metrics: {url}")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn plan_for(s: &TestServer, extra: &[&str]) -> bench::Plan {
    let pre = server_args(s);
    let mut args: Vec<&str> = pre.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    args.push("--no-progress");
    args.push("127.0.0.1:/export");
    let a = parse(&args).unwrap();
    bench::Plan::from_args(&a.conn, &a.bench).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_variants_that_cannot_connect_are_reported() {
    let s = TestServer::start(EXPORTS);
    // Every variant RDMA: the run fails before any I/O, naming each.
    let plan = plan_for(
        &s,
        &[
            "--transport",
            "rdma",
            "--reg",
            "mw,persistent",
            "-s",
            "64k",
            "-r",
            "4k",
        ],
    );
    match bench::run(&plan).await {
        Err(BenchError::NoVariant(msg)) => {
            assert!(
                msg.contains("A (transport=rdma remote-inv=on reg=mw"),
                "{msg}"
            );
            assert!(
                msg.contains("B (transport=rdma remote-inv=on reg=persistent"),
                "{msg}"
            );
        }
        other => panic!("expected NoVariant, got {other:?}"),
    }
    // RDMA beside TCP: the TCP variant runs, the RDMA one is reported.
    let plan = plan_for(
        &s,
        &[
            "--transport",
            "rdma,tcp",
            "-s",
            "64k",
            "-r",
            "4k",
            "--rounds",
            "1",
        ],
    );
    let r = bench::run(&plan).await.expect("the TCP variant runs");
    assert!(r.variants[0].error.is_some());
    assert!(r.variants[1].error.is_none());
    assert_eq!(r.latency.len(), 4);
    assert!(r
        .latency
        .iter()
        .all(|l| l.variant == 1 && l.summary.samples == 16));
    let text = bench::report::text(&r);
    assert!(text.contains("DID NOT RUN"), "{text}");
    let doc = bench::report::json(&r);
    validate(&doc);
    assert_eq!(doc["variants"][0]["status"], "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_read_is_caught_and_named() {
    let s = TestServer::start(EXPORTS);
    let plan = plan_for(&s, &["-s", "64k", "-r", "4k", "--rounds", "2"]);
    let opts = opts_at(s.addr);
    const AT: u64 = 12_345;
    let hooks = Hooks {
        after_writes: Some(Arc::new(
            move |_bench_client: Client, fh: NfsFh3, _record_size: u64| -> HookFuture {
                let opts = opts.clone();
                Box::pin(async move {
                    // A second client flips one byte of the file.
                    let other = Client::connect(&opts, "127.0.0.1", "/export").await?;
                    let r = other.read(&fh, AT, 1).await?;
                    let flipped = vec![!r.data.to_contiguous()[0]];
                    other.write(&fh, AT, flipped, StableHow::FileSync).await?;
                    other.shutdown();
                    Ok(())
                })
            },
        )),
    };
    let err = bench::run_with_hooks(&plan, &hooks)
        .await
        .expect_err("the corruption must be caught");
    match &err {
        BenchError::Mismatch {
            offset,
            phase,
            record_offset,
            ..
        } => {
            assert_eq!(*offset, AT);
            assert_eq!(*phase, "read");
            assert_eq!(*record_offset, 12_288);
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert!(
        err.to_string().contains("data mismatch at offset 12345"),
        "{err}"
    );
    // Without the hook the same plan passes.
    bench::run(&plan).await.expect("clean run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_export_fails_the_check_of_reads_unless_no_verify_is_given() {
    // A null export discards WRITEs and answers READs with zeros: the
    // bench's check of what it reads catches that, and --no-verify (meant
    // for such a server) turns the check off in both modes.
    let s = TestServer::start("/export *(rw,null,no_root_squash,insecure)\n");
    let throughput = [
        "--mode",
        "throughput",
        "-s",
        "64k",
        "--rw",
        "randread",
        "--runtime",
        "200ms",
        "--rounds",
        "1",
    ];
    let latency = ["-s", "16k", "-r", "4k", "--rounds", "1"];
    for args in [&throughput[..], &latency[..]] {
        let plan = plan_for(&s, args);
        assert!(plan.verify);
        match bench::run(&plan).await {
            Err(BenchError::Mismatch { found, .. }) => assert_eq!(found, 0),
            other => panic!("{args:?}: expected a mismatch, got {other:?}"),
        }
        let mut unchecked = args.to_vec();
        unchecked.push("--no-verify");
        let plan = plan_for(&s, &unchecked);
        assert!(!plan.verify);
        let r = bench::run(&plan).await.expect("the unchecked run passes");
        let doc = bench::report::json(&r);
        validate(&doc);
        assert_eq!(doc["config"]["verify"], false, "{args:?}");
        let reads = match plan.mode {
            bench::Mode::Throughput => r.throughput[0].read_ops,
            bench::Mode::Latency => r
                .latency
                .iter()
                .filter(|row| row.phase == bench::Phase::Read)
                .map(|row| row.summary.samples)
                .sum(),
        };
        assert!(reads > 0, "{args:?}: no reads were made");
    }
}

// ---- over RDMA, in the Soft-RoCE VM -------------------------------------------

fn rdma_server_args(s: &common::rdma::RdmaServer) -> Vec<String> {
    [
        "--transport".to_string(),
        "rdma".into(),
        "--port".into(),
        s.rdma_port.to_string(),
        "--mount-port".into(),
        s.tcp.port().to_string(),
        "--uid".into(),
        "0".into(),
        "--gid".into(),
        "0".into(),
    ]
    .to_vec()
}

fn counters<'a>(doc: &'a Value, label: &str) -> &'a Value {
    let v = doc["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["label"] == label)
        .unwrap_or_else(|| panic!("no variant {label}: {doc}"));
    assert_eq!(v["status"], "ok", "{v}");
    &v["transport_counters"]
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn vm_bench_latency_over_rdma_applies_inline_and_remote_invalidation() {
    assert_eq!(
        std::env::var("NFSRDMA_VM").as_deref(),
        Ok("1"),
        "run with scripts/test-vm"
    );
    let s = common::rdma::RdmaServer::start();
    let ip = common::rdma::rdma_ip();
    let dir = tmpdir("vm-latency");
    let (json, csv, svg) = (dir.join("r.json"), dir.join("r.csv"), dir.join("r.svg"));
    let target = format!("{ip}:/export");
    let o = nfsrdma(
        &rdma_server_args(&s),
        &[
            "bench",
            &target,
            "--remote-inv",
            "on,off",
            "--inline",
            "1k,4k",
            "-s",
            "256k",
            "-r",
            "2k,64k",
            "--rounds",
            "2",
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let out = ok(&o);
    println!("{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    validate(&doc);
    // The Soft-RoCE device is named in the report.
    let devices = doc["host"]["rdma_devices"].as_array().unwrap();
    assert!(
        devices
            .iter()
            .any(|d| d.as_str().unwrap().starts_with("rxe")),
        "{devices:?}"
    );
    // A: RI on, 1k; B: RI on, 4k; C: RI off, 1k; D: RI off, 4k.
    let labels = ["A", "B", "C", "D"];
    for (l, inline) in labels.iter().zip([1024, 4096, 1024, 4096]) {
        let v = doc["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["label"] == *l)
            .unwrap();
        assert_eq!(v["transport"], "rdma");
        assert_eq!(v["inline_bytes"], inline, "{v}");
    }
    // Each variant wrote 256 KiB twice (write, rewrite) and read it twice,
    // at 2 KiB (128 records) and at 64 KiB (4 records).
    let small_writes = 2 * 128;
    let large_writes = 2 * 4;
    for l in labels {
        let c = counters(&doc, l);
        let inline_1k = l == "A" || l == "C";
        let read_chunks = c["read_chunk_calls"].as_u64().unwrap();
        let write_chunks = c["write_chunk_calls"].as_u64().unwrap();
        if inline_1k {
            // A 2 KiB WRITE does not fit 1 KiB inline: its data goes in a
            // Read chunk; a 2 KiB READ reply comes back in a Write chunk.
            assert!(read_chunks >= small_writes + large_writes, "{l}: {c}");
            assert!(write_chunks >= small_writes + large_writes, "{l}: {c}");
        } else {
            // At 4 KiB inline only the 64 KiB records need chunks.
            assert_eq!(read_chunks, large_writes, "{l}: {c}");
            assert_eq!(write_chunks, large_writes, "{l}: {c}");
        }
        let ri_on = l == "A" || l == "B";
        let swi = c["send_with_invalidate"].as_u64().unwrap();
        if ri_on {
            assert!(swi >= read_chunks, "{l}: remote invalidation unused: {c}");
        } else {
            assert_eq!(swi, 0, "{l}: {c}");
            assert!(
                c["local_invalidations"].as_u64().unwrap() >= read_chunks,
                "{l}: {c}"
            );
        }
        assert_eq!(c["retransmits"], 0, "{l}: {c}");
    }
    // Every latency row of an RDMA variant has its per-step breakdown.
    let lat = doc["latency"].as_array().unwrap();
    assert_eq!(lat.len(), 4 * 2 * 4);
    for row in lat {
        let b = &row["breakdown_us"];
        for step in ["register", "send_to_reply", "invalidate", "copy_out"] {
            assert!(b[step].as_f64().is_some(), "{row}");
        }
        // The wire is most of a call; the steps fit inside its mean.
        let sum: f64 = ["register", "send_to_reply", "invalidate", "copy_out"]
            .iter()
            .map(|k| b[*k].as_f64().unwrap())
            .sum();
        assert!(
            sum <= row["summary"]["mean_us"].as_f64().unwrap() * 1.05 + 1.0,
            "{row}"
        );
    }
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(chart.matches("<polyline").count(), 4 * 4);
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap().lines().count(),
        1 + lat.len()
    );
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn vm_bench_throughput_over_rdma() {
    assert_eq!(
        std::env::var("NFSRDMA_VM").as_deref(),
        Ok("1"),
        "run with scripts/test-vm"
    );
    let s = common::rdma::RdmaServer::start();
    let ip = common::rdma::rdma_ip();
    let dir = tmpdir("vm-throughput");
    let json = dir.join("t.json");
    let target = format!("{ip}:/export");
    let o = nfsrdma(
        &rdma_server_args(&s),
        &[
            "bench",
            &target,
            "--mode",
            "throughput",
            "--reg",
            "mw,reg-mr",
            "-s",
            "1m",
            "--jobs",
            "2",
            "--iodepth",
            "4",
            "--rw",
            "randrw",
            "--mix",
            "50",
            "--bs",
            "16k",
            "--bytes",
            "4m",
            "--rounds",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let out = ok(&o);
    println!("{out}");
    assert!(out.contains("IOPS"), "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    validate(&doc);
    let rows = doc["throughput"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        // --bytes bounds each variant exactly: 4 MiB of 16 KiB calls.
        assert_eq!(row["ops"], 256, "{row}");
        assert_eq!(row["bytes"], 4 << 20, "{row}");
        assert!(row["iops"].as_f64().unwrap() > 0.0, "{row}");
    }
    // mw binds windows; reg-mr registers a region per RPC instead.
    let a = counters(&doc, "A");
    let b = counters(&doc, "B");
    assert!(a["window_binds"].as_u64().unwrap() >= 256, "{a}");
    assert_eq!(a["mr_registrations"], 0, "{a}");
    assert!(b["mr_registrations"].as_u64().unwrap() >= 256, "{b}");
    assert_eq!(b["window_binds"], 0, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_larger_than_the_transfer_size_go_out_in_parallel_pieces() {
    let s = TestServer::start(EXPORTS);
    // 4 KiB transfers: each 64 KiB record is 16 WRITEs, then 16 READs,
    // in flight together; the data must still land and read back in order.
    let plan = plan_for(
        &s,
        &[
            "--rsize", "4096", "--wsize", "4096", "-s", "256k", "-r", "64k,4k", "--rounds", "1",
        ],
    );
    let calls = |s: &TestServer, p: NfsProc3| s.service.metrics().calls(p);
    let (w0, r0) = (calls(&s, NfsProc3::Write), calls(&s, NfsProc3::Read));
    let r = bench::run(&plan).await.expect("run");
    assert_eq!(r.variants[0].wsize, 4096);
    // 256 KiB written twice and read twice at each record size, 4 KiB per call.
    assert_eq!(calls(&s, NfsProc3::Write) - w0, 2 * 2 * 64, "WRITE calls");
    assert_eq!(calls(&s, NfsProc3::Read) - r0, 2 * 2 * 64, "READ calls");
    for row in &r.latency {
        let records = (256 << 10) / row.record_size;
        assert_eq!(row.summary.samples, records, "{row:?}");
    }
}
