//! MOUNT v3 and portmap messages; the first byte picks the type.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_xdr::{mount, portmap, Xdr};

fn check<T: Xdr + PartialEq + std::fmt::Debug>(b: Bytes) {
    if let Ok(v) = T::from_bytes(b) {
        assert_eq!(T::from_bytes(v.to_bytes()).unwrap(), v);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let b = Bytes::copy_from_slice(rest);
    match sel % 6 {
        0 => check::<mount::MountRes3>(b),
        1 => check::<mount::Exports>(b),
        2 => check::<mount::MountList>(b),
        3 => check::<mount::DirPath>(b),
        4 => check::<portmap::Mapping>(b),
        _ => check::<portmap::PmapList>(b),
    }
});
