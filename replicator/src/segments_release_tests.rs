//! The segment log's retention tests: releasing an archived prefix, the
//! `released` marker across every crash point, starting over at a peer's
//! start.
use super::release::base::{self, Base};
use super::tests::{SEG, b, rec};
use super::*;
use crate::bookmark::{Epoch, Sequence};
use crate::record::Record;
use crate::record::testing::chain_at;

/// A log of records 1..=n (three to a segment), all durable.
fn log_of(dir: &Path, n: u64) -> SegmentLog {
    let (mut log, _) = SegmentLog::open_with(dir, SEG, b(0), IoBackend::Std).expect("open");
    for s in 1..=n {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
    log
}

fn reopen(dir: &Path) -> (SegmentLog, Recovery) {
    SegmentLog::open_with(dir, SEG, b(0), IoBackend::Std).expect("reopen")
}

fn segments(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .expect("ls")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok()
        })
        .collect();
    v.sort_unstable();
    v
}

/// Record `s` of epoch `e` after `previous`, chained.
fn rec_in(e: u32, s: u64, previous: Bookmark) -> Bytes {
    crate::record::testing::chained(
        Record {
            bookmark: Bookmark::new(Epoch(e), Sequence(s)),
            previous,
            prev_chain: ChainHash::GENESIS,
            commit_us: 0,
            page_size: 512,
            db_pages: 3,
            pages: vec![
                (1, Bytes::from(vec![s as u8; 512])),
                (3, Bytes::from(vec![2u8; 512])),
            ],
        },
        false,
    )
    .bytes
}

#[test]
fn releasing_deletes_whole_durable_segments_and_the_log_then_starts_at_the_last_released_record() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut log = log_of(dir.path(), 10);
    let segs: Vec<u64> = log.entries.iter().map(|e| e.segment).collect();
    assert_eq!(
        segs,
        [0, 0, 0, 1, 1, 1, 2, 2, 2, 3],
        "three records a segment"
    );
    let history = log.history();
    let disk = log.disk_bytes();
    assert_eq!(disk, 4 * SEG);
    // Record 6 ends segment 1, but 5 does not: only segment 0 goes.
    let r = log.release_through(b(5)).expect("release");
    assert_eq!(
        r,
        Released {
            segments: 1,
            bytes: SEG,
            start: b(3)
        }
    );
    assert_eq!(segments(dir.path()), [1, 2, 3]);
    assert_eq!((log.start(), log.last(), log.len()), (b(3), b(10), 7));
    assert_eq!(log.disk_bytes(), disk - SEG);
    assert_eq!(
        log.chain_at(b(3)),
        Some(chain_at(b(3))),
        "the start's chain"
    );
    assert_eq!(log.chain_at(b(2)), None);
    assert_eq!(
        log.history(),
        history,
        "the history covers the released prefix"
    );
    assert_eq!(
        log.read_after(b(3)).expect("read"),
        (4..=10).map(rec).collect::<Vec<_>>()
    );
    drop(log);
    let (mut log, r) = reopen(dir.path());
    assert_eq!((r.records, r.released_removed, r.cut_bytes), (7, 0, 0));
    assert_eq!((log.start(), log.last()), (b(3), b(10)));
    assert_eq!(log.chain_at(b(3)), Some(chain_at(b(3))));
    assert_eq!(log.history(), history);
    log.append(&rec(11)).expect("the log goes on");
    assert_eq!(log.sync().expect("sync"), b(11));
}

#[test]
fn reading_from_before_the_start_is_a_typed_error_never_a_silent_skip() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut log = log_of(dir.path(), 7);
    log.release_through(b(6)).expect("release");
    assert_eq!(log.start(), b(6));
    for after in [b(0), b(2), b(5)] {
        match log.read_after(after) {
            Err(SegmentError::Released { after: a, start }) => {
                assert_eq!((a, start), (after, b(6)));
            }
            other => panic!("read after {after}: {other:?}"),
        }
        assert!(matches!(
            log.read_batch(after, b(7), 1 << 20),
            Err(SegmentError::Released { .. })
        ));
    }
    assert_eq!(log.read_after(b(6)).expect("from the start"), vec![rec(7)]);
}

