//! The shared log's contract, database by database.

use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::history::History;
use crate::record::Record;
use bytes::Bytes;

pub(super) fn config(segment_bytes: u64, max_segments: usize) -> SharedLogConfig {
    SharedLogConfig {
        segment_bytes,
        max_segments,
        backend: IoBackend::Std,
    }
}

/// The next record of a database whose log ends at `prev` (bookmark and
/// chain), in `epoch`, with `size` bytes of page images (whole pages).
pub(super) fn next(prev: (Bookmark, ChainHash), epoch: u32, fill: u8, size: usize) -> Encoded {
    let seq = prev.0.sequence.0 + 1;
    Record {
        bookmark: Bookmark::new(Epoch(epoch), Sequence(seq)),
        previous: prev.0,
        prev_chain: prev.1,
        commit_us: 0,
        page_size: 512,
        db_pages: size.div_ceil(512).max(1) as u32,
        pages: (1..=size.div_ceil(512).max(1) as u32)
            .map(|p| (p, Bytes::from(vec![fill; 512])))
            .collect(),
    }
    .to_encoded()
    .expect("record")
}

/// What a test expects of one database: its records' bytes, in order.
#[derive(Debug, Default, Clone)]
pub(super) struct Expect {
    pub(super) records: Vec<Encoded>,
    pub(super) start: Bookmark,
    /// The start's chain (GENESIS for ZERO).
    pub(super) start_chain: Option<ChainHash>,
}

impl Expect {
    pub(super) fn end(&self) -> (Bookmark, ChainHash) {
        match self.records.last() {
            Some(r) => (r.bookmark, r.chain),
            None => (self.start, self.start_chain.unwrap_or(ChainHash::GENESIS)),
        }
    }
}

/// Appends the next record of `id` to `log` and to `expect`.
pub(super) fn append(
    log: &Arc<SharedLog>,
    id: DatabaseId,
    expect: &mut Expect,
    fill: u8,
    size: usize,
) {
    let r = next(expect.end(), 1, fill, size);
    log.database(id).append_encoded(&r).expect("append");
    expect.records.push(r);
}

/// Checks `id`'s index and bytes against `expect`.
pub(super) fn check(log: &Arc<SharedLog>, id: DatabaseId, expect: &Expect) {
    let db = log.database(id);
    let (last, chain) = expect.end();
    assert_eq!(db.last(), last, "database {id}: last");
    assert_eq!(db.durable(), last, "database {id}: durable");
    assert_eq!(db.start(), expect.start, "database {id}: start");
    if !expect.records.is_empty() {
        assert_eq!(db.last_chain(), Some(chain), "database {id}: last chain");
    }
    let mut h = History::new();
    for r in &expect.records {
        assert_eq!(
            db.chain_at(r.bookmark),
            Some(r.chain),
            "database {id}: chain at {}",
            r.bookmark
        );
        h.record(r.bookmark);
    }
    if expect.start == Bookmark::ZERO {
        assert_eq!(db.history().runs(), h.runs(), "database {id}: history");
    } else {
        assert_eq!(db.history().last(), last, "database {id}: history");
    }
    let read = db.read_after(expect.start).expect("read");
    let want: Vec<Bytes> = expect.records.iter().map(|r| r.bytes.clone()).collect();
    assert_eq!(read, want, "database {id}: the bytes read back");
}

#[test]
fn many_databases_interleaved_survive_a_restart_with_every_index_correct() {
    interleaved(IoBackend::Std);
}

#[test]
fn many_databases_interleaved_survive_a_restart_on_the_default_io_backend() {
    interleaved(IoBackend::Auto);
}

