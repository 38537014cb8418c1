//! Calls on different files run at once: a WRITE held up inside one file
//! (its block memory slow to come) holds up neither READs and WRITEs of
//! other files nor lookups, while a READ of the same file sent meanwhile
//! cannot finish before it and sees it whole. Shown by the order in which
//! things finish, not by time.

use super::tests::T;
use super::*;
use crate::exports::Exports;
use crate::store::blocks::{BlockMemory, BlockSource, HeapSource};
use nfsrdma_xdr::nfs3::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

/// How long a call that should not wait may take before the test gives up
/// on it: a bound on a hang, far above what the calls take.
const HANG: Duration = Duration::from_secs(30);

/// Block memory from the heap, except that once armed, the next request
/// says so and then waits until it is let go.
struct Gate {
    armed: AtomicBool,
    entered: Mutex<Sender<()>>,
    release: Mutex<Receiver<()>>,
}

impl BlockSource for Arc<Gate> {
    fn alloc(&self, size: usize) -> Option<Box<dyn BlockMemory>> {
        if self.armed.swap(false, Ordering::SeqCst) {
            let _ = self.entered.lock().unwrap().send(());
            let _ = self.release.lock().unwrap().recv();
        }
        HeapSource.alloc(size)
    }
}

fn write(t: &T, f: &NfsFh3, offset: u64, data: Vec<u8>) -> Nfs3Res {
    t.nfs(Nfs3Args::Write(Write3Args {
        file: f.clone(),
        offset,
        count: data.len() as u32,
        stable: StableHow::FileSync,
        data: Data::new(Bytes::from(data)),
    }))
}

fn read(t: &T, f: &NfsFh3, count: u32) -> Vec<u8> {
    match t.nfs(Nfs3Args::Read(Read3Args {
        file: f.clone(),
        offset: 0,
        count,
    })) {
        Nfs3Res::Read(NfsResult::Ok(r)) => r.data.bytes().collect(),
        other => panic!("READ: {other:?}"),
    }
}

fn ok(r: &Nfs3Res) {
    assert_eq!(r.status(), NfsStat3::Ok, "{r:?}");
}

#[test]
fn a_write_held_up_in_one_file_holds_up_calls_on_that_file_only() {
    let (entered_tx, entered) = channel();
    let (release, release_rx) = channel();
    let gate = Arc::new(Gate {
        armed: AtomicBool::new(false),
        entered: Mutex::new(entered_tx),
        release: Mutex::new(release_rx),
    });
    let rules = Exports::parse("/export *(rw,no_root_squash,insecure)").unwrap();
    let g = gate.clone();
    let exports = Service::exports_from_rules_with(&rules, &StoreConfig::default(), &move || {
        Box::new(g.clone())
    });
    let t = T::on(Arc::new(Service::new(exports, ServiceConfig::default())));
    let root = t.mount("/export");
    let x = t.create(&root, "x");
    let y = t.create(&root, "y");
    ok(&write(&t, &y, 0, vec![0x11; 4096]));

    // A WRITE to x that needs a block: it stops in the block source, with
    // the file locked.
    gate.armed.store(true, Ordering::SeqCst);
    let a = {
        let t = t.another(1_000_000);
        let x = x.clone();
        std::thread::spawn(move || write(&t, &x, 0, vec![0x22; 4096]))
    };
    entered
        .recv_timeout(HANG)
        .expect("the WRITE to x never asked for block memory");

    // A READ of x now must wait for that WRITE, and then see all of it.
    let c = {
        let t = t.another(2_000_000);
        let x = x.clone();
        std::thread::spawn(move || read(&t, &x, 8192))
    };

    // Calls on y, and lookups in the directory, go through meanwhile.
    let (done_tx, done) = channel();
    let b = {
        let t = t.another(3_000_000);
        let (root, y) = (root.clone(), y.clone());
        std::thread::spawn(move || {
            assert_eq!(read(&t, &y, 8192), vec![0x11; 4096]);
            ok(&write(&t, &y, 0, vec![0x33; 100]));
            let mut want = vec![0x11; 4096];
            want[..100].fill(0x33);
            assert_eq!(read(&t, &y, 8192), want);
            match t.nfs(Nfs3Args::Lookup(Lookup3Args {
                what: DirOpArgs3 {
                    dir: root,
                    name: Filename3::new(b"y".to_vec()),
                },
            })) {
                Nfs3Res::Lookup(NfsResult::Ok(l)) => assert_eq!(l.object, y),
                other => panic!("LOOKUP: {other:?}"),
            }
            done_tx.send(()).unwrap();
        })
    };
    let finished = done.recv_timeout(HANG);
    assert!(
        !a.is_finished() && !c.is_finished(),
        "the WRITE to x, held in the block source, finished (or the READ of x did)"
    );
    finished.expect("calls on y waited for a WRITE to x");
    b.join().unwrap();

    release.send(()).unwrap();
    ok(&a.join().unwrap());
    assert_eq!(
        c.join().unwrap(),
        vec![0x22; 4096],
        "a READ of x that came during the WRITE saw it partly or not at all"
    );
}
