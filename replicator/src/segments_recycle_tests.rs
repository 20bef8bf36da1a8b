//! The segment log's reuse of released segments ([`crate::recycle`]): a
//! roll takes one instead of writing zeros, and recovery reads what a
//! reused segment held before as stale, never as the log's, a torn tail or
//! damage, across the crash points of a roll and a release.
use super::tests::{SEG, b, rec};
use super::*;
use crate::recycle;

fn open(dir: &Path) -> (SegmentLog, Recovery) {
    SegmentLog::open_with(dir, SEG, b(0), IoBackend::Std).expect("open")
}

fn append(log: &mut SegmentLog, from: u64, to: u64) {
    for s in from..=to {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
}

fn pool(dir: &Path) -> usize {
    recycle::list(dir).expect("pool").len()
}

/// A log of records 1..=12 (three to a segment, segments 0..=3) with
/// segments 0 and 1 released into the pool, then records 13..=`to`.
fn reusing(dir: &Path, to: u64) -> SegmentLog {
    let (mut log, _) = open(dir);
    append(&mut log, 1, 12);
    let released = log.release_through(b(6)).expect("release");
    assert_eq!(released.segments, 2);
    assert_eq!(pool(dir), 2, "both went to the pool");
    append(&mut log, 13, to);
    log
}

fn all_records(log: &SegmentLog, to: u64) {
    assert_eq!(log.last(), b(to));
    let plan = log.plan_batch(b(6), b(to), usize::MAX).expect("plan");
    let read = plan.read_checked().expect("read");
    assert_eq!(read.len() as u64, to - 6);
    for (s, bytes) in (7..=to).zip(read) {
        assert_eq!(bytes, rec(s), "record {s}");
    }
}

#[test]
fn a_roll_reuses_a_released_segment_instead_of_writing_a_new_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = reusing(dir.path(), 18);
    // Segment 4's spare was begun before the release filled the pool, and
    // a roll takes a spare that is built; segment 5 comes from the pool.
    assert!(log.segments_recycled() >= 1);
    assert_eq!(
        log.segments_recycled() + pool(dir.path()) as u64,
        2,
        "each pool file was taken once, or is still there"
    );
    all_records(&log, 18);
}

#[test]
fn a_reused_segments_earlier_records_past_the_end_are_neither_kept_nor_damage() {
    for to in 13..=18 {
        let dir = tempfile::tempdir().expect("tmp");
        drop(reusing(dir.path(), to));
        let (log, r) = open(dir.path());
        assert_eq!(r.cut_bytes, 0, "to {to}");
        assert_eq!(r.mid_log_corruption, None, "to {to}");
        assert_eq!(r.segments_removed, 0, "to {to}");
        all_records(&log, to);
        // Reopened, the log goes on from its end, and again after that.
        let mut log = log;
        append(&mut log, to + 1, to + 4);
        drop(log);
        let (log, r) = open(dir.path());
        assert_eq!((r.cut_bytes, r.mid_log_corruption), (0, None), "to {to}");
        all_records(&log, to + 4);
    }
}

#[test]
fn a_torn_record_in_a_reused_segment_ends_the_log_before_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = reusing(dir.path(), 14);
    let e = *log.entries.last().expect("record 14");
    drop(log);
    // Record 14, in reused segment 4, loses its last bytes (CRC).
    let path = SegmentLog::segment_path(dir.path(), e.segment);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[(e.offset + e.len) as usize - 3] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write");
    let (mut log, r) = open(dir.path());
    assert_eq!(r.mid_log_corruption, None, "a torn tail, not damage");
    assert_eq!(log.last(), b(13));
    append(&mut log, 14, 20);
    drop(log);
    let (log, r) = open(dir.path());
    assert_eq!(r.mid_log_corruption, None);
    all_records(&log, 20);
}