fn interleaved(backend: IoBackend) {
    let dir = tempfile::tempdir().expect("dir");
    let mut expect: Vec<Expect> = vec![Expect::default(); 20];
    let config = |s, m| SharedLogConfig {
        backend,
        ..config(s, m)
    };
    {
        let (log, rec) = SharedLog::open(dir.path(), config(64 << 10, 64)).expect("open");
        eprintln!("shared log syncs with {}", log.io_backend());
        assert_eq!(rec, SharedRecovery::default());
        for round in 0..30u8 {
            for (i, e) in expect.iter_mut().enumerate() {
                append(&log, DatabaseId(i as u64 + 1), e, round, 300 + i * 7);
            }
            log.sync().expect("sync");
        }
        #[cfg(target_os = "linux")]
        if crate::uring::under_ci() {
            assert!(log.direct_io(), "CI's temporary directory takes O_DIRECT");
        }
        for (i, e) in expect.iter().enumerate() {
            check(&log, DatabaseId(i as u64 + 1), e);
        }
        assert!(log.segments() > 3, "the records span several segments");
    }
    let (log, rec) = SharedLog::open(dir.path(), config(64 << 10, 64)).expect("reopen");
    assert_eq!(rec.records, 20 * 30);
    assert_eq!((rec.cut_bytes, rec.unchained, rec.duplicates), (0, 0, 0));
    for (i, e) in expect.iter().enumerate() {
        check(&log, DatabaseId(i as u64 + 1), e);
    }
    // And each takes its next record.
    append(&log, DatabaseId(3), &mut expect[2], 9, 100);
    log.sync().expect("sync");
    check(&log, DatabaseId(3), &expect[2]);
}

#[test]
fn staged_records_are_durable_and_readable_only_after_a_sync_and_one_fdatasync_covers_every_database()
 {
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(1 << 20, 8)).expect("open");
    let mut expect: Vec<Expect> = vec![Expect::default(); 50];
    for (i, e) in expect.iter_mut().enumerate() {
        append(&log, DatabaseId(i as u64), e, 1, 200);
        let db = log.database(DatabaseId(i as u64));
        assert_eq!(db.durable(), Bookmark::ZERO);
        assert!(db.has_staged());
        assert!(
            db.read_after(Bookmark::ZERO).expect("read").is_empty(),
            "nothing staged is served"
        );
    }
    assert_eq!(log.sync().expect("sync").fdatasyncs, 1);
    assert_eq!(log.stats().fdatasyncs, 1);
    for (i, e) in expect.iter().enumerate() {
        assert!(!log.database(DatabaseId(i as u64)).has_staged());
        check(&log, DatabaseId(i as u64), e);
    }
    assert_eq!(
        log.sync().expect("sync").fdatasyncs,
        0,
        "nothing staged: no I/O"
    );
}

#[test]
fn a_record_that_does_not_follow_its_database_is_refused_and_others_are_unaffected() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(1 << 20, 8)).expect("open");
    let mut a = Expect::default();
    append(&log, DatabaseId(1), &mut a, 1, 100);
    let stray = next(
        (Bookmark::new(Epoch(1), Sequence(5)), ChainHash::GENESIS),
        1,
        2,
        100,
    );
    assert!(matches!(
        log.database(DatabaseId(1)).append_encoded(&stray),
        Err(SegmentError::Discontinuous { .. })
    ));
    let wrong_chain = next((a.end().0, ChainHash::from_bytes([9; 16])), 1, 2, 100);
    assert!(matches!(
        log.database(DatabaseId(1)).append_encoded(&wrong_chain),
        Err(SegmentError::ChainMismatch { .. })
    ));
    // The same record is fine for another database starting fresh.
    let mut b = Expect::default();
    append(&log, DatabaseId(2), &mut b, 1, 100);
    log.sync().expect("sync");
    check(&log, DatabaseId(1), &a);
    check(&log, DatabaseId(2), &b);
}

