//! The segment log's tests: appends, syncs on both I/O backends, recovery of torn and damaged logs, cuts.
use super::*;
use crate::bookmark::{Epoch, Sequence};
use crate::record::Record;
use std::fs::OpenOptions;

pub(super) fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

pub(super) fn rec(s: u64) -> Bytes {
    record(
        s,
        512,
        3,
        vec![
            (1, Bytes::from(vec![s as u8; 512])),
            (3, Bytes::from(vec![1u8; 512])),
        ],
    )
}

/// Record `s`, chained after `s - 1`, of `pages` 4 KiB pages: larger
/// than a segment of the small logs here.
pub(super) fn big_rec(s: u64, pages: u32) -> Bytes {
    record(
        s,
        4096,
        pages,
        (1..=pages)
            .map(|n| (n, Bytes::from(vec![n as u8; 4096])))
            .collect(),
    )
}

/// Record `s`, chained after `s - 1`, with these pages.
fn record(s: u64, page_size: u32, db_pages: u32, pages: Vec<(u32, Bytes)>) -> Bytes {
    crate::record::testing::chained(
        Record {
            bookmark: b(s),
            previous: b(s - 1),
            prev_chain: crate::chain::ChainHash::GENESIS,
            commit_us: 0,
            page_size,
            db_pages,
            pages,
        },
        false,
    )
    .bytes
}

pub(super) const SEG: u64 = 4 * 1024; // about three records a segment

const BACKENDS: [IoBackend; 2] = [IoBackend::Auto, IoBackend::Std];

/// Opens with `backend`, checking that `Auto` really gets io_uring
/// wherever the kernel allows it and the environment does not forbid it.
/// Reopens the log in `dir`: nothing cut or removed, and records 1..=`n`
/// all read back.
fn reopens_whole(dir: &Path, backend: IoBackend, n: u64) -> SegmentLog {
    let (log, r) = open(dir, backend);
    assert_eq!(
        (r.records, r.cut_bytes, r.segments_removed),
        (n as usize, 0, 0)
    );
    let want: Vec<Bytes> = (1..=n).map(rec).collect();
    assert_eq!(log.read_after(b(0)).expect("read"), want);
    log
}

fn open(dir: &Path, backend: IoBackend) -> (SegmentLog, Recovery) {
    let (log, r) = SegmentLog::open_with(dir, SEG, b(0), backend).expect("open");
    let want = if backend == IoBackend::Auto && !uring_forbidden() && uring_works() {
        "io_uring"
    } else {
        "std"
    };
    assert_eq!(log.io_backend(), want, "{backend:?}");
    (log, r)
}

fn uring_works() -> bool {
    #[cfg(target_os = "linux")]
    {
        uring::SyncRing::new(RING_ENTRIES).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[test]
fn a_log_holding_a_version_1_record_is_refused_not_cut() {
    // What an older walrelay wrote: a valid record without chain fields.
    let (page_size, pages) = (512u32, 2u32);
    let total = 48 + pages as usize * (4 + page_size as usize) + 4;
    let mut raw = Vec::with_capacity(total);
    raw.extend_from_slice(&crate::record::MAGIC);
    raw.extend_from_slice(&1u16.to_be_bytes());
    raw.extend_from_slice(&0u16.to_be_bytes());
    raw.extend_from_slice(&(total as u32).to_be_bytes());
    raw.extend_from_slice(&b(1).to_bytes());
    raw.extend_from_slice(&b(0).to_bytes());
    raw.extend_from_slice(&page_size.to_be_bytes());
    raw.extend_from_slice(&pages.to_be_bytes());
    raw.extend_from_slice(&pages.to_be_bytes());
    for no in 1..=pages {
        raw.extend_from_slice(&no.to_be_bytes());
        raw.resize(raw.len() + page_size as usize, no as u8);
    }
    let crc = crc32fast::hash(&raw);
    raw.extend_from_slice(&crc.to_be_bytes());
    assert_eq!(raw.len(), total);
    let dir = tempfile::tempdir().expect("tmp");
    let path = SegmentLog::segment_path(dir.path(), 0);
    std::fs::write(&path, &raw).expect("write segment");
    match SegmentLog::open_with(dir.path(), SEG, b(0), IoBackend::Std) {
        Err(SegmentError::LegacyRecord { len, .. }) => assert_eq!(len, total as u64),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("opened (and so cut) a log with a version 1 record"),
    }
    assert!(
        std::fs::read(&path).expect("read") == raw,
        "the segment is untouched"
    );
}

#[test]
fn a_damaged_record_mid_log_is_reported_and_what_follows_is_quarantined_not_lost() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path(), IoBackend::Std);
    for s in 1..=8 {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
    drop(log);
    // Flip a byte inside record 2's page image (segment 0).
    let seg = SegmentLog::segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&seg).expect("read");
    let second = rec(1).len() + crate::record::HEADER_BYTES + 10;
    bytes[second] ^= 0xff;
    std::fs::write(&seg, &bytes).expect("write");
    let (log, r) = open(dir.path(), IoBackend::Std);
    assert_eq!(r.mid_log_corruption, Some(b(1)), "{r:?}");
    assert!(r.records_after_corruption >= 6, "{r:?}");
    assert_eq!(log.last(), b(1), "the log is a chain up to the damage");
    let q: Vec<_> = std::fs::read_dir(dir.path().join("quarantine"))
        .expect("quarantine")
        .collect();
    assert!(!q.is_empty(), "what followed is kept aside");
    // A torn tail is not reported as damage.
    drop(log);
    let dir2 = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir2.path(), IoBackend::Std);
    for s in 1..=3 {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
    drop(log);
    let seg = SegmentLog::segment_path(dir2.path(), 0);
    let mut bytes = std::fs::read(&seg).expect("read");
    let end = 3 * rec(1).len();
    bytes[end - 3] ^= 0xff; // the last record's CRC: torn
    std::fs::write(&seg, &bytes).expect("write");
    let (_, r) = open(dir2.path(), IoBackend::Std);
    assert_eq!(r.mid_log_corruption, None);
    assert!(r.cut_bytes > 0);
}

