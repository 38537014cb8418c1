//! Exports file parser: any UTF-8 input must parse or fail without panicking,
//! and whatever parses must print back to text that parses to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nfsrdma_server::exports::Exports;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(exports) = Exports::parse(text) {
        let printed = exports.to_string();
        match Exports::parse(&printed) {
            Ok(again) => assert_eq!(again, exports, "round trip changed {printed:?}"),
            Err(e) => panic!("printed form {printed:?} does not parse: {e}"),
        }
    }
});
