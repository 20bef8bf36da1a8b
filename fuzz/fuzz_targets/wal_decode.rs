//! WAL header and frame decoding never panics on arbitrary bytes, and a
//! frame that validates re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_vfs::wal_format::{FRAME_HEADER_BYTES, FrameHeader, WAL_HEADER_BYTES, WalHeader};
use walrelay_vfs::{FrameNo, PageNo};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = WalHeader::decode(data) else {
        return;
    };
    let rest = &data[WAL_HEADER_BYTES.min(data.len())..];
    let ps = h.page_size as usize;
    if rest.len() < FRAME_HEADER_BYTES + ps {
        return;
    }
    let mut fh = [0u8; FRAME_HEADER_BYTES];
    fh.copy_from_slice(&rest[..FRAME_HEADER_BYTES]);
    let frame = FrameHeader::decode(&fh);
    let page = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + ps];
    if let Ok(ck) = frame.validate(&h, FrameNo::new(1), h.checksum, &fh, page) {
        let (again, ck2) = FrameHeader::encode(
            &h,
            PageNo::new(frame.page_no),
            frame.commit_db_pages,
            h.checksum,
            page,
        );
        assert_eq!(again, fh);
        assert_eq!(ck, ck2);
    }
});
