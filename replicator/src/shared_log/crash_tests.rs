//! Crashes of the shared log: a torn last entry at every byte, an
//! interrupted compaction, a poisoned sync. Nothing acked is lost.

use super::tests::{Expect, append, check, config, copy_dir};
use super::*;

/// The newest segment file in `dir`.
pub(super) fn newest_segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

/// The index of the segment file at `path`, from its name.
pub(super) fn index_of(path: &Path) -> u64 {
    let name = path.file_stem().and_then(|n| n.to_str()).expect("name");
    u64::from_str_radix(name, 16).expect("a segment's name")
}

/// The newest segment file and the offset and length of its last entry.
fn last_entry(dir: &Path) -> (PathBuf, usize, usize) {
    let path = newest_segment(dir);
    let (off, len) = *entries(&path).last().expect("an entry");
    (path, off, len)
}

/// The offset and length of each entry of the segment at `path` (its
/// header not counted).
pub(super) fn entries(path: &Path) -> Vec<(usize, usize)> {
    let data = std::fs::read(path).expect("read");
    let (seal, mut at) = match format::segment_start(&data, index_of(path)) {
        format::Start::Salted(h) => (h.seal(), format::SEGMENT_HEADER_BYTES),
        format::Start::Legacy => (Seal::Legacy, 0),
        other => panic!("no entries of this life: {other:?}"),
    };
    let mut out = Vec::new();
    while let Ok(f) = format::decode(&data[at..], seal) {
        out.push((at, f.len));
        at += f.len;
    }
    out
}

fn acked_log(dir: &Path) -> Vec<Expect> {
    let (log, _) = SharedLog::open(dir, config(64 << 10, 64)).expect("open");
    let mut expect = vec![Expect::default(); 3];
    for round in 0..5u8 {
        for (i, e) in expect.iter_mut().enumerate() {
            append(&log, DatabaseId(i as u64), e, round, 300);
        }
        log.sync().expect("sync");
    }
    expect
}

#[test]
fn a_torn_last_entry_is_cut_at_every_byte_and_nothing_acked_is_lost() {
    let dir = tempfile::tempdir().expect("dir");
    let live = dir.path().join("log");
    let acked = acked_log(&live);
    {
        // One more record, its write torn by the crash below.
        let (log, _) = SharedLog::open(&live, config(64 << 10, 64)).expect("open");
        let mut e = acked[1].clone();
        append(&log, DatabaseId(1), &mut e, 99, 300);
        log.sync().expect("sync");
    }
    let (path, off, len) = last_entry(&live);
    let image = std::fs::read(&path).expect("image");
    let name = path.file_name().expect("name").to_owned();
    for torn_with in [0u8, 0xA5] {
        for k in 0..len {
            let mut torn = image.clone();
            torn[off + k..off + len].fill(torn_with);
            if torn == image {
                // The entry's last bytes already were `torn_with` (its CRC
                // is salted, so by chance): nothing is torn, and the entry
                // rightly stays.
                continue;
            }
            let case = dir.path().join(format!("case-{torn_with}-{k}"));
            copy_dir(&live, &case);
            std::fs::write(case.join(&name), &torn).expect("write");
            {
                let (log, rec) = SharedLog::open(&case, config(64 << 10, 64)).expect("recovers");
                assert_eq!(rec.unchained, 0, "torn at {k}");
                for (i, e) in acked.iter().enumerate() {
                    check(&log, DatabaseId(i as u64), e);
                }
                if k % 16 == 0 {
                    // The recovered log takes the next record and keeps it.
                    let mut e = acked[1].clone();
                    append(&log, DatabaseId(1), &mut e, 7, 300);
                    log.sync().expect("sync");
                    drop(log);
                    let (log, rec) = SharedLog::open(&case, config(64 << 10, 64)).expect("reopen");
                    assert_eq!(rec.cut_bytes, 0, "a second open cuts nothing (torn at {k})");
                    check(&log, DatabaseId(1), &e);
                }
            }
            std::fs::remove_dir_all(&case).expect("clean");
        }
    }
}

