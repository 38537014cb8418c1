//! The store under calls from several threads at once, as the service
//! makes them (WRITE, READ, ALLOCATE and DEALLOCATE under the store's
//! shared lock, truncation under its exclusive one), checked against the
//! same byte-array model as the single-threaded tests.

use super::tests::{data_op, land_like_rdma, mkfile, read, DataOp};
use super::*;
use proptest::prelude::*;

const THREADS: usize = 3;
/// Each thread's stretch of the file they all write: not a multiple of the
/// block size, so that neighbours share blocks.
const REGION: u64 = 100_000;

/// What one thread did: its own file's contents, and its stretch of the
/// shared file.
struct Outcome {
    own: Vec<u8>,
    region: Vec<u8>,
    held: Vec<(Payload, Vec<u8>)>,
}

fn data(fill: u8, len: usize, off: u64, landed: bool) -> (Payload, Vec<u8>) {
    let d: Vec<u8> = (0..len).map(|i| fill ^ (i / 4096) as u8).collect();
    let p = if landed {
        land_like_rdma(off, &d)
    } else {
        Payload::from(d.clone())
    };
    (p, d)
}

/// A thread's operation: data in and out, or space taken or given back
/// (NFSv4.2 ALLOCATE and DEALLOCATE).
#[derive(Debug, Clone)]
enum Op {
    Data(DataOp),
    Space {
        off: u64,
        len: u64,
        allocate: bool,
    },
    /// CLONE between the thread's file and its stretch of the shared
    /// file, one way or the other (threads doing it both ways at once
    /// must not wait on each other).
    Clone {
        to_shared: bool,
        from: u64,
        to: u64,
        len: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => data_op().prop_map(Op::Data),
        2 => (0u64..(256 << 10), 1u64..(300 << 10), any::<bool>())
            .prop_map(|(off, len, allocate)| Op::Space { off, len, allocate }),
        2 => (any::<bool>(), 0u64..4, 0u64..4, 1u64..4)
            .prop_map(|(to_shared, from, to, len)| Op::Clone {
                to_shared,
                // Mostly whole blocks, so that blocks are shared.
                from: from * 65536 + if from == 3 { 1000 } else { 0 },
                to: to * 65536,
                len: len * 65536 - if len == 3 { 500 } else { 0 },
            }),
    ]
}

/// Applies ALLOCATE or DEALLOCATE of `[off, off + len)` to `file` and to
/// its model `m`, whose bytes start at `base` in the file: a refusal for
/// want of space (a small store) must change nothing.
fn space(
    s: &Store,
    file: Ino,
    (off, len, allocate): (u64, u64, bool),
    m: &mut Vec<u8>,
    base: u64,
) -> Result<(), String> {
    let root = Cred::root();
    let fs = s.read();
    let r = if allocate {
        fs.allocate(file, &root, off, len)
    } else {
        fs.deallocate(file, &root, off, len)
    };
    match r {
        Ok(()) => {
            let (from, to) = ((off - base) as usize, (off + len - base) as usize);
            if allocate {
                if m.len() < to {
                    m.resize(to, 0);
                }
            } else {
                let to = to.min(m.len());
                if from < to {
                    m[from..to].fill(0);
                }
            }
            Ok(())
        }
        Err(NfsStat3::Nospc) => Ok(()),
        Err(e) => Err(format!("ALLOCATE ({allocate}): {e:?}")),
    }
}

