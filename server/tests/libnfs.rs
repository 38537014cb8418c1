//! End to end over TCP with an NFS client nobody here wrote: libnfs (the
//! Debian libnfs-utils tools, plus tests/libnfs/nfsops.c, a driver over the
//! libnfs library for the operations those tools lack), against the real
//! nfsrdmad binary.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

struct Daemon {
    child: Child,
    port: u16,
}

impl Daemon {
    fn start() -> Daemon {
        Self::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Daemon {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
            .args([
                "--export",
                "/export",
                "--tcp",
                "127.0.0.1:0",
                "--no-rpcbind",
                "--no-rdma",
            ])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nfsrdmad");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Daemon { child, port }
    }

    fn url(&self, path: &str) -> String {
        format!(
            "nfs://127.0.0.1/export{path}?nfsport={p}&mountport={p}&version=3",
            p = self.port
        )
    }

    /// SIGTERM, then the exit status and what it printed on stderr.
    fn stop(mut self) -> (bool, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{name} is missing: run scripts/setup (Debian package libnfs-utils)"
    );
    p
}

fn nfsops() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/libnfs/nfsops.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nfsops");
    let st = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg("-lnfs")
        .status()
        .expect("cc (run scripts/setup)");
    assert!(
        st.success(),
        "building nfsops needs libnfs-dev: run scripts/setup"
    );
    out
}

fn run(cmd: &Path, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(cmd).args(args).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn ok(cmd: &Path, args: &[&str]) -> String {
    let (s, out, err) = run(cmd, args);
    assert!(s, "{} {args:?} failed: {out}{err}", cmd.display());
    out
}

#[test]
fn libnfs_clients_against_nfsrdmad() {
    let d = Daemon::start();
    let cp = tool("nfs-cp");
    let ls = tool("nfs-ls");
    let cat = tool("nfs-cat");
    let ops = nfsops();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libnfs-e2e");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();

    // 10 MiB of pseudo-random data up and down, compared byte for byte.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..10 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let up = tmp.join("up");
    std::fs::File::create(&up)
        .unwrap()
        .write_all(&data)
        .unwrap();
    ok(&cp, &[up.to_str().unwrap(), &d.url("/big")]);
    let down = tmp.join("down");
    ok(&cp, &[&d.url("/big"), down.to_str().unwrap()]);
    assert!(std::fs::read(&down).unwrap() == data, "download differs");
    let st = ok(&ops, &[&d.url(""), "stat", "/big"]);
    assert!(st.starts_with(&format!("size={} ", 10 << 20)), "{st}");

    // Directories, links, renames, removal.
    let u = d.url("");
    ok(&ops, &[&u, "mkdir", "/dir"]);
    ok(&ops, &[&u, "mkdir", "/dir/sub"]);
    let small = tmp.join("small");
    std::fs::write(&small, b"hello over NFS\n").unwrap();
    ok(
        &cp,
        &[small.to_str().unwrap(), &d.url("/dir/sub/hello.txt")],
    );
    assert_eq!(
        ok(&cat, &[&d.url("/dir/sub/hello.txt")]),
        "hello over NFS\n"
    );
    ok(&ops, &[&u, "symlink", "sub/hello.txt", "/dir/link"]);
    assert_eq!(
        ok(&ops, &[&u, "readlink", "/dir/link"]).trim(),
        "sub/hello.txt"
    );
    ok(&ops, &[&u, "ln", "/dir/sub/hello.txt", "/dir/hard"]);
    assert!(ok(&ops, &[&u, "stat", "/dir/hard"]).contains("nlink=2"));
    ok(&ops, &[&u, "mv", "/dir/hard", "/dir/renamed"]);
    ok(&ops, &[&u, "chmod", "/dir/renamed", "600"]);
    assert!(ok(&ops, &[&u, "stat", "/dir/renamed"]).contains("mode=600"));
    ok(&ops, &[&u, "truncate", "/dir/renamed", "5"]);
    assert_eq!(ok(&cat, &[&d.url("/dir/renamed")]), "hello");
    ok(&ops, &[&u, "mkfifo", "/dir/fifo"]);
    assert!(ok(&ops, &[&u, "stat", "/dir/fifo"]).contains("type=fifo"));

    // A recursive listing shows the whole tree.
    let listing = ok(&ls, &["-R", &u]);
    for name in [
        "big",
        "dir",
        "dir/sub",
        "dir/sub/hello.txt",
        "dir/link",
        "dir/renamed",
        "dir/fifo",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "{name} missing from:\n{listing}"
        );
    }

    // Errors come back as errors.
    let (s, _, err) = run(&ops, &[&u, "rmdir", "/dir"]);
    assert!(!s && err.contains("NOTEMPTY"), "{err}");
    let (s, _, err) = run(&ops, &[&u, "stat", "/nope"]);
    assert!(!s && err.contains("NOENT"), "{err}");
    let long = format!("/{}", "n".repeat(256));
    let (s, _, err) = run(&ops, &[&u, "mkdir", &long]);
    assert!(!s && err.contains("NAMETOOLONG"), "{err}");

    // Clean up through the client.
    for p in [
        "/dir/fifo",
        "/dir/renamed",
        "/dir/link",
        "/dir/sub/hello.txt",
        "/big",
    ] {
        ok(&ops, &[&u, "rm", p]);
    }
    ok(&ops, &[&u, "rmdir", "/dir/sub"]);
    ok(&ops, &[&u, "rmdir", "/dir"]);
    let listing = ok(&ls, &[&u]);
    assert!(listing.trim().is_empty(), "{listing}");

    // SIGTERM: clean exit with the per-procedure report.
    let (exited_ok, stderr) = d.stop();
    assert!(exited_ok, "{stderr}");
    assert!(
        stderr.contains("WRITE") && stderr.contains("READ"),
        "{stderr}"
    );
}

