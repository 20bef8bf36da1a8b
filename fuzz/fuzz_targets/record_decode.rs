//! Log record decoding never panics and never allocates for sizes it has
//! not checked; whatever decodes re-encodes to the same bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walrelay_replicator::Record;

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    if let Ok((record, used)) = Record::decode(&buf) {
        let again = record.encode().expect("a decoded record is valid");
        assert_eq!(&again[..], &data[..used]);
    }
});