#[test]
fn a_record_that_does_not_chain_is_refused_and_a_cut_suffix_stays_cut() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path(), IoBackend::Std);
    for s in 1..=4 {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
    let stranger = Record {
        bookmark: b(5),
        previous: b(4),
        prev_chain: crate::chain::ChainHash::over(&[b"another history"]),
        commit_us: 0,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![0u8; 512]))],
    }
    .encode()
    .expect("encode");
    assert!(matches!(
        log.append(&stranger),
        Err(SegmentError::ChainMismatch { .. })
    ));
    let before = log.history();
    log.append(&rec(5)).expect("append");
    assert!(log.truncate_after(b(2)).expect("cut") > 0);
    assert_eq!((log.last(), log.durable()), (b(2), b(2)));
    assert_eq!(
        log.chain_at(b(2)),
        Some(crate::record::testing::chain_at(b(2)))
    );
    assert_ne!(log.history(), before);
    drop(log);
    let (log, _) = open(dir.path(), IoBackend::Std);
    assert_eq!(log.last(), b(2), "the cut survives a reopen");
    assert_eq!(
        log.last_chain(),
        Some(crate::record::testing::chain_at(b(2)))
    );
}

#[test]
fn a_record_larger_than_a_segment_gets_a_segment_of_its_own_and_survives_reopen() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        log.append(&rec(1)).expect("append");
        let big = big_rec(2, 4);
        assert!(big.len() as u64 > SEG);
        log.append(&big).expect("an oversized record is stored");
        log.append(&rec(3)).expect("and the log goes on");
        assert_eq!(log.sync().expect("sync"), b(3));
        drop(log);
        let (log, r) = open(dir.path(), backend);
        assert_eq!((r.records, r.cut_bytes), (3, 0));
        assert_eq!(
            r.mid_log_corruption, None,
            "a segment's zero tail before the next segment is no damage"
        );
        assert!(!dir.path().join("quarantine").exists());
        assert_eq!(log.read_after(b(1)).expect("read"), vec![big, rec(3)]);
    }
}

#[test]
fn appended_records_survive_reopen_across_segments() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        for s in 1..=10 {
            log.append(&rec(s)).expect("append");
        }
        assert_eq!(log.sync().expect("sync"), b(10));
        drop(log);
        let (log, r) = open(dir.path(), backend);
        assert_eq!(r.records, 10);
        assert_eq!(log.last(), b(10));
        let after = log.read_after(b(6)).expect("catch up");
        assert_eq!(after.len(), 4);
        assert_eq!(after[0], rec(7));
        // Sized from the index, as read.
        let read: u64 = after.iter().map(|r| r.len() as u64).sum();
        assert_eq!(log.bytes_between(b(6), b(10)).expect("size"), read);
        assert_eq!(
            log.bytes_between(b(6), b(8)).expect("size"),
            2 * rec(7).len() as u64
        );
        assert_eq!(log.bytes_between(b(10), b(10)).expect("size"), 0);
    }
}

