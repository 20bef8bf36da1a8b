//! Log record decoding never panics and never allocates for sizes it has
//! not checked; whatever decodes re-encodes to the same bytes; and the
//! in-place check a follower uses (`Encoded::decode`) accepts exactly what
//! the full decode accepts.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walrelay_replicator::{Encoded, Record};

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let full = Record::decode(&buf);
    let light = Encoded::decode(&buf);
    assert_eq!(full.is_ok(), light.is_ok(), "{full:?} vs {light:?}");
    if let (Ok((record, used)), Ok((encoded, used2))) = (full, light) {
        assert_eq!(used, used2);
        assert_eq!(
            (record.bookmark, record.previous),
            (encoded.bookmark, encoded.previous)
        );
        assert_eq!(encoded.record().expect("pages of a checked record"), record);
        let again = record.encode().expect("a decoded record is valid");
        assert_eq!(&again[..], &data[..used]);
    }
});