#[test]
fn the_segment_being_written_and_records_not_yet_durable_are_never_released() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut log = log_of(dir.path(), 4);
    for s in 5..=9 {
        log.append(&rec(s)).expect("stage");
    }
    assert_eq!(log.durable(), b(4));
    // Segment 1 (4, 5, 6) holds staged records: only segment 0 goes.
    let r = log.release_through(b(9)).expect("release");
    assert_eq!((r.segments, r.start), (1, b(3)));
    log.sync().expect("sync");
    // Segment 3 (record 10) is being written: never released, even
    // through a bookmark past the end.
    log.append(&rec(10)).expect("append");
    log.sync().expect("sync");
    let r = log.release_through(b(99)).expect("release");
    assert_eq!((r.segments, r.start), (2, b(9)));
    assert_eq!(segments(dir.path()), [3]);
    assert_eq!(
        log.release_through(b(99)).expect("again"),
        Released {
            segments: 0,
            bytes: 0,
            start: b(9)
        },
        "nothing more to release"
    );
    log.append(&rec(11)).expect("append");
    assert_eq!(log.sync().expect("sync"), b(11));
    drop(log);
    let (log, _) = reopen(dir.path());
    assert_eq!((log.start(), log.last()), (b(9), b(11)));
}

#[test]
fn the_release_point_keeps_at_least_the_asked_bytes_in_the_newest_segments() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = log_of(dir.path(), 10); // segments 0..=3, the last being written
    assert_eq!(
        log.release_point(0),
        b(9),
        "all but the segment being written"
    );
    assert_eq!(log.release_point(SEG), b(9));
    assert_eq!(log.release_point(SEG + 1), b(6));
    assert_eq!(log.release_point(3 * SEG), b(3));
    assert_eq!(log.release_point(3 * SEG + 1), b(0), "nothing: the start");
    let mut staged = log;
    staged.append(&rec(11)).expect("stage");
    staged.append(&rec(12)).expect("stage"); // segment 3 holds 10..=12, not all durable
    assert_eq!(staged.release_point(0), b(9));
}

#[test]
fn a_crash_at_any_point_after_the_marker_reopens_at_the_new_start_and_finishes_the_release() {
    let whole = {
        let dir = tempfile::tempdir().expect("tmp");
        log_of(dir.path(), 10).history()
    };
    // 0 unlinked: the crash came right after the marker; all of them
    // unlinked but the directory not synced reopens like some or none.
    for unlinked in 0..=3 {
        let dir = tempfile::tempdir().expect("tmp");
        let log = log_of(dir.path(), 10);
        let plan = log.plan_release(b(9)).expect("something to release");
        assert_eq!(plan.segments, [0, 1, 2]);
        base::store(dir.path(), &plan.marker).expect("marker");
        log.unlinking(&log.reusable(&plan.segments[..unlinked]))
            .run()
            .expect("unlink");
        drop(log); // the crash
        let (log, r) = reopen(dir.path());
        assert_eq!(r.released_removed, 3 - unlinked, "unlinked {unlinked}");
        assert_eq!((r.records, r.cut_bytes, r.segments_removed), (1, 0, 0));
        assert_eq!(segments(dir.path()), [3]);
        assert_eq!((log.start(), log.last()), (b(9), b(10)));
        assert_eq!(log.chain_at(b(9)), Some(chain_at(b(9))));
        assert_eq!(log.history(), whole);
        assert_eq!(log.read_after(b(9)).expect("read"), vec![rec(10)]);
    }
}