#[test]
fn many_appends_then_one_sync_are_all_durable_across_rolls() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        log.append(&rec(1)).expect("append");
        log.sync().expect("sync");
        // Staged, not written: the files hold only the first record.
        for s in 2..=40 {
            log.append(&rec(s)).expect("append");
        }
        assert!(log.rolled.len() > 2, "the staged records span segments");
        assert_eq!(log.read_after(b(0)).expect("read"), vec![rec(1)]);
        let (unsynced, r) = open(dir.path(), backend);
        assert_eq!((unsynced.last(), r.records), (b(1), 1));
        drop(unsynced);

        assert_eq!(log.sync().expect("one sync"), b(40));
        assert!(log.rolled.is_empty() && log.pending.is_empty());
        assert_eq!(log.read_after(b(0)).expect("read").len(), 40);
        drop(log);
        reopens_whole(dir.path(), backend, 40);
        assert!(std::fs::read_dir(dir.path()).expect("ls").count() > 10);
    }
}

#[test]
fn the_log_goes_on_after_a_sync_with_nothing_staged() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        assert_eq!(log.sync().expect("empty sync"), b(0));
        for s in 1..=4 {
            log.append(&rec(s)).expect("append");
            assert_eq!(log.sync().expect("sync"), b(s));
            assert_eq!(log.sync().expect("again"), b(s));
        }
        let (log, _) = open(dir.path(), backend);
        assert_eq!(log.read_after(b(2)).expect("read"), vec![rec(3), rec(4)]);
    }
}

#[test]
fn a_torn_tail_is_cut_and_the_log_goes_on_from_before_it() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        for s in 1..=5 {
            log.append(&rec(s)).expect("append");
        }
        log.sync().expect("sync");
        let last = log.entries.last().copied().expect("entry");
        drop(log);
        // Tear the last record: flip a byte in its pages.
        let path = SegmentLog::segment_path(dir.path(), last.segment);
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open seg");
        f.write_all_at(&[0xee], last.offset + 100).expect("tear");
        let (mut log, r) = open(dir.path(), backend);
        assert_eq!(log.last(), b(4));
        assert!(r.cut_bytes > 0);
        log.append(&rec(5)).expect("append the refetched record");
        log.sync().expect("sync");
        let (log, r) = open(dir.path(), backend);
        assert_eq!((log.last(), r.cut_bytes), (b(5), 0));
    }
}

#[test]
fn records_that_do_not_follow_the_log_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = SegmentLog::open(dir.path(), SEG, b(0)).expect("open");
    log.append(&rec(1)).expect("append");
    assert!(matches!(
        log.append(&rec(3)),
        Err(SegmentError::Discontinuous { .. })
    ));
    assert!(matches!(
        log.append(&Bytes::from_static(b"junk")),
        Err(SegmentError::Record(_))
    ));
}

#[test]
fn a_failed_sync_stops_the_log_until_reopened() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        log.append(&rec(1)).expect("append");
        // A read-only handle in place of the segment: the write fails.
        let (index, _) = log.current.take().expect("current");
        let path = SegmentLog::segment_path(dir.path(), index);
        let file = crate::direct_io::SegFile {
            file: File::open(&path).expect("read-only"),
            direct: None,
        };
        log.current = Some((index, file));
        assert!(matches!(log.sync(), Err(SegmentError::Io { .. })));
        assert_eq!(log.durable(), b(0));
        assert!(matches!(log.sync(), Err(SegmentError::Failed)));
        assert!(matches!(log.append(&rec(2)), Err(SegmentError::Failed)));
        drop(log);
        let (mut log, r) = open(dir.path(), backend);
        assert_eq!(r.records, 0);
        log.append(&rec(1)).expect("append after reopen");
        assert_eq!(log.sync().expect("sync"), b(1));
    }
}

