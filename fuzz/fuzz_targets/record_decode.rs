//! Log record decoding never panics and never allocates for sizes it has
//! not checked, in either page form (plain or compressed); whatever
//! decodes re-encodes to the same pages; and the in-place check a follower
//! uses (`Encoded::decode`) accepts everything the full decode accepts, and
//! more only where a compressed frame's headers are sound but its content
//! fails to decompress (the full decode names that case).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walrelay_replicator::record::FLAG_COMPRESSED;
use walrelay_replicator::{Encoded, PageCompression, Record, RecordError};

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let full = Record::decode(&buf);
    let light = Encoded::decode(&buf);
    match (&full, &light) {
        (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
        (Err(RecordError::Decompress { .. }), Ok(_)) => return,
        _ => panic!("{full:?} vs {light:?}"),
    }
    if let (Ok((record, used)), Ok((encoded, used2))) = (full, light) {
        assert_eq!(used, used2);
        assert_eq!(
            (record.bookmark, record.previous),
            (encoded.bookmark, encoded.previous)
        );
        assert_eq!(encoded.record().expect("pages of a checked record"), record);
        let flags = u16::from_be_bytes([data[6], data[7]]);
        if flags & FLAG_COMPRESSED == 0 {
            let again = record
                .encode_flagged(encoded.continued())
                .expect("a decoded record is valid");
            assert_eq!(&again[..], &data[..used]);
        } else {
            // Another encoder's frame may differ from ours; the pages not.
            let again = record
                .encode_with(encoded.continued(), PageCompression::Zstd)
                .expect("a decoded record is valid");
            assert_eq!(Record::decode(&again).expect("ours decodes").0, record);
        }
    }
});