#[test]
fn an_interrupted_compaction_leaves_copies_counted_once() {
    let dir = tempfile::tempdir().expect("dir");
    let live = dir.path().join("log");
    let mut lag = Expect::default();
    let mut busy = vec![Expect::default(); 4];
    let saved = dir.path().join("saved");
    {
        let (log, _) = SharedLog::open(&live, config(16 << 10, 2)).expect("open");
        append(&log, DatabaseId(100), &mut lag, 1, 300);
        for round in 0..20u8 {
            for (i, e) in busy.iter_mut().enumerate() {
                append(&log, DatabaseId(i as u64), e, round, 500);
            }
        }
        log.sync().expect("sync");
        assert!(log.segments() > 3);
        copy_dir(&live, &saved);
        for (i, e) in busy.iter_mut().enumerate() {
            let upto = e.end().0;
            log.database(DatabaseId(i as u64))
                .release_through(upto)
                .expect("release");
            e.records.clear();
            e.start = upto;
        }
        assert!(log.stats().compactions > 0, "{:?}", log.stats());
    }
    // The crash: the compacted segments' deletions never reached the disk.
    for e in std::fs::read_dir(&saved).expect("list").flatten() {
        let to = live.join(e.file_name());
        if !to.exists() {
            std::fs::copy(e.path(), to).expect("restore");
        }
    }
    let (log, rec) = SharedLog::open(&live, config(16 << 10, 2)).expect("reopen");
    assert!(rec.duplicates > 0, "{rec:?}");
    assert_eq!(rec.unchained, 0);
    check(&log, DatabaseId(100), &lag);
    for (i, e) in busy.iter().enumerate() {
        check(&log, DatabaseId(i as u64), e);
    }
    // And the next maintenance deletes what the crash left.
    log.maintain().expect("maintain");
    assert!(log.segments() <= 2, "{} segments", log.segments());
    check(&log, DatabaseId(100), &lag);
}

#[test]
fn after_a_failed_sync_the_reopen_cuts_back_to_what_was_known_durable() {
    let dir = tempfile::tempdir().expect("dir");
    let live = dir.path().join("log");
    let acked = acked_log(&live);
    {
        let (log, _) = SharedLog::open(&live, config(64 << 10, 64)).expect("open");
        let mut e = acked[2].clone();
        append(&log, DatabaseId(2), &mut e, 99, 300);
        log.sync().expect("sync");
    }
    // As a failed sync leaves it: the marker names the end before the
    // last entry, whose bytes the page cache may hold without the disk.
    let (path, off, _) = last_entry(&live);
    poison::store(&live, (index_of(&path), off as u64)).expect("poison");
    let (log, rec) = SharedLog::open(&live, config(64 << 10, 64)).expect("reopen");
    assert!(rec.cut_bytes > 0);
    for (i, e) in acked.iter().enumerate() {
        check(&log, DatabaseId(i as u64), e);
    }
    assert!(!live.join("poisoned").exists(), "the marker is cleared");
}

#[test]
fn damage_in_an_older_segment_is_skipped_not_erased_and_later_segments_still_count() {
    let dir = tempfile::tempdir().expect("dir");
    let live = dir.path().join("log");
    let (mut a, mut b) = (Expect::default(), Expect::default());
    {
        let (log, _) = SharedLog::open(&live, config(16 << 10, 64)).expect("open");
        // Database 1 only in the first segment, database 2 all along.
        for i in 0..10u8 {
            append(&log, DatabaseId(1), &mut a, i, 300);
        }
        for i in 0..60u8 {
            append(&log, DatabaseId(2), &mut b, i, 300);
        }
        log.sync().expect("sync");
        assert!(log.segments() >= 3);
    }
    let first = live.join(format!("{:016x}.seg", 0));
    let mut bytes = std::fs::read(&first).expect("read");
    // Inside database 1's sixth record.
    let at = entries(&first)[5].0;
    bytes[at + 100] ^= 0xff;
    std::fs::write(&first, &bytes).expect("damage");
    let (log, rec) = SharedLog::open(&live, config(16 << 10, 64)).expect("reopen");
    assert!(rec.damaged_bytes > 0, "{rec:?}");
    assert_eq!(rec.cut_bytes, 0, "nothing zeroed in an older segment");
    assert_eq!(
        std::fs::read(&first).expect("read"),
        bytes,
        "left as it was"
    );
    // Database 1 keeps what precedes the damage; database 2's records in
    // the first segment after it are gone from its index, the rest do
    // not chain and are dropped, to be fetched again.
    a.records.truncate(5);
    check(&log, DatabaseId(1), &a);
    assert!(rec.unchained > 0);
    assert!(log.database(DatabaseId(2)).last() < b.end().0);
}
