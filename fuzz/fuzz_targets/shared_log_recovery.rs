//! Shared log recovery on arbitrary segment bytes: decoding an entry never
//! panics and a decoded entry re-encodes identically; opening never
//! panics; every database's records read back decode and chain from its
//! start; a second open cuts nothing and finds the same databases; the
//! recovered log takes a database's next record and keeps it across a
//! reopen.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use walrelay_replicator::shared_log::{SharedLog, SharedLogConfig, format};
use walrelay_replicator::{
    Bookmark, ChainHash, DatabaseId, Encoded, Epoch, IoBackend, Record, Sequence,
};

const SEGMENT_BYTES: u64 = 1 << 16;

fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("walrelay-fuzz-shared-log-{}", std::process::id()))
}

fn config() -> SharedLogConfig {
    SharedLogConfig {
        segment_bytes: SEGMENT_BYTES,
        max_segments: 4,
        backend: IoBackend::Std,
    }
}

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(SEGMENT_BYTES as usize)];
    // The entry at the start (unsalted), or the header and the entry
    // after it (sealed with its salt).
    let mut first = vec![(format::Seal::Legacy, 0)];
    if let format::Start::Salted(h) = format::segment_start(data, 0) {
        first.push((h.seal(), 0));
        first.push((h.seal(), format::SEGMENT_HEADER_BYTES));
    }
    for (seal, at) in first {
        if let Ok(f) = format::decode(&data[at..], seal) {
            let mut again = Vec::new();
            format::encode(&mut again, f.kind, f.database, f.lsn, f.payload, seal);
            assert_eq!(
                &again[..],
                &data[at..at + f.len],
                "decode then encode is the identity"
            );
        }
    }
    let dir = dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut image = data.to_vec();
    image.resize(SEGMENT_BYTES as usize, 0);
    std::fs::write(dir.join(format!("{:016x}.seg", 0)), &image).expect("segment");

    let Ok((log, _)) = SharedLog::open(&dir, config()) else {
        return; // a typed error is fine; a panic is not
    };
    let held = SharedLog::inspect(&dir).expect("inspect");
    for i in &held {
        let db = log.database(i.database);
        let mut prev = db.start();
        let mut prev_chain = db.chain_at(prev);
        for bytes in db.read_after(prev).expect("read back") {
            let (e, used) = Encoded::decode(&bytes).expect("only valid records survive");
            assert_eq!(used, bytes.len());
            assert_eq!(e.previous, prev, "a chain from the start");
            if let Some(c) = prev_chain {
                assert_eq!(e.prev_chain, c, "of content, not only positions");
            }
            prev = e.bookmark;
            prev_chain = Some(e.chain);
        }
        assert_eq!(db.last(), prev);
        assert_eq!(db.len(), i.records);
    }
    drop(log);

    // Idempotent: nothing more to cut, the same databases.
    let (log, again) = SharedLog::open(&dir, config()).expect("reopen");
    assert_eq!(again.cut_bytes, 0);
    assert_eq!(SharedLog::inspect(&dir).expect("inspect"), held);

    // And it goes on: a database's next record lands and survives a reopen.
    let id = held.first().map_or(DatabaseId(1), |i| i.database);
    let db = log.database(id);
    let prev = db.last();
    let next = Bookmark::new(
        Epoch(prev.epoch.0.max(1)),
        Sequence(prev.sequence.0.saturating_add(1)),
    );
    if next > prev {
        let record = Record {
            bookmark: next,
            previous: prev,
            prev_chain: db.last_chain().unwrap_or(ChainHash::GENESIS),
            commit_us: 0,
            page_size: 512,
            db_pages: 1,
            pages: vec![(1, Bytes::from(vec![0x5a; 512]))],
        }
        .to_encoded()
        .expect("encode");
        if db.append_encoded(&record).is_ok() {
            log.sync().expect("sync");
            drop(db);
            drop(log);
            let (log, _) = SharedLog::open(&dir, config()).expect("reopen after append");
            assert_eq!(log.database(id).last(), next);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
});