/// `WALRELAY_WRITE_SEGMENT_SEEDS=<dir>` writes fuzz seeds for segment
/// recovery: a clean segment of three records, torn variants, and one a
/// reused segment would hold (two records, then the earlier life's).
#[test]
fn segment_fuzz_seeds_follow_the_format() {
    let Ok(out) = std::env::var("WALRELAY_WRITE_SEGMENT_SEEDS") else {
        return;
    };
    let out = std::path::Path::new(&out);
    std::fs::create_dir_all(out).expect("seed dir");
    let mut clean = Vec::new();
    for s in 1..=3 {
        clean.extend_from_slice(&rec(s));
    }
    std::fs::write(out.join("three_records"), &clean).expect("seed");
    std::fs::write(out.join("torn_last"), &clean[..clean.len() - 7]).expect("seed");
    let mut flipped = clean.clone();
    let at = clean.len() / 2;
    flipped[at] ^= 0x10;
    std::fs::write(out.join("corrupt_middle"), &flipped).expect("seed");
    let mut reused = Vec::new();
    for s in [1, 2, 1, 2] {
        reused.extend_from_slice(&rec(s));
    }
    std::fs::write(out.join("stale_after_end"), &reused).expect("seed");
}

#[test]
fn after_a_failed_sync_a_reopen_keeps_only_what_was_durable_before_it() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        log.append(&rec(1)).expect("append");
        log.append(&rec(2)).expect("append");
        assert_eq!(log.sync().expect("sync"), b(2));
        let end = log.write_offset;
        log.append(&rec(3)).expect("append");
        let (index, _) = log.current.take().expect("current");
        let path = SegmentLog::segment_path(dir.path(), index);
        let file = crate::direct_io::SegFile {
            file: File::open(&path).expect("read-only"),
            direct: None,
        };
        log.current = Some((index, file));
        assert!(log.sync().is_err());
        drop(log);
        // The failed sync's bytes may still have reached the file (the
        // kernel wrote them, then reported the flush failed): the
        // marker left by the failure must win over what the scan finds.
        let f = OpenOptions::new().write(true).open(&path).expect("open");
        f.write_all_at(&rec(3), end).expect("write");
        drop(f);
        let (log, r) = open(dir.path(), backend);
        assert_eq!(log.last(), b(2));
        assert_eq!(log.durable(), b(2));
        assert!(r.cut_bytes > 0);
        assert!(!dir.path().join("poisoned").exists());
    }
}

/// The `.seg.tmp` files in `dir` (segments being built).
fn tmp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("ls")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| prealloc::is_tmp_name(n))
        .collect()
}

/// Waits for the log's spare; its index and its file's inode.
fn ready_spare(log: &mut SegmentLog) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let dir = log.dir.clone();
    let spare = log.spare.as_mut().expect("a spare is being prepared");
    assert!(spare.wait(), "the spare was built");
    let index = spare.index();
    let tmp = prealloc::tmp_path(&SegmentLog::segment_path(&dir, index));
    let meta = std::fs::metadata(&tmp).expect("the spare's file");
    assert_eq!(meta.len(), SEG, "zero-filled to the segment size");
    (index, meta.ino())
}

#[test]
fn a_roll_after_an_eighth_of_the_segment_takes_the_segment_prepared_ahead() {
    use std::os::unix::fs::MetadataExt;
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        assert!(log.spare.is_none(), "nothing written: nothing prepared");
        let r1 = rec(1);
        assert!(r1.len() as u64 * 8 >= SEG, "a record is over an eighth");
        log.append(&r1).expect("append");
        let (index, inode) = ready_spare(&mut log);
        assert_eq!(index, 1, "the next segment");
        log.append(&rec(2)).expect("append");
        log.append(&rec(3)).expect("append");
        log.append(&rec(4)).expect("rolls");
        assert_eq!(log.spares_used(), 1);
        let seg = SegmentLog::segment_path(dir.path(), 1);
        assert_eq!(std::fs::metadata(&seg).expect("seg").ino(), inode);
        // The new segment is already an eighth written: the one after it
        // is on its way, and it is the only temporary file.
        assert_eq!(log.spare.as_ref().map(|s| s.index()), Some(2));
        let tmp = prealloc::tmp_path(&SegmentLog::segment_path(dir.path(), 2));
        let tmp_name = tmp.file_name().and_then(|n| n.to_str()).map(String::from);
        assert!(
            tmp_files(dir.path())
                .iter()
                .all(|n| Some(n) == tmp_name.as_ref()),
            "segment 1's was renamed into place"
        );
        assert_eq!(log.sync().expect("sync"), b(4));
        let data = std::fs::read(&seg).expect("read");
        let r4 = rec(4);
        assert_eq!(data.len() as u64, SEG);
        assert_eq!(&data[..r4.len()], &r4[..]);
        assert!(data[r4.len()..].iter().all(|&x| x == 0), "zeros after it");
        drop(log);
        reopens_whole(dir.path(), backend, 4);
    }
}