#[test]
fn catch_up_reads_in_bounded_batches_return_the_same_bytes() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(32 << 10, 64)).expect("open");
    let (mut a, mut b) = (Expect::default(), Expect::default());
    for i in 0..40u8 {
        append(&log, DatabaseId(1), &mut a, i, 900);
        append(&log, DatabaseId(2), &mut b, i, 500);
    }
    log.sync().expect("sync");
    let db = log.database(DatabaseId(1));
    let mut after = Bookmark::ZERO;
    let mut got = Vec::new();
    loop {
        let plan = db.plan_batch(after, a.end().0, 4000).expect("plan");
        if plan.is_empty() {
            break;
        }
        assert!(plan.len() <= 4, "about max_bytes per batch");
        let batch = plan.read_checked().expect("read");
        let (last, _) = Encoded::decode(batch.last().expect("one")).expect("decode");
        after = last.bookmark;
        got.extend(batch);
    }
    let want: Vec<Bytes> = a.records.iter().map(|r| r.bytes.clone()).collect();
    assert_eq!(got, want);
    // Up to a bound only.
    let upto = a.records[9].bookmark;
    assert_eq!(
        db.read_batch(Bookmark::ZERO, upto, usize::MAX)
            .expect("read")
            .len(),
        10
    );
    // The index alone sizes a span, the other database's records aside.
    let size = |from: usize, to: usize| -> u64 {
        a.records[from..to]
            .iter()
            .map(|r| r.bytes.len() as u64)
            .sum()
    };
    assert_eq!(
        db.bytes_between(Bookmark::ZERO, upto).expect("size"),
        size(0, 10)
    );
    assert_eq!(
        db.bytes_between(a.records[4].bookmark, a.end().0)
            .expect("size"),
        size(5, a.records.len())
    );
    assert_eq!(db.bytes_between(a.end().0, a.end().0).expect("size"), 0);
}

#[test]
fn truncate_after_cuts_one_database_only_and_the_cut_survives_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let (mut a, mut b) = (Expect::default(), Expect::default());
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("open");
        for i in 0..10u8 {
            append(&log, DatabaseId(1), &mut a, i, 700);
            append(&log, DatabaseId(2), &mut b, i, 700);
        }
        log.sync().expect("sync");
        let keep = a.records[3].bookmark;
        let cut = log
            .database(DatabaseId(1))
            .truncate_after(keep)
            .expect("cut");
        assert!(cut > 0);
        a.records.truncate(4);
        check(&log, DatabaseId(1), &a);
        check(&log, DatabaseId(2), &b);
        // A new epoch's records follow the kept prefix.
        for i in 0..3u8 {
            let r = next(a.end(), 2, 50 + i, 700);
            log.database(DatabaseId(1))
                .append_encoded(&r)
                .expect("append");
            a.records.push(r);
        }
        log.sync().expect("sync");
        check(&log, DatabaseId(1), &a);
    }
    let (log, rec) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("reopen");
    assert_eq!(rec.unchained, 0);
    check(&log, DatabaseId(1), &a);
    check(&log, DatabaseId(2), &b);
}

#[test]
fn reset_starts_one_database_over_and_leaves_the_others_untouched_across_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let (mut a, mut b) = (Expect::default(), Expect::default());
    let start = Bookmark::new(Epoch(3), Sequence(100));
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("open");
        for i in 0..5u8 {
            append(&log, DatabaseId(1), &mut a, i, 700);
            append(&log, DatabaseId(2), &mut b, i, 700);
        }
        log.sync().expect("sync");
        let mut history = History::new();
        history.record(Bookmark::new(Epoch(2), Sequence(40)));
        history.record(start);
        let chain = ChainHash::from_bytes([7; 16]);
        let db = log.database(DatabaseId(1));
        assert!(
            db.reset_to(Bookmark::new(Epoch(1), Sequence(2)), chain, history.clone())
                .is_err()
        );
        db.reset_to(start, chain, history.clone()).expect("reset");
        assert_eq!((db.start(), db.last(), db.durable()), (start, start, start));
        assert_eq!(db.history(), history);
        let r = next((start, chain), 3, 1, 300);
        db.append_encoded(&r).expect("append after the start");
        log.sync().expect("sync");
        a = Expect {
            records: vec![r],
            start,
            start_chain: Some(chain),
        };
        check(&log, DatabaseId(1), &a);
        check(&log, DatabaseId(2), &b);
    }
    let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("reopen");
    check(&log, DatabaseId(1), &a);
    check(&log, DatabaseId(2), &b);
    assert_eq!(
        log.database(DatabaseId(1)).chain_at(start),
        Some(ChainHash::from_bytes([7; 16]))
    );
}