/// Applies `ops` to the thread's file `f` and to its stretch of `shared`.
/// A change refused for want of space (a small store) must change nothing.
fn run(
    s: &Store,
    me: usize,
    f: Ino,
    shared: Ino,
    ops: Vec<Op>,
    small: bool,
) -> Result<Outcome, String> {
    let root = Cred::root();
    let mut own: Vec<u8> = Vec::new();
    let mut region = vec![0u8; REGION as usize];
    let mut held = Vec::new();
    let mut fill = (me as u8) * 80;
    for op in ops {
        let op = match op {
            Op::Data(d) => d,
            Op::Space { off, len, allocate } => {
                space(s, f, (off, len, allocate), &mut own, 0)?;
                // The same within this thread's stretch of the shared file
                // (the stretch's model is whole: no size to keep).
                let at = off % REGION;
                let n = len.min(REGION - at);
                let base = me as u64 * REGION;
                let mut m = region.clone();
                space(s, shared, (base + at, n, allocate), &mut m, base)?;
                m.truncate(REGION as usize);
                region = m;
                let size = s.read().getattr(f).map_err(|e| format!("{e:?}"))?.size;
                if size != own.len() as u64 {
                    return Err(format!("size {size}, model {}", own.len()));
                }
                continue;
            }
            // (A CLONE refused for want of space mid-way keeps what it
            // cloned by then: only the large store runs them.)
            Op::Clone { .. } if small => continue,
            Op::Clone {
                to_shared,
                from,
                to,
                len,
            } => {
                let base = me as u64 * REGION;
                let fs = s.read();
                if to_shared {
                    // From the file to the stretch.
                    let to = to % REGION;
                    let n = len.min(REGION - to);
                    let r = fs.clone_range(f, shared, &root, from, base + to, n);
                    match r {
                        Ok(()) => {
                            let (a, b) = (from as usize, (from + n) as usize);
                            region[to as usize..to as usize + n as usize]
                                .copy_from_slice(&own[a..b]);
                        }
                        Err(NfsStat3::Inval) if from + n > own.len() as u64 => {}
                        Err(e) => return Err(format!("CLONE to the shared file: {e:?}")),
                    }
                } else {
                    // From the stretch to the file; the stretch may reach
                    // past the shared file's end, which other threads move.
                    let from = from % REGION;
                    let n = len.min(REGION - from);
                    match fs.clone_range(shared, f, &root, base + from, to, n) {
                        Ok(()) => {
                            let end = (to + n) as usize;
                            if own.len() < end {
                                own.resize(end, 0);
                            }
                            own[to as usize..end].copy_from_slice(
                                &region[from as usize..from as usize + n as usize],
                            );
                        }
                        Err(NfsStat3::Inval) => {}
                        Err(e) => return Err(format!("CLONE from the shared file: {e:?}")),
                    }
                }
                drop(fs);
                let size = s.read().getattr(f).map_err(|e| format!("{e:?}"))?.size;
                if size != own.len() as u64 {
                    return Err(format!("size {size}, model {}", own.len()));
                }
                continue;
            }
        };
        match op {
            DataOp::Write { off, len, landed } => {
                fill = fill.wrapping_add(1).max(1);
                let (p, d) = data(fill, len, off, landed);
                match s.read().write(f, &root, off, &p) {
                    Ok(()) => {
                        let end = off as usize + len;
                        if own.len() < end {
                            own.resize(end, 0);
                        }
                        own[off as usize..end].copy_from_slice(&d);
                    }
                    Err(NfsStat3::Nospc) => {}
                    Err(e) => return Err(format!("WRITE: {e:?}")),
                }
                // The same bytes into this thread's stretch of the shared file.
                let at = off % REGION;
                let n = (len as u64).min(REGION - at) as usize;
                let (p, d) = data(fill, n, me as u64 * REGION + at, landed);
                match s.read().write(shared, &root, me as u64 * REGION + at, &p) {
                    Ok(()) => region[at as usize..at as usize + n].copy_from_slice(&d),
                    Err(NfsStat3::Nospc) => {}
                    Err(e) => return Err(format!("shared WRITE: {e:?}")),
                }
            }
            DataOp::Truncate(size) => {
                let sa = Sattr3 {
                    size: Some(size),
                    ..Sattr3::default()
                };
                match s.write().setattr(f, &root, &sa, None) {
                    Ok(()) => own.resize(size as usize, 0),
                    Err(NfsStat3::Nospc) => {}
                    Err(e) => return Err(format!("truncate: {e:?}")),
                }
            }
            DataOp::Read { off, len, hold } => {
                let (r, eof) = s
                    .read()
                    .read(f, &root, off, len)
                    .map_err(|e| format!("READ: {e:?}"))?;
                let start = (off as usize).min(own.len());
                let end = (off as usize + len as usize).min(own.len());
                let want = own[start..end].to_vec();
                if r.bytes().collect::<Vec<u8>>() != want || eof != (end == own.len()) {
                    return Err(format!("READ of {len} at {off} differs from the model"));
                }
                if hold {
                    held.push((r, want));
                }
            }
        }
        let size = s.read().getattr(f).map_err(|e| format!("{e:?}"))?.size;
        if size != own.len() as u64 {
            return Err(format!("size {size}, model {}", own.len()));
        }
    }
    Ok(Outcome { own, region, held })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Three threads each write, truncate, read, allocate and deallocate a
    /// file of their own, write, allocate and deallocate their own stretch
    /// of one shared file, and clone between the two either way, all at
    /// once: every
    /// file reads back as its model, held reads never change, the space
    /// the store counts in use is what its files hold (also when a small
    /// store refuses some writes), and removing the files gives it all
    /// back.
    #[test]
    fn files_written_from_several_threads_at_once_match_the_model(
        ops in proptest::collection::vec(proptest::collection::vec(op(), 1..30), THREADS),
        small in any::<bool>(),
    ) {
        let s = Store::new(StoreConfig {
            capacity_bytes: if small { 1 << 20 } else { 4 << 30 },
            ..StoreConfig::default()
        });
        let (root, files, shared) = {
            let mut fs = s.write();
            let root = fs.root();
            let files: Vec<Ino> = (0..THREADS)
                .map(|i| mkfile(&mut fs, root, &format!("f{i}")))
                .collect();
            let shared = mkfile(&mut fs, root, "shared");
            (root, files, shared)
        };
        let outcomes: Vec<Result<Outcome, String>> = std::thread::scope(|sc| {
            let s = &s;
            let handles: Vec<_> = ops
                .into_iter()
                .enumerate()
                .map(|(me, ops)| {
                    let f = files[me];
                    sc.spawn(move || run(s, me, f, shared, ops, small))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("no panic")).collect()
        });
        let mut fs = s.write();
        let mut used = 0;
        for (me, o) in outcomes.into_iter().enumerate() {
            let o = o.map_err(TestCaseError::fail)?;
            let (all, _) = read(&fs, files[me], 0, o.own.len() as u32 + 1);
            prop_assert!(all == o.own, "file {} differs from its model", me);
            let (got, _) = read(&fs, shared, me as u64 * REGION, REGION as u32);
            let mut want = o.region.clone();
            want.truncate(got.len());
            prop_assert!(got == want, "stretch {} of the shared file differs", me);
            prop_assert!(o.region[got.len()..].iter().all(|b| *b == 0));
            for (r, want) in &o.held {
                prop_assert_eq!(&r.bytes().collect::<Vec<u8>>(), want);
            }
            used += fs.getattr(files[me]).unwrap().used;
        }
        used += fs.getattr(shared).unwrap().used;
        let counted = fs.used_bytes.load(Ordering::Relaxed);
        prop_assert_eq!(counted, used, "space in use against the files' own counts");
        prop_assert!(counted <= fs.config.capacity_bytes, "{} bytes in use, more than the capacity", counted);
        for i in 0..THREADS {
            fs.remove(root, format!("f{i}").as_bytes(), &Cred::root()).unwrap();
        }
        fs.remove(root, b"shared", &Cred::root()).unwrap();
        let (total, free, _, _) = fs.fsstat();
        prop_assert_eq!(total, free);
    }
}