#[test]
fn planned_restart_keeps_data_and_a_killed_daemon_loses_it() {
    let cp = tool("nfs-cp");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("state-e2e");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let state = tmp.join("nfsrdmad.state");
    let st = state.to_str().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let up = tmp.join("up");
    std::fs::write(&up, &data).unwrap();

    // Write, stop with SIGTERM: the state is saved.
    let d = Daemon::start_with(&["--state", st]);
    ok(&cp, &[up.to_str().unwrap(), &d.url("/kept")]);
    let (clean, err) = d.stop();
    assert!(clean, "{err}");
    assert!(state.exists(), "no state file written");

    // Start again from the state: the file is there, byte for byte.
    let d = Daemon::start_with(&["--state", st]);
    let down = tmp.join("down");
    ok(&cp, &[&d.url("/kept"), down.to_str().unwrap()]);
    assert!(
        std::fs::read(&down).unwrap() == data,
        "data changed across a planned restart"
    );
    // Write more, then kill the daemon: what came after the last planned
    // stop is lost (the store lives in memory), the rest is not.
    ok(&cp, &[up.to_str().unwrap(), &d.url("/lost")]);
    let mut d = d;
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    drop(d);
    let d = Daemon::start_with(&["--state", st]);
    let down2 = tmp.join("down2");
    ok(&cp, &[&d.url("/kept"), down2.to_str().unwrap()]);
    assert!(std::fs::read(&down2).unwrap() == data);
    let o = Command::new(&cp)
        .args([&d.url("/lost"), tmp.join("x").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "a file written after the last planned stop survived a kill"
    );
    let (clean, err) = d.stop();
    assert!(clean, "{err}");

    // A damaged state file is refused with a clear error, not ignored.
    std::fs::write(&state, b"garbage").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
        .args([
            "--export",
            "/export",
            "--tcp",
            "127.0.0.1:0",
            "--no-rpcbind",
            "--no-rdma",
            "--state",
            st,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an nfsrdmad state file"));
}

#[test]
fn config_file_and_sigusr1_report() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("config-e2e");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let cfg = tmp.join("nfsrdmad.toml");
    std::fs::write(
        &cfg,
        "export = [\"/from-config\"]\ntcp = \"127.0.0.1:0\"\nrpcbind = false\ncapacity = \"64M\"\nworkers = 8\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
        .args(["--config", cfg.to_str().unwrap(), "--no-rdma"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().rsplit(':').next().unwrap().to_string();
    let url = format!("nfs://127.0.0.1/from-config?nfsport={port}&mountport={port}&version=3");
    // The export named in the file is served.
    let small = tmp.join("small");
    std::fs::write(&small, b"configured\n").unwrap();
    ok(
        &tool("nfs-cp"),
        &[
            small.to_str().unwrap(),
            &format!("nfs://127.0.0.1/from-config/f?nfsport={port}&mountport={port}&version=3"),
        ],
    );
    let ls = ok(&tool("nfs-ls"), &[&url]);
    assert!(ls.contains(" f"), "{ls}");
    // SIGUSR1 prints the counters without stopping the daemon.
    let _ = Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status();
    std::thread::sleep(std::time::Duration::from_millis(300));
    ok(&tool("nfs-ls"), &[&url]);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Two reports: one on SIGUSR1, one at exit.
    assert_eq!(err.matches("duplicate request cache: ").count(), 2, "{err}");
    // An unknown key in the config file is an error naming it.
    std::fs::write(&cfg, "bogus = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}