#[test]
fn a_released_prefix_is_refused_to_readers_and_the_start_survives_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let mut a = Expect::default();
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("open");
        for i in 0..10u8 {
            append(&log, DatabaseId(1), &mut a, i, 500);
        }
        // Not durable yet: nothing to release.
        let db = log.database(DatabaseId(1));
        assert_eq!(
            db.release_through(a.end().0).expect("release").start,
            Bookmark::ZERO
        );
        log.sync().expect("sync");
        let upto = a.records[5].bookmark;
        let upto_chain = a.records[5].chain;
        let r = db.release_through(upto).expect("release");
        assert_eq!(r.start, upto);
        assert!(r.bytes > 0);
        a.records.drain(..6);
        a.start = upto;
        assert!(matches!(
            db.read_after(Bookmark::ZERO),
            Err(SegmentError::Released { .. })
        ));
        check(&log, DatabaseId(1), &a);
        assert_eq!(
            db.chain_at(upto),
            Some(upto_chain),
            "the start's chain is known"
        );
    }
    let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("reopen");
    check(&log, DatabaseId(1), &a);
    let h = log.database(DatabaseId(1)).history();
    assert_eq!(h.last(), a.end().0, "the released prefix's history is kept");
}

#[test]
fn release_and_compaction_hold_the_segment_bound_with_a_lagging_database_whose_records_stay_readable()
 {
    const MAX: usize = 4;
    let dir = tempfile::tempdir().expect("dir");
    let lagging = DatabaseId(1000);
    let mut lag = Expect::default();
    let mut busy: Vec<Expect> = vec![Expect::default(); 8];
    let mut reached = false;
    let segments;
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, MAX)).expect("open");
        for round in 0..200u32 {
            if round % 10 == 0 {
                append(&log, lagging, &mut lag, round as u8, 200);
            }
            for (i, e) in busy.iter_mut().enumerate() {
                append(&log, DatabaseId(i as u64), e, round as u8, 400);
            }
            log.sync().expect("sync");
            // Each busy database archives and releases everything but its
            // newest record now and then.
            if round % 3 == 2 {
                for (i, e) in busy.iter_mut().enumerate() {
                    let upto = e.records[e.records.len() - 2].bookmark;
                    log.database(DatabaseId(i as u64))
                        .release_through(upto)
                        .expect("release");
                    let n = e.records.len() - 1;
                    e.records.drain(..n);
                    e.start = upto;
                }
                assert!(log.segments() <= MAX, "held: {} segments", log.segments());
                assert!(log.disk_bytes() <= (MAX as u64) * (16 << 10));
                assert_eq!(
                    segment_files(dir.path()),
                    log.segments(),
                    "a release returns with the files of the segments it freed unlinked"
                );
            }
            reached |= log.segments() >= MAX;
        }
        assert!(reached, "the bound was reached");
        let stats = log.stats();
        assert!(stats.compactions > 0, "{stats:?}");
        assert!(stats.segments_deleted > 10, "{stats:?}");
        check(&log, lagging, &lag);
        for (i, e) in busy.iter().enumerate() {
            check(&log, DatabaseId(i as u64), e);
        }
        segments = log.segments();
    }
    // Dead records whose predecessors went with deleted segments replay
    // before what killed them: the live ones must all come back.
    let (log, rec) = SharedLog::open(dir.path(), config(16 << 10, MAX)).expect("reopen");
    assert_eq!(rec.unchained, 0);
    assert_eq!(log.segments(), segments);
    check(&log, lagging, &lag);
    assert_eq!(
        lag.records.len(),
        20,
        "the lagging database kept every record"
    );
    for (i, e) in busy.iter().enumerate() {
        check(&log, DatabaseId(i as u64), e);
    }
}

