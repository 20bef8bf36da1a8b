//! Log record decoding never panics and never allocates for sizes it has
//! not checked, in either page form (plain or compressed); whatever
//! decodes re-encodes to the same record (to the same bytes, when it is
//! plain and its chain is right); and the in-place check a follower
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
        // A decoder checks the CRC, not the chain (an audit's job): bytes
        // with a CRC made over a wrong chain decode, and re-encode with
        // the right one.
        if flags & FLAG_COMPRESSED == 0 && encoded.chain_is_valid() {
            let again = record
                .encode_flagged(encoded.continued())
                .expect("a decoded record is valid");
            assert_eq!(&again[..], &data[..used]);
        } else {
            // Another encoder's frame, or a wrong chain, may differ from
            // ours; the record not.
            let again = record
                .encode_with(
                    encoded.continued(),
                    if flags & FLAG_COMPRESSED == 0 {
                        PageCompression::Plain
                    } else {
                        PageCompression::Zstd
                    },
                )
                .expect("a decoded record is valid");
            assert_eq!(Record::decode(&again).expect("ours decodes").0, record);
        }
    }
});