#[test]
fn damage_in_a_reused_segment_with_newer_records_after_it_is_still_found() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = reusing(dir.path(), 18);
    let e = log
        .entries
        .iter()
        .find(|e| e.bookmark == b(14))
        .copied()
        .expect("record 14");
    drop(log);
    let path = SegmentLog::segment_path(dir.path(), e.segment);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[e.offset as usize + 40] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write");
    let (log, r) = open(dir.path());
    assert_eq!(r.mid_log_corruption, Some(b(13)));
    assert!(r.records_after_corruption >= 4, "15..=18 are newer");
    assert_eq!(log.last(), b(13));
}

#[test]
fn a_crash_right_after_a_roll_took_a_pool_file_leaves_the_log_as_it_was() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = reusing(dir.path(), 15);
    // The next roll's rename and directory sync, then the crash: segment 5
    // holds only what it held as segment 1 (records 4..=6).
    let index = log.entries.last().expect("15").segment + 1;
    drop(log);
    let (file, _) = recycle::take(
        dir.path(),
        &SegmentLog::segment_path(dir.path(), index),
        SEG,
    )
    .expect("io")
    .expect("a pool file");
    drop(file);
    let (mut log, r) = open(dir.path());
    assert_eq!((r.cut_bytes, r.mid_log_corruption), (0, None));
    assert_eq!(r.segments_removed, 0, "an empty segment, kept as the next");
    assert_eq!(log.last(), b(15));
    append(&mut log, 16, 21);
    drop(log);
    let (log, r) = open(dir.path());
    assert_eq!((r.cut_bytes, r.mid_log_corruption), (0, None));
    all_records(&log, 21);
}

#[test]
fn a_reused_segment_that_is_the_first_kept_and_holds_no_record_of_this_life_opens_empty() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path());
    append(&mut log, 1, 6);
    log.release_through(b(3))
        .expect("release segment 0 into the pool");
    assert_eq!(pool(dir.path()), 1);
    // Record 7 rolls to segment 2, made from segment 0's file (its spare
    // dropped, so the pool serves), and is staged; segment 1 is released;
    // then the crash, before record 7 was written.
    log.spare = None;
    log.append(&rec(7)).expect("append");
    assert_eq!(log.segments_recycled(), 1);
    log.release_through(b(6)).expect("release segment 1");
    drop(log);
    let (mut log, r) = open(dir.path());
    assert_eq!((r.cut_bytes, r.mid_log_corruption), (0, None));
    assert_eq!(r.stale_segments, 1, "segment 0's records 1..=3");
    assert_eq!((log.start(), log.last()), (b(6), b(6)));
    append(&mut log, 7, 9);
    drop(log);
    let (log, r) = open(dir.path());
    assert_eq!((r.cut_bytes, r.mid_log_corruption), (0, None));
    assert_eq!(log.last(), b(9));
}

#[test]
fn the_pool_holds_at_most_its_bound_and_only_full_size_segments() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path());
    append(&mut log, 1, 15);
    let released = log.release_through(b(12)).expect("release");
    assert_eq!(released.segments, 4);
    assert_eq!(
        pool(dir.path()),
        recycle::MAX_FREE,
        "the rest were unlinked"
    );
    drop(log);
    // Opened with another segment size, the pool's files are of no use.
    let (_log, _) = SegmentLog::open_with(dir.path(), 2 * SEG, b(0), IoBackend::Std).expect("open");
    assert_eq!(pool(dir.path()), 0);
}

#[test]
fn a_log_with_a_pool_file_for_its_next_roll_prepares_no_spare() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut log = reusing(dir.path(), 13);
    assert!(pool(dir.path()) >= 1);
    assert!(
        log.spare.is_none(),
        "the next roll's segment comes from the pool"
    );
    let (spares, recycled) = (log.spares_used(), log.segments_recycled());
    append(&mut log, 14, 16);
    assert_eq!(log.spares_used(), spares);
    assert_eq!(log.segments_recycled(), recycled + 1);
}