#[test]
fn a_record_larger_than_the_spare_still_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path(), IoBackend::Std);
    log.append(&rec(1)).expect("append");
    log.append(&rec(2)).expect("append");
    assert_eq!(ready_spare(&mut log).0, 1);
    let big = big_rec(3, 2);
    assert!(big.len() as u64 > SEG);
    log.append(&big).expect("stored");
    assert_eq!(log.spares_used(), 0, "too small: built inline");
    assert_eq!(log.sizes.get(&1), Some(&(big.len() as u64)));
    // Full at once: the next one (index 2) is prepared, and taken.
    assert_eq!(ready_spare(&mut log).0, 2);
    assert_eq!(tmp_files(dir.path()).len(), 1, "the discarded one is gone");
    let r4 = rec(4);
    log.append(&r4).expect("append");
    assert_eq!(log.spares_used(), 1);
    log.sync().expect("sync");
    drop(log);
    assert!(tmp_files(dir.path()).is_empty());
    let (log, r) = open(dir.path(), IoBackend::Std);
    assert_eq!((r.records, r.cut_bytes), (4, 0));
    assert_eq!(
        log.read_after(b(0)).expect("read"),
        vec![rec(1), rec(2), big, r4]
    );
}

#[test]
fn a_log_dropped_while_its_spare_is_prepared_reopens_clean_with_no_leftover_tmp() {
    // Segments of 4 MiB: the spare is still being written when the log
    // goes (right after the append that started it), which cancels it,
    // waits for it and removes its file.
    const BIG_SEG: u64 = 4 << 20;
    let dir = tempfile::tempdir().expect("tmp");
    let open_big =
        || SegmentLog::open_with(dir.path(), BIG_SEG, b(0), IoBackend::Std).expect("open");
    let (mut log, _) = open_big();
    log.append(&rec(1)).expect("append");
    log.sync().expect("sync");
    let big = big_rec(2, 640);
    log.append(&big).expect("append");
    assert!(log.spare.is_some(), "more than an eighth written");
    drop(log);
    assert!(tmp_files(dir.path()).is_empty(), "dropping removed it");
    let (mut log, r) = open_big();
    assert_eq!((r.records, r.cut_bytes, r.segments_removed), (1, 0, 0));
    log.append(&big).expect("the log goes on");
    log.sync().expect("sync");
    drop(log);
    // What a crash mid-preparation leaves: a short `.seg.tmp`.
    let leftover = prealloc::tmp_path(&SegmentLog::segment_path(dir.path(), 1));
    std::fs::write(&leftover, vec![0u8; 1000]).expect("leftover");
    let (mut log, r) = open_big();
    assert_eq!((r.records, r.cut_bytes, r.segments_removed), (2, 0, 0));
    assert!(tmp_files(dir.path()).is_empty(), "recovery removed it");
    let r3 = rec(3);
    log.append(&r3).expect("the log goes on");
    log.sync().expect("sync");
    assert_eq!(log.read_after(b(0)).expect("read"), vec![rec(1), big, r3]);
}

#[test]
fn cuts_back_to_an_earlier_segment_drop_the_spare_and_the_log_reads_back_whole() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path(), IoBackend::Std);
    for s in 1..=5 {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
    assert_eq!(ready_spare(&mut log).0, 2, "segment 1 is an eighth written");
    // A cut inside the current segment: the next index is still 2.
    log.truncate_after(b(4)).expect("cut");
    assert_eq!(log.spare.as_ref().map(|s| s.index()), Some(2));
    // Back into segment 0: segment 2 no longer comes next.
    log.truncate_after(b(2)).expect("cut");
    assert!(log.spare.is_none());
    assert!(tmp_files(dir.path()).is_empty(), "its file removed");
    let used = log.spares_used();
    for s in 3..=10 {
        log.append(&rec(s)).expect("append");
    }
    assert!(
        log.spares_used() >= used + 2,
        "later rolls take spares again"
    );
    log.sync().expect("sync");
    drop(log);
    assert!(tmp_files(dir.path()).is_empty());
    reopens_whole(dir.path(), IoBackend::Std, 10);
}

