//! Follower log recovery on arbitrary segment bytes: opening never panics,
//! keeps exactly a chain of valid records from the start, cuts the rest,
//! and is idempotent (a second open finds the same log and cuts nothing);
//! the recovered log then takes the next record and keeps it across a
//! reopen.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use walrelay_replicator::{Bookmark, Encoded, Epoch, IoBackend, Record, SegmentLog, Sequence};

const SEGMENT_BYTES: u64 = 1 << 16;

fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("walrelay-fuzz-segments-{}", std::process::id()))
}

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(SEGMENT_BYTES as usize)];
    let dir = dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut image = data.to_vec();
    image.resize(SEGMENT_BYTES as usize, 0);
    std::fs::write(dir.join(format!("{:016x}.seg", 0)), &image).expect("segment");

    let Ok((log, first)) =
        SegmentLog::open_with(&dir, SEGMENT_BYTES, Bookmark::ZERO, IoBackend::Std)
    else {
        return; // a typed error is fine; a panic is not
    };
    // What survived is a chain of valid records from the base.
    let mut prev = Bookmark::ZERO;
    let mut prev_chain = walrelay_replicator::ChainHash::GENESIS;
    let kept = log.read_after(Bookmark::ZERO).expect("read back");
    for bytes in &kept {
        let (e, used) = Encoded::decode(bytes).expect("only valid records survive");
        assert_eq!(used, bytes.len());
        assert_eq!(e.previous, prev, "a chain from the base");
        assert_eq!(
            e.prev_chain, prev_chain,
            "and of content, not only positions"
        );
        prev = e.bookmark;
        prev_chain = e.chain;
    }
    assert_eq!(log.last(), prev);
    assert_eq!(first.records, kept.len());
    drop(log);

    // Idempotent: nothing more to cut.
    let (mut log, again) =
        SegmentLog::open_with(&dir, SEGMENT_BYTES, Bookmark::ZERO, IoBackend::Std).expect("reopen");
    assert_eq!(again.cut_bytes, 0);
    assert_eq!(again.records, kept.len());
    assert_eq!(log.last(), prev);

    // And it goes on: the next record lands and survives a reopen.
    let next = Bookmark::new(
        Epoch(prev.epoch.0.max(1)),
        Sequence(if prev.epoch.0 == 0 {
            1
        } else {
            prev.sequence.0.saturating_add(1)
        }),
    );
    if next > prev {
        let record = Record {
            bookmark: next,
            previous: prev,
            prev_chain: log
                .last_chain()
                .expect("a log from the start knows its chain"),
            commit_us: 0,
            page_size: 512,
            db_pages: 1,
            pages: vec![(1, Bytes::from(vec![0x5a; 512]))],
        }
        .encode()
        .expect("encode");
        if log.append(&record).is_ok() {
            log.sync().expect("sync");
            drop(log);
            let (log, _) =
                SegmentLog::open_with(&dir, SEGMENT_BYTES, Bookmark::ZERO, IoBackend::Std)
                    .expect("reopen after append");
            assert_eq!(log.last(), next);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
});
