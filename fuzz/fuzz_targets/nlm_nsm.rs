//! NLM version 4 and NSM version 1 arguments and results; the first byte
//! picks the type.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::{nlm, nsm, Xdr};

fn check<T: Xdr + PartialEq + std::fmt::Debug>(b: Bytes) {
    if let Ok(v) = T::from_bytes(b) {
        let enc = v.to_bytes();
        assert_eq!(enc.len(), v.encoded_len());
        assert_eq!(T::from_bytes(enc).unwrap(), v);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let b = Bytes::copy_from_slice(rest);
    match sel % 17 {
        // NLM arguments.
        0 => check::<nlm::Nlm4TestArgs>(b),
        1 => check::<nlm::Nlm4LockArgs>(b),
        2 => check::<nlm::Nlm4CancArgs>(b),
        3 => check::<nlm::Nlm4UnlockArgs>(b),
        4 => check::<nlm::Nlm4ShareArgs>(b),
        5 => check::<nlm::Nlm4Notify>(b),
        // NLM results (and the _RES calls' arguments).
        6 => check::<nlm::Nlm4TestRes>(b),
        7 => check::<nlm::Nlm4Res>(b),
        8 => check::<nlm::Nlm4ShareRes>(b),
        // NSM arguments.
        9 => check::<nsm::SmName>(b),
        10 => check::<nsm::Mon>(b),
        11 => check::<nsm::MonId>(b),
        12 => check::<nsm::MyId>(b),
        13 => check::<nsm::StatChge>(b),
        // NSM results and the monitor's callback.
        14 => check::<nsm::SmStatRes>(b),
        15 => check::<nsm::SmStat>(b),
        _ => check::<nsm::SmStatus>(b),
    }
});