#[test]
fn a_release_or_a_reset_with_a_spare_keeps_it_for_the_next_segment() {
    use crate::history::History;
    use crate::record::testing::chain_at;
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) = open(dir.path(), IoBackend::Std);
    for s in 1..=8 {
        log.append(&rec(s)).expect("append");
    }
    log.sync().expect("sync");
    assert_eq!(ready_spare(&mut log).0, 3);
    let released = log.release_through(b(6)).expect("release");
    assert_eq!((released.segments, released.start), (2, b(6)));
    assert_eq!(log.spare.as_ref().map(|s| s.index()), Some(3), "kept");
    let used = log.spares_used();
    for s in 9..=10 {
        log.append(&rec(s)).expect("append");
    }
    assert_eq!(log.spares_used(), used + 1, "the roll to 3 took it");
    log.sync().expect("sync");
    drop(log);
    let (mut log, r) = open(dir.path(), IoBackend::Std);
    assert_eq!(r.records, 4);
    let want: Vec<Bytes> = (7..=10).map(rec).collect();
    assert_eq!(log.read_after(b(6)).expect("read"), want);

    // Reset: the log starts over after a peer's start, at the index after
    // its last segment, which is the one the spare was made for. (With
    // released segments in its pool it would prepare none: emptied.)
    for (path, _) in crate::recycle::list(dir.path()).expect("pool") {
        std::fs::remove_file(path).expect("rm");
    }
    log.append(&rec(11)).expect("append");
    assert_eq!(ready_spare(&mut log).0, 4);
    for s in 12..=30 {
        rec(s); // the chains, for chain_at
    }
    let history = History::from_runs(vec![(Epoch(1), Sequence(30))]).expect("runs");
    log.reset_to(b(30), chain_at(b(30)), history)
        .expect("reset");
    assert_eq!(log.spare.as_ref().map(|s| s.index()), Some(4), "kept");
    let used = log.spares_used();
    let r31 = rec(31);
    log.append(&r31).expect("the peer's next record");
    assert_eq!(log.spares_used(), used + 1);
    log.sync().expect("sync");
    drop(log);
    assert!(tmp_files(dir.path()).is_empty());
    let (log, r) = open(dir.path(), IoBackend::Std);
    assert_eq!((r.records, log.start(), log.last()), (1, b(30), b(31)));
    assert_eq!(log.read_after(b(30)).expect("read"), vec![r31]);
}

#[test]
fn appends_after_a_reopen_mid_block_keep_every_record_before_them() {
    for backend in BACKENDS {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = open(dir.path(), backend);
        log.append(&rec(1)).expect("append");
        assert_eq!(log.sync().expect("sync"), b(1));
        #[cfg(target_os = "linux")]
        if crate::uring::under_ci() {
            assert!(log.direct_io(), "CI's temporary directory takes O_DIRECT");
        }
        assert_ne!(log.write_offset % crate::direct_io::BLOCK, 0);
        drop(log);
        // Reopened with its end inside a block: the next write rewrites
        // that block's first bytes from what the reopen read back.
        let mut log = reopens_whole(dir.path(), backend, 1);
        log.append(&rec(2)).expect("append");
        assert_eq!(log.sync().expect("sync"), b(2));
        drop(log);
        let mut log = reopens_whole(dir.path(), backend, 2);
        for s in 3..=7 {
            log.append(&rec(s)).expect("append");
        }
        assert_eq!(log.sync().expect("sync"), b(7));
        drop(log);
        reopens_whole(dir.path(), backend, 7);
    }
}

#[test]
fn a_batch_larger_than_one_read_piece_reads_back_whole() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mut log, _) =
        SegmentLog::open_with(dir.path(), 4 << 20, b(0), IoBackend::Std).expect("open");
    // 100 records of 5 pages each: about 2 MiB back to back in one
    // segment, read as one run in pieces.
    let want: Vec<Bytes> = (1..=100).map(|s| big_rec(s, 5)).collect();
    for r in &want {
        log.append(r).expect("append");
    }
    log.sync().expect("sync");
    let plan = log.plan_batch(b(0), b(100), usize::MAX).expect("plan");
    assert!(plan.span_bytes() > 4 * (256 << 10), "{}", plan.span_bytes());
    assert_eq!(plan.read().expect("read"), want);
    assert_eq!(plan.read_checked().expect("read checked"), want);
}