#[test]
fn a_database_that_released_everything_keeps_only_its_base_entry() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 4)).expect("open");
    let mut a = Expect::default();
    for i in 0..5u8 {
        append(&log, DatabaseId(1), &mut a, i, 500);
    }
    log.sync().expect("sync");
    let db = log.database(DatabaseId(1));
    assert!(db.disk_bytes() > 5 * 500);
    db.release_through(a.end().0).expect("release");
    assert!(
        db.disk_bytes() < 100,
        "only the base entry: {}",
        db.disk_bytes()
    );
    assert_eq!(db.release_point(0), a.end().0);
}

#[test]
fn importing_a_databases_own_segment_log_happens_once_even_if_interrupted() {
    use crate::segments::SegmentLog;
    let dir = tempfile::tempdir().expect("dir");
    let db_dir = dir.path().join("db");
    let log_dir = db_dir.join("log");
    let mut a = Expect::default();
    {
        let (mut old, _) =
            SegmentLog::open_with(&log_dir, 8 << 10, Bookmark::ZERO, IoBackend::Std).expect("old");
        for i in 0..20u8 {
            let r = next(a.end(), 1, i, 600);
            old.append_encoded(&r).expect("append");
            a.records.push(r);
        }
        old.sync().expect("sync");
        let upto = a.records[6].bookmark;
        let released = old.release_through(upto).expect("release");
        let gone = a
            .records
            .iter()
            .take_while(|r| r.bookmark <= released.start)
            .count();
        a.records.drain(..gone);
        a.start = released.start;
    }
    let copy = dir.path().join("copy");
    copy_dir(&log_dir, &copy);
    let shared = dir.path().join("shared");
    {
        let (log, _) = SharedLog::open(&shared, config(16 << 10, 64)).expect("open");
        assert_eq!(
            log.import(DatabaseId(1), &log_dir).expect("import"),
            Some(a.records.len())
        );
        assert!(!log_dir.exists(), "the old log is removed");
        check(&log, DatabaseId(1), &a);
    }
    // A crash after the import's sync but before the old log was
    // removed: found again, taken as imported, not doubled.
    copy_dir(&copy, &log_dir);
    {
        let (log, _) = SharedLog::open(&shared, config(16 << 10, 64)).expect("reopen");
        log.import(DatabaseId(1), &log_dir).expect("import again");
        assert!(!log_dir.exists());
        check(&log, DatabaseId(1), &a);
        assert_eq!(log.database(DatabaseId(1)).len(), a.records.len());
    }
    let (log, rec) = SharedLog::open(&shared, config(16 << 10, 64)).expect("reopen");
    assert_eq!(rec.unchained, 0);
    check(&log, DatabaseId(1), &a);
}

pub(super) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("list").flatten() {
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

#[test]
fn reading_one_database_does_not_read_the_records_of_others_far_between() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(2 << 20, 8)).expect("open");
    let (mut a, mut b) = (Expect::default(), Expect::default());
    for i in 0..10u8 {
        append(&log, DatabaseId(1), &mut a, i, 512);
        for _ in 0..8 {
            append(&log, DatabaseId(2), &mut b, i, 20 * 512);
        }
    }
    log.sync().expect("sync");
    let plan = log
        .database(DatabaseId(1))
        .plan_batch(Bookmark::ZERO, a.end().0, usize::MAX)
        .expect("plan");
    let own: u64 = a.records.iter().map(|r| r.bytes.len() as u64).sum();
    assert_eq!(plan.len(), 10);
    assert!(
        plan.span_bytes() <= own * 2,
        "{} bytes read for {own}",
        plan.span_bytes()
    );
    check(&log, DatabaseId(1), &a);
    check(&log, DatabaseId(2), &b);
}

/// The `.seg.tmp` files in `dir` (segments being built).
fn tmp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("ls")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| crate::prealloc::is_tmp_name(n))
        .collect()
}