#[test]
fn a_crash_before_the_marker_is_in_place_reopens_the_log_as_it_was() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = log_of(dir.path(), 10);
    let plan = log.plan_release(b(9)).expect("plan");
    drop(log);
    // A marker written to its temporary name, torn, never renamed.
    std::fs::write(dir.path().join("released.tmp"), b"WRRELEAS\0\0\x01").expect("tmp");
    let (log, r) = reopen(dir.path());
    assert_eq!((r.records, r.released_removed), (10, 0));
    assert_eq!((log.start(), log.last()), (b(0), b(10)));
    assert_eq!(segments(dir.path()), [0, 1, 2, 3]);
    // The release is simply done again.
    let mut log = log;
    let r = log.release_through(b(9)).expect("release");
    assert_eq!(
        (r.segments, r.start),
        (plan.segments.len(), plan.marker.start)
    );
}

#[test]
fn a_marker_the_first_kept_record_does_not_chain_onto_is_refused_before_anything_is_deleted() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = log_of(dir.path(), 7);
    let mut plan = log.plan_release(b(3)).expect("plan");
    drop(log);
    let wrong = [
        // Another start than the record before segment 1.
        Base {
            start: b(2),
            history: crate::history::History::from_runs(vec![(Epoch(1), Sequence(2))])
                .expect("runs"),
            ..plan.marker.clone()
        },
        // The right start with another chain.
        Base {
            chain: ChainHash::over(&[b"another history"]),
            ..plan.marker.clone()
        },
    ];
    for marker in wrong {
        base::store(dir.path(), &marker).expect("marker");
        match SegmentLog::open_with(dir.path(), SEG, b(0), IoBackend::Std) {
            Err(SegmentError::BaseMismatch {
                start, bookmark, ..
            }) => assert_eq!((start, bookmark), (marker.start, b(4))),
            other => panic!("opened: {other:?}"),
        }
        assert_eq!(segments(dir.path()), [0, 1, 2], "nothing deleted");
    }
    // A damaged marker: where the log starts is unknown, so it is refused.
    plan.marker.start = b(3);
    base::store(dir.path(), &plan.marker).expect("marker");
    let path = dir.path().join(base::NAME);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[10] ^= 0x40;
    std::fs::write(&path, &bytes).expect("write");
    assert!(matches!(
        SegmentLog::open_with(dir.path(), SEG, b(0), IoBackend::Std),
        Err(SegmentError::BaseMarker { .. })
    ));
    assert_eq!(segments(dir.path()), [0, 1, 2]);
}

#[test]
fn releases_across_epochs_keep_the_whole_epoch_history_and_move_the_start_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) =
        SegmentLog::open_with(dir.path(), SEG, Bookmark::ZERO, IoBackend::Std).expect("open");
    let mut prev = Bookmark::ZERO;
    let mut bookmarks = Vec::new();
    for (e, n) in [(1u32, 4u64), (3, 3), (4, 5)] {
        for s in 1..=n {
            log.append(&rec_in(e, s, prev)).expect("append");
            prev = Bookmark::new(Epoch(e), Sequence(s));
            bookmarks.push(prev);
        }
    }
    log.sync().expect("sync");
    let history = log.history();
    assert_eq!(history.runs().len(), 3);
    let first = log.release_through(bookmarks[4]).expect("release");
    assert_eq!(first.start, bookmarks[2]);
    let second = log.release_through(bookmarks[8]).expect("release");
    assert_eq!(second.start, bookmarks[8], "epoch 4's second record");
    assert_eq!(log.history(), history);
    drop(log);
    let (log, r) =
        SegmentLog::open_with(dir.path(), SEG, Bookmark::ZERO, IoBackend::Std).expect("reopen");
    assert_eq!(r.records, 3);
    assert_eq!(log.start(), bookmarks[8]);
    assert_eq!(log.history(), history);
    assert_eq!(log.chain_at(bookmarks[8]), Some(chain_at(bookmarks[8])));
    assert!(matches!(
        log.read_after(bookmarks[7]),
        Err(SegmentError::Released { .. })
    ));
}

