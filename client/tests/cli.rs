//! The `nfsrdma` binary against the server in-process: ls, put, get, cat,
//! stat, mkdir, rm, and bad input (a one-line error and a non-zero exit,
//! never a panic).

mod common;

use common::*;
use std::process::{Command, Output};

fn nfsrdma(server: &TestServer, args: &[&str]) -> Output {
    let port = server.addr.port().to_string();
    Command::new(env!("CARGO_BIN_EXE_nfsrdma"))
        .args([
            "--port",
            &port,
            "--mount-port",
            &port,
            "--uid",
            "0",
            "--gid",
            "0",
        ])
        .args(args)
        .output()
        .expect("run nfsrdma")
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

/// Fails with a one-line message containing `want`.
fn fails(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "succeeded; stdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(want), "stderr {err:?} lacks {want:?}");
}

fn one_line(o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn put_get_cat_stat_ls_mkdir_rm() {
    let s = TestServer::start(EXPORTS);
    let tmp = std::env::temp_dir().join(format!("nfsrdma-cli-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let local = tmp.join("local.bin");
    let data = pattern(7, 300_000);
    std::fs::write(&local, &data).unwrap();
    let local_s = local.to_str().unwrap();

    ok(&nfsrdma(&s, &["mkdir", "127.0.0.1:/export/dir"]));
    ok(&nfsrdma(&s, &["mkdir", "127.0.0.1:/export/dir/sub"]));
    let o = nfsrdma(&s, &["mkdir", "127.0.0.1:/export/dir"]);
    fails(&o, "file exists");
    one_line(&o);

    ok(&nfsrdma(
        &s,
        &["put", local_s, "127.0.0.1:/export/dir/file.bin"],
    ));
    // Into an existing directory: keeps the local name.
    ok(&nfsrdma(&s, &["put", local_s, "127.0.0.1:/export/dir/sub"]));

    let back = tmp.join("back.bin");
    ok(&nfsrdma(
        &s,
        &[
            "get",
            "127.0.0.1:/export/dir/file.bin",
            back.to_str().unwrap(),
        ],
    ));
    assert_eq!(std::fs::read(&back).unwrap(), data);

    let o = nfsrdma(&s, &["cat", "127.0.0.1:/export/dir/sub/local.bin"]);
    assert!(o.status.success());
    assert_eq!(o.stdout, data);

    let st = ok(&nfsrdma(&s, &["stat", "127.0.0.1:/export/dir/file.bin"]));
    assert!(st.contains("regular file"), "{st}");
    assert!(st.contains("Size: 300000"), "{st}");
    assert!(st.contains("(-rw-r--r--)"), "{st}");

    let ls = ok(&nfsrdma(&s, &["ls", "127.0.0.1:/export/dir"]));
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 2, "{ls}");
    assert!(lines[0].starts_with("-rw-r--r--"), "{ls}");
    assert!(lines[0].ends_with(" 300000 file.bin"), "{ls}");
    assert!(lines[1].starts_with("drwxr-xr-x"), "{ls}");
    assert!(lines[1].ends_with(" sub"), "{ls}");
    // ls of a file describes it.
    let one = ok(&nfsrdma(&s, &["ls", "127.0.0.1:/export/dir/file.bin"]));
    assert!(one.trim_end().ends_with("file.bin"), "{one}");
    // Recursive.
    let rec = ok(&nfsrdma(&s, &["ls", "-R", "127.0.0.1:/export"]));
    assert!(rec.contains("/export:\n"), "{rec}");
    assert!(rec.contains("/export/dir:\n"), "{rec}");
    assert!(rec.contains("/export/dir/sub:\n"), "{rec}");
    assert!(rec.contains(" local.bin"), "{rec}");

    let o = nfsrdma(&s, &["rm", "127.0.0.1:/export/dir"]);
    fails(&o, "is a directory");
    one_line(&o);
    ok(&nfsrdma(&s, &["rm", "127.0.0.1:/export/dir/file.bin"]));
    let o = nfsrdma(&s, &["cat", "127.0.0.1:/export/dir/file.bin"]);
    fails(&o, "no such file or directory");
    one_line(&o);
    ok(&nfsrdma(&s, &["rm", "-r", "127.0.0.1:/export/dir"]));
    assert_eq!(ok(&nfsrdma(&s, &["ls", "127.0.0.1:/export"])), "");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Small transfer sizes: put, get and cat move the file in several windows
/// of several RPCs each.
#[test]
fn large_file_in_windows() {
    let s = TestServer::start(EXPORTS);
    let tmp = std::env::temp_dir().join(format!("nfsrdma-cli-big-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let local = tmp.join("big.bin");
    let data = pattern(9, 3_000_017);
    std::fs::write(&local, &data).unwrap();
    let small = ["--rsize", "65536", "--wsize", "65536"];
    let mut args = small.to_vec();
    args.extend(["put", local.to_str().unwrap(), "127.0.0.1:/export/big.bin"]);
    ok(&nfsrdma(&s, &args));
    let back = tmp.join("back.bin");
    let mut args = small.to_vec();
    args.extend(["get", "127.0.0.1:/export/big.bin", back.to_str().unwrap()]);
    ok(&nfsrdma(&s, &args));
    assert_eq!(std::fs::read(&back).unwrap(), data);
    let mut args = small.to_vec();
    args.extend(["cat", "127.0.0.1:/export/big.bin"]);
    let o = nfsrdma(&s, &args);
    assert!(o.status.success());
    assert!(o.stdout == data);
    // put over an existing file replaces it.
    std::fs::write(&local, b"short").unwrap();
    ok(&nfsrdma(
        &s,
        &["put", local.to_str().unwrap(), "127.0.0.1:/export/big.bin"],
    ));
    let o = nfsrdma(&s, &["cat", "127.0.0.1:/export/big.bin"]);
    assert_eq!(o.stdout, b"short");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bad_input_is_a_clear_error() {
    let s = TestServer::start(EXPORTS);
    // Usage errors (clap): exit status 2.
    for args in [
        &[][..],
        &["ls"][..],
        &["ls", "no-colon"][..],
        &["ls", "srv:relative"][..],
        &["--timeo", "abc", "ls", "127.0.0.1:/export"][..],
        &["--reg", "bogus", "ls", "127.0.0.1:/export"][..],
        &["frobnicate"][..],
    ] {
        let o = nfsrdma(&s, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
    let o = nfsrdma(&s, &["ls", "no-colon"]);
    fails(&o, "SERVER:/path");

    let o = nfsrdma(&s, &["ls", "127.0.0.1:/nope/deeper"]);
    fails(&o, "/nope/deeper");
    one_line(&o);
    let o = nfsrdma(&s, &["cat", "127.0.0.1:/export/missing"]);
    fails(&o, "no such file or directory");
    one_line(&o);
    let o = nfsrdma(&s, &["get", "127.0.0.1:/export", "/tmp/x"]);
    fails(&o, "not a regular file");
    one_line(&o);
    let o = nfsrdma(&s, &["put", "/definitely/not/here", "127.0.0.1:/export/x"]);
    fails(&o, "cannot read /definitely/not/here");
    one_line(&o);
    let o = nfsrdma(&s, &["ls", "no-such-host.invalid:/export"]);
    fails(&o, "cannot resolve server");
    one_line(&o);
    // On the host (no RDMA device) and to a TCP-only address in the VM,
    // RDMA fails at connection time with an RDMA error.
    let o = nfsrdma(&s, &["--transport", "rdma", "ls", "127.0.0.1:/export"]);
    fails(&o, "RPC-over-RDMA: ");
    one_line(&o);
    let o = nfsrdma(&s, &["mkdir", "127.0.0.1:/ro/d"]);
    fails(&o, "read-only file system");
    one_line(&o);

    // Nothing listens there.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    drop(l);
    let o = Command::new(env!("CARGO_BIN_EXE_nfsrdma"))
        .args([
            "ls",
            "--port",
            &port,
            "--mount-port",
            &port,
            "127.0.0.1:/export",
        ])
        .output()
        .unwrap();
    fails(&o, "cannot connect");
    one_line(&o);
}