/// Appends records of `id` (`size` bytes of pages) until the log prepares
/// a spare; waits for it, and returns its index and its file's inode.
fn until_spare(log: &Arc<SharedLog>, id: DatabaseId, e: &mut Expect, size: usize) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    for fill in 0..=255u8 {
        let mut inner = log.inner.lock();
        if let Some(spare) = inner.spare.as_mut() {
            assert!(spare.wait(), "the spare was built");
            let index = spare.index();
            let a = inner.active.as_ref().expect("active");
            assert!(a.write_offset * 8 >= a.size, "only past an eighth");
            let tmp = crate::prealloc::tmp_path(&segment_path(log.dir(), index));
            let meta = std::fs::metadata(tmp).expect("the spare's file");
            assert_eq!(meta.len(), inner.config.segment_bytes);
            return (index, meta.ino());
        }
        drop(inner);
        append(log, id, e, fill, size);
    }
    panic!("no spare prepared");
}

#[test]
fn a_roll_after_an_eighth_of_the_segment_takes_the_segment_prepared_ahead() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("dir");
    let mut a = Expect::default();
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("open");
        let (index, inode) = until_spare(&log, DatabaseId(1), &mut a, 700);
        assert_eq!((index, log.stats().spares_used), (1, 0));
        while log.stats().segments_created < 2 {
            append(&log, DatabaseId(1), &mut a, 9, 700);
        }
        assert_eq!(log.stats().spares_used, 1);
        assert!(tmp_files(dir.path()).is_empty(), "renamed into place");
        let seg = segment_path(dir.path(), 1);
        assert_eq!(std::fs::metadata(&seg).expect("seg").ino(), inode);
        log.sync().expect("sync");
        check(&log, DatabaseId(1), &a);
    }
    assert!(tmp_files(dir.path()).is_empty());
    let (log, rec) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("reopen");
    assert_eq!((rec.cut_bytes, rec.unchained), (0, 0));
    check(&log, DatabaseId(1), &a);
}

#[test]
fn an_entry_larger_than_the_spare_still_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().expect("dir");
    let mut a = Expect::default();
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("open");
        assert_eq!(until_spare(&log, DatabaseId(1), &mut a, 700).0, 1);
        append(&log, DatabaseId(1), &mut a, 1, 20 << 10);
        assert_eq!(log.stats().spares_used, 0, "too small: built inline");
        assert!(log.inner.lock().segments[&1].size > 16 << 10);
        // Full at once: the next one is prepared, and taken.
        assert_eq!(until_spare(&log, DatabaseId(1), &mut a, 700).0, 2);
        assert_eq!(tmp_files(dir.path()).len(), 1, "the discarded one is gone");
        append(&log, DatabaseId(1), &mut a, 2, 700);
        assert_eq!(log.stats().spares_used, 1);
        log.sync().expect("sync");
        check(&log, DatabaseId(1), &a);
    }
    let (log, _) = SharedLog::open(dir.path(), config(16 << 10, 64)).expect("reopen");
    check(&log, DatabaseId(1), &a);
}