#[test]
fn a_cut_never_reaches_below_the_released_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut log = log_of(dir.path(), 7);
    log.release_through(b(3)).expect("release");
    log.truncate_after(b(1)).expect("cut");
    assert_eq!((log.start(), log.last(), log.len()), (b(3), b(3), 0));
    assert_eq!(log.last_chain(), Some(chain_at(b(3))));
    log.append(&rec(4)).expect("the log goes on from its start");
    log.sync().expect("sync");
    drop(log);
    let (log, _) = reopen(dir.path());
    assert_eq!((log.start(), log.last()), (b(3), b(4)));
}

#[test]
fn a_reset_empties_the_log_and_starts_it_over_at_the_given_start_durably() {
    for s in 1..=25 {
        rec(s); // every record's chain, for chain_at
    }
    let start_history =
        crate::history::History::from_runs(vec![(Epoch(1), Sequence(20))]).expect("runs");
    let dir = tempfile::tempdir().expect("tmp");
    let mut log = log_of(dir.path(), 4);
    log.append(&rec(5)).expect("staged, dropped too");
    for (start, history) in [(b(4), start_history.clone()), (b(20), History::new())] {
        assert!(
            matches!(
                log.reset_to(start, chain_at(b(20)), history),
                Err(SegmentError::Reset { .. })
            ),
            "backwards or without its history"
        );
    }
    let removed = log
        .reset_to(b(20), chain_at(b(20)), start_history.clone())
        .expect("reset");
    assert_eq!(removed, 2 * SEG);
    assert!(segments(dir.path()).is_empty());
    assert_eq!(
        (log.start(), log.last(), log.durable()),
        (b(20), b(20), b(20))
    );
    assert_eq!((log.disk_bytes(), log.len()), (0, 0));
    assert_eq!(log.last_chain(), Some(chain_at(b(20))));
    assert_eq!(log.history(), start_history);
    assert!(matches!(
        log.read_after(b(4)),
        Err(SegmentError::Released { .. })
    ));
    log.append(&rec(21)).expect("the peer's next record");
    log.sync().expect("sync");
    assert_eq!(segments(dir.path()), [2], "segment numbers are not reused");
    drop(log);
    let (log, r) = reopen(dir.path());
    assert_eq!((r.records, r.released_removed), (1, 0));
    assert_eq!((log.start(), log.last()), (b(20), b(21)));
    assert_eq!(log.history().runs(), &[(Epoch(1), Sequence(21))]);
}

#[test]
fn a_crash_after_a_resets_marker_reopens_empty_at_the_new_start() {
    for s in 1..=20 {
        rec(s);
    }
    let dir = tempfile::tempdir().expect("tmp");
    let log = log_of(dir.path(), 4);
    base::store(
        dir.path(),
        &Base {
            start: b(20),
            chain: chain_at(b(20)),
            first_kept: 2,
            history: History::from_runs(vec![(Epoch(1), Sequence(20))]).expect("runs"),
        },
    )
    .expect("marker");
    drop(log); // the crash: segments 0 and 1 still there
    let (log, r) = reopen(dir.path());
    assert_eq!((r.records, r.released_removed), (0, 2));
    assert!(segments(dir.path()).is_empty());
    assert_eq!((log.start(), log.last()), (b(20), b(20)));
    assert_eq!(log.last_chain(), Some(chain_at(b(20))));
}

#[test]
fn records_read_after_the_lock_are_checked_against_where_they_were_located() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = log_of(dir.path(), 5);
    let plan = log.plan_batch(b(0), b(5), 1 << 20).expect("plan");
    assert_eq!(plan.len(), 5);
    assert_eq!(
        plan.read_checked().expect("read"),
        (1..=5).map(rec).collect::<Vec<_>>()
    );
    // Segment 0 rewritten under the plan: refused, not served.
    let path = SegmentLog::segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[200] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write");
    assert!(matches!(
        plan.read_checked(),
        Err(SegmentError::Moved { bookmark }) if bookmark == b(1)
    ));
    // Released under the plan: an I/O error, not other bytes.
    std::fs::remove_file(&path).expect("rm");
    assert!(matches!(plan.read_checked(), Err(SegmentError::Io { .. })));
}