#[test]
fn a_log_dropped_while_its_spare_is_prepared_reopens_clean_with_no_leftover_tmp() {
    // Segments of 4 MiB: the spare is still being written when the log
    // goes (right after the append that started it), which cancels it,
    // waits for it and removes its file.
    let dir = tempfile::tempdir().expect("dir");
    let cfg = config(4 << 20, 64);
    let mut a = Expect::default();
    {
        let (log, _) = SharedLog::open(dir.path(), cfg).expect("open");
        for fill in 0..=255u8 {
            let mut next = a.clone();
            append(&log, DatabaseId(1), &mut next, fill, 256 << 10);
            if log.inner.lock().spare.is_some() {
                break; // that record is not synced: lost with the log
            }
            log.sync().expect("sync");
            a = next;
        }
    }
    assert!(tmp_files(dir.path()).is_empty(), "dropping removed it");
    {
        let (log, rec) = SharedLog::open(dir.path(), cfg).expect("reopen");
        assert_eq!(rec.cut_bytes, 0);
        check(&log, DatabaseId(1), &a);
    }
    // What a crash mid-preparation leaves: a short `.seg.tmp`.
    let leftover = crate::prealloc::tmp_path(&segment_path(dir.path(), 1));
    std::fs::write(&leftover, vec![0u8; 1000]).expect("leftover");
    let (log, rec) = SharedLog::open(dir.path(), cfg).expect("reopen");
    assert!(tmp_files(dir.path()).is_empty(), "recovery removed it");
    assert_eq!((rec.segments, rec.cut_bytes), (1, 0));
    append(&log, DatabaseId(1), &mut a, 1, 700);
    log.sync().expect("sync");
    check(&log, DatabaseId(1), &a);
}

#[test]
fn cuts_resets_releases_and_compaction_with_a_spare_keep_every_database_whole() {
    const MAX: usize = 4;
    let dir = tempfile::tempdir().expect("dir");
    let (ida, idb) = (DatabaseId(1), DatabaseId(2));
    let (mut a, mut b) = (Expect::default(), Expect::default());
    let (mut epoch_a, mut epoch_b) = (1u32, 1u32);
    let push = |log: &Arc<SharedLog>, id, e: &mut Expect, epoch, fill| {
        let r = next(e.end(), epoch, fill, 700);
        log.database(id).append_encoded(&r).expect("append");
        e.records.push(r);
    };
    // Operations done while a spare was prepared: cut, release, reset.
    let mut with_spare = [0usize; 3];
    {
        let (log, _) = SharedLog::open(dir.path(), config(16 << 10, MAX)).expect("open");
        for round in 0..80u32 {
            push(&log, ida, &mut a, epoch_a, round as u8);
            push(&log, idb, &mut b, epoch_b, round as u8);
            log.sync().expect("sync");
            let spare = usize::from(log.inner.lock().spare.is_some());
            if round % 3 == 1 && a.records.len() >= 2 {
                let keep = a.records[a.records.len() - 2].bookmark;
                log.database(ida).truncate_after(keep).expect("cut");
                a.records.pop();
                epoch_a += 1;
                with_spare[0] += spare;
            } else if round % 4 == 2 && a.records.len() >= 2 {
                let upto = &a.records[a.records.len() - 2];
                let (start, chain) = (upto.bookmark, upto.chain);
                log.database(ida).release_through(start).expect("release");
                a.records.drain(..a.records.len() - 1);
                (a.start, a.start_chain) = (start, Some(chain));
                with_spare[1] += spare;
            } else if round % 13 == 5 {
                epoch_b += 1;
                let start = Bookmark::new(Epoch(epoch_b), Sequence(1000 * u64::from(round)));
                let mut history = History::new();
                history.record(start);
                let chain = ChainHash::from_bytes([round as u8; 16]);
                log.database(idb)
                    .reset_to(start, chain, history)
                    .expect("reset");
                b = Expect {
                    records: Vec::new(),
                    start,
                    start_chain: Some(chain),
                };
                with_spare[2] += spare;
            }
        }
        log.sync().expect("sync");
        let stats = log.stats();
        assert!(stats.spares_used > 0 && stats.compactions > 0, "{stats:?}");
        assert!(with_spare.iter().all(|n| *n > 0), "{with_spare:?}");
        check(&log, ida, &a);
        check(&log, idb, &b);
    }
    assert!(tmp_files(dir.path()).is_empty());
    let (log, rec) = SharedLog::open(dir.path(), config(16 << 10, MAX)).expect("reopen");
    assert_eq!((rec.cut_bytes, rec.unchained), (0, 0));
    check(&log, ida, &a);
    check(&log, idb, &b);
}

/// Segment files in `dir` (not a spare being built).
fn segment_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter(|e| {
            e.as_ref()
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count()
}
