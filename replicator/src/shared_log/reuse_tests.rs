//! Segments reused from the pool: a deleted segment's earlier life is
//! never read as this one's, wherever the new life ends, after a crash at
//! any step of the reuse, and in segments written before salts.

use super::crash_tests::{entries, index_of, newest_segment};
use super::tests::{Expect, append, check, config, copy_dir};
use super::*;
use crate::bookmark::Bookmark;

const SEGMENT: u64 = 16 << 10;

/// Entries of one size, so that a reused segment's new life ends exactly
/// where one of its earlier life's entries began.
const RECORD: usize = 300;

/// A log whose databases 1 and 2 wrote `records` each, then released
/// all but the last 5 of them: the released segments are in the pool.
fn released_log(dir: &Path, records: u8) -> (Arc<SharedLog>, Vec<Expect>) {
    let (log, _) = SharedLog::open(dir, config(SEGMENT, 64)).expect("open");
    let mut expect = vec![Expect::default(); 3];
    for i in 0..records {
        for id in 1..=2 {
            append(&log, DatabaseId(id), &mut expect[id as usize], i, RECORD);
        }
        log.sync().expect("sync");
    }
    for (id, e) in expect.iter_mut().enumerate().skip(1) {
        release_all_but(&log, e, id as u64, 5);
    }
    assert_eq!(pool(dir).len(), recycle::MAX_FREE, "the pool is full");
    (log, expect)
}

/// Releases database `id` through all but its last `keep` records.
fn release_all_but(log: &Arc<SharedLog>, e: &mut Expect, id: u64, keep: usize) {
    let released = e.records.len() - keep;
    let last = &e.records[released - 1];
    let upto = last.bookmark;
    e.start = upto;
    e.start_chain = Some(last.chain);
    e.records.drain(..released);
    log.database(DatabaseId(id))
        .release_through(upto)
        .expect("release");
}

/// The pool's files.
fn pool(dir: &Path) -> Vec<PathBuf> {
    recycle::list(dir)
        .expect("list")
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

fn header(path: &Path) -> format::SegmentHeader {
    let data = std::fs::read(path).expect("read");
    match format::segment_start(&data, index_of(path)) {
        format::Start::Salted(h) => h,
        other => panic!("not a salted segment: {other:?}"),
    }
}

/// Appends to database 1 until the log has reused a pool file, then
/// `more` records.
fn roll_into_the_pool(log: &Arc<SharedLog>, e: &mut Expect, more: usize) {
    let mut n = 0u8;
    while log.stats().segments_reused == 0 {
        append(log, DatabaseId(1), e, n, RECORD);
        log.sync().expect("sync");
        n = n.wrapping_add(1);
    }
    for _ in 0..more {
        append(log, DatabaseId(1), e, n, RECORD);
        log.sync().expect("sync");
        n = n.wrapping_add(1);
    }
}

fn check_all(log: &Arc<SharedLog>, expect: &[Expect]) {
    for (id, e) in expect.iter().enumerate().skip(1) {
        check(log, DatabaseId(id as u64), e);
    }
}

#[test]
fn a_deleted_segment_of_the_full_size_goes_to_the_pool_and_the_next_roll_reuses_it() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, mut expect) = released_log(dir.path(), 60);
    // (A spare built before the pool filled is still taken first.)
    roll_into_the_pool(&log, &mut expect[1], 0);
    let spares = log.stats().spares_used;
    assert_eq!(pool(dir.path()).len(), 1, "one taken");
    let mut n = 0;
    while log.stats().segments_reused < 2 {
        append(&log, DatabaseId(1), &mut expect[1], n, RECORD);
        log.sync().expect("sync");
        n += 1;
        assert!(n < 100, "the next roll came");
    }
    let stats = log.stats();
    assert_eq!(
        stats.spares_used, spares,
        "no spare built while the pool could serve the roll: {stats:?}"
    );
    assert!(pool(dir.path()).is_empty(), "both taken");
    check_all(&log, &expect);
    drop(log);
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert_eq!((rec.cut_bytes, rec.damaged_bytes, rec.unchained), (0, 0, 0));
    check_all(&log, &expect);
}

#[test]
fn a_reused_segments_earlier_life_is_never_read_wherever_the_new_life_ends() {
    for more in [0, 1, 2, 3, 7, 12] {
        let dir = tempfile::tempdir().expect("dir");
        let (log, mut expect) = released_log(dir.path(), 60);
        drop(log);
        let (log, before) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
        let appended = expect[1].records.len();
        roll_into_the_pool(&log, &mut expect[1], more);
        let appended = expect[1].records.len() - appended;
        let newest = newest_segment(dir.path());
        assert!(header(&newest).reused, "more {more}: the newest is reused");
        // Its entries are this life's, and only these, though every
        // entry of its earlier life is of the same size and one begins
        // exactly where this life ends.
        assert_eq!(entries(&newest).len(), more + 1, "more {more}");
        drop(log);
        let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
        assert_eq!(
            rec.entries,
            before.entries + appended,
            "more {more}: {rec:?}"
        );
        assert_eq!(
            (
                rec.cut_bytes,
                rec.damaged_bytes,
                rec.unchained,
                rec.stale_segments
            ),
            (0, 0, 0, 0),
            "more {more}: {rec:?}"
        );
        assert!(rec.rolls_at_open, "more {more}: stale bytes past its end");
        check_all(&log, &expect);
        // Appends go on in a new segment, and everything survives again.
        append(&log, DatabaseId(2), &mut expect[2], 200, RECORD);
        log.sync().expect("sync");
        assert_ne!(newest_segment(dir.path()), newest, "more {more}");
        drop(log);
        let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
        assert_eq!((rec.cut_bytes, rec.damaged_bytes), (0, 0), "{rec:?}");
        check_all(&log, &expect);
    }
}

#[test]
fn a_reuse_whose_new_header_never_reached_the_disk_reads_as_stale() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, mut expect) = released_log(dir.path(), 60);
    let before: Vec<(PathBuf, Vec<u8>)> = pool(dir.path())
        .into_iter()
        .map(|p| {
            let image = std::fs::read(&p).expect("pool file");
            (p, image)
        })
        .collect();
    let acked = expect.clone();
    roll_into_the_pool(&log, &mut expect[1], 3);
    drop(log);
    // The crash came after the rename, before the new life's first write
    // landed: the file holds its earlier life whole. Its records since
    // the roll were never acked.
    let (_, old_image) = before
        .iter()
        .find(|(p, _)| !p.exists())
        .expect("the pool file the roll took");
    let newest = newest_segment(dir.path());
    std::fs::write(&newest, old_image).expect("crash image");
    let mut acked = acked;
    let rolled = expect[1].records.len() - 4;
    acked[1].records = expect[1].records[..rolled].to_vec();
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert_eq!(rec.stale_segments, 1, "{rec:?}");
    assert_eq!((rec.cut_bytes, rec.damaged_bytes, rec.unchained), (0, 0, 0));
    assert!(rec.rolls_at_open);
    check_all(&log, &acked);
    // Nothing of the stale segment is live: the next maintenance deletes
    // it, and nothing of it ever comes back.
    let mut e = acked[1].clone();
    append(&log, DatabaseId(1), &mut e, 9, RECORD);
    log.sync().expect("sync");
    log.maintain().expect("maintain");
    assert!(!newest.exists(), "the stale segment left the log");
    drop(log);
    let (log, _) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    acked[1] = e;
    check_all(&log, &acked);
}

#[test]
fn torn_unacked_entries_in_a_reused_newest_segment_lose_nothing_acked_across_reopens() {
    let dir = tempfile::tempdir().expect("dir");
    let live = dir.path().join("log");
    let (log, mut expect) = released_log(&live, 60);
    roll_into_the_pool(&log, &mut expect[1], 2);
    let acked = expect.clone();
    // Two more entries, never acked in the crash images below.
    append(&log, DatabaseId(2), &mut expect[2], 90, RECORD);
    append(&log, DatabaseId(2), &mut expect[2], 91, RECORD);
    log.sync().expect("sync");
    drop(log);
    let newest = newest_segment(&live);
    assert!(header(&newest).reused);
    let es = entries(&newest);
    let ((first, first_len), (second, second_len)) = (es[es.len() - 2], es[es.len() - 1]);
    let image = std::fs::read(&newest).expect("image");
    let name = newest.file_name().expect("name").to_owned();
    for torn_with in [0u8, 0xA5] {
        for k in (0..first_len).step_by(37) {
            // The first torn from byte k; the second landed whole (writes
            // need not land in order) or not at all.
            for second_landed in [true, false] {
                let mut torn = image.clone();
                torn[first + k..first + first_len].fill(torn_with);
                if torn[first..first + first_len] == image[first..first + first_len] {
                    continue; // already those bytes (a salted CRC, by chance): not torn
                }
                if !second_landed {
                    torn[second..second + second_len].fill(0);
                }
                let case = dir
                    .path()
                    .join(format!("case-{torn_with}-{k}-{second_landed}"));
                copy_dir(&live, &case);
                std::fs::write(case.join(&name), &torn).expect("crash image");
                let what = format!("torn with {torn_with} from {k}, second {second_landed}");
                let (log, rec) = SharedLog::open(&case, config(SEGMENT, 64)).expect("recovers");
                assert_eq!(rec.unchained, 0, "{what}: {rec:?}");
                check_all(&log, &acked);
                drop(log);
                // Reopened again, then written to and reopened: the same.
                let (log, _) = SharedLog::open(&case, config(SEGMENT, 64)).expect("reopen");
                check_all(&log, &acked);
                let mut more = acked.clone();
                append(&log, DatabaseId(1), &mut more[1], 7, RECORD);
                log.sync().expect("sync");
                drop(log);
                let (log, rec) = SharedLog::open(&case, config(SEGMENT, 64)).expect("reopen");
                assert_eq!(rec.unchained, 0, "{what}: {rec:?}");
                check_all(&log, &more);
                std::fs::remove_dir_all(&case).expect("clean");
            }
        }
    }
}

#[test]
fn an_index_taken_again_after_a_restart_never_shows_an_earlier_life() {
    // A stale newest segment (its reuse's header never landed) is deleted
    // while the pool is full, so it is unlinked; after a restart the next
    // roll may take its index again, from a pool file whose header names
    // a lower index.
    let dir = tempfile::tempdir().expect("dir");
    let (log, mut expect) = released_log(dir.path(), 60);
    let before: Vec<(PathBuf, Vec<u8>)> = pool(dir.path())
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).expect("pool file")))
        .collect();
    let acked = expect.clone();
    roll_into_the_pool(&log, &mut expect[1], 3);
    drop(log);
    let (taken, old_image) = before.iter().find(|(p, _)| !p.exists()).expect("taken");
    let newest = newest_segment(dir.path());
    std::fs::write(&newest, old_image).expect("crash image");
    std::fs::write(taken, vec![0u8; SEGMENT as usize]).expect("a full pool");
    let mut acked = acked;
    let rolled = expect[1].records.len() - 4;
    acked[1].records = expect[1].records[..rolled].to_vec();
    {
        let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("open");
        assert_eq!(rec.stale_segments, 1, "{rec:?}");
        log.maintain().expect("maintain");
        assert!(!newest.exists(), "the stale newest segment was deleted");
    }
    for reopen in 0..3 {
        let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
        assert_eq!((rec.unchained, rec.damaged_bytes), (0, 0), "{rec:?}");
        check_all(&log, &acked);
        append(&log, DatabaseId(1), &mut acked[1], reopen, RECORD);
        log.sync().expect("sync");
        let now = newest_segment(dir.path());
        assert!(header(&now).index == index_of(&now), "reopen {reopen}");
    }
    let (log, _) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    check_all(&log, &acked);
}

#[test]
fn a_header_that_does_not_check_counts_as_damage_and_its_records_are_fetched_again() {
    let dir = tempfile::tempdir().expect("dir");
    let mut e = Expect::default();
    {
        let (log, _) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("open");
        for i in 0..60u8 {
            append(&log, DatabaseId(1), &mut e, i, RECORD);
            log.sync().expect("sync");
        }
    }
    let first = segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&first).expect("read");
    bytes[40] ^= 0x01; // inside the header's salt
    std::fs::write(&first, &bytes).expect("damage");
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert!(rec.damaged_bytes > 0, "{rec:?}");
    assert_eq!(rec.stale_segments, 0, "damage, not an earlier life");
    assert!(rec.unchained > 0, "the later records no longer chain");
    assert_eq!(log.database(DatabaseId(1)).last(), Bookmark::ZERO);
}

#[test]
fn what_a_failed_sync_wrote_into_a_reused_segment_is_cut_for_good() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, mut expect) = released_log(dir.path(), 60);
    roll_into_the_pool(&log, &mut expect[1], 2);
    let acked = expect.clone();
    append(&log, DatabaseId(2), &mut expect[2], 99, RECORD);
    log.sync().expect("sync");
    drop(log);
    let newest = newest_segment(dir.path());
    assert!(header(&newest).reused);
    let (off, _) = *entries(&newest).last().expect("an entry");
    let index = header(&newest).index;
    poison::store(dir.path(), (index, off as u64)).expect("poison");
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert!(rec.cut_bytes > 0, "{rec:?}");
    assert!(!rec.rolls_at_open, "only zeros past the cut");
    check_all(&log, &acked);
    drop(log);
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert_eq!(rec.cut_bytes, 0);
    check_all(&log, &acked);
}

/// Rewrites every segment in `dir` as segments were written before
/// salts: version 1 entries from offset 0, no header.
fn to_legacy(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("list").flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "seg") {
            continue;
        }
        let data = std::fs::read(&path).expect("read");
        let seal = header(&path).seal();
        let mut out = Vec::new();
        for (at, len) in entries(&path) {
            let f = format::decode(&data[at..at + len], seal).expect("entry");
            format::encode(&mut out, f.kind, f.database, f.lsn, f.payload, Seal::Legacy);
        }
        out.resize(data.len(), 0);
        std::fs::write(&path, out).expect("legacy image");
    }
}

#[test]
fn segments_written_before_salts_are_read_appended_after_and_never_reused() {
    let dir = tempfile::tempdir().expect("dir");
    let mut expect = vec![Expect::default(); 3];
    {
        let (log, _) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("open");
        for i in 0..40u8 {
            append(&log, DatabaseId(1), &mut expect[1], i, RECORD);
            append(&log, DatabaseId(2), &mut expect[2], i, RECORD);
            log.sync().expect("sync");
        }
    }
    to_legacy(dir.path());
    let legacy = newest_segment(dir.path());
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert_eq!((rec.cut_bytes, rec.damaged_bytes, rec.unchained), (0, 0, 0));
    assert!(rec.rolls_at_open, "no appends to an unsalted segment");
    check_all(&log, &expect);
    for i in 0..40u8 {
        append(&log, DatabaseId(1), &mut expect[1], i, RECORD);
        log.sync().expect("sync");
    }
    assert!(newest_segment(dir.path()) > legacy);
    // Release everything the legacy segments hold: they are deleted, not
    // pooled.
    // Database 2 lives only in the legacy segments: all of it.
    for (id, e) in expect.iter_mut().enumerate().skip(1) {
        release_all_but(&log, e, id as u64, usize::from(id == 1));
    }
    log.maintain().expect("maintain");
    assert!(!legacy.exists(), "released");
    let legacy_index = index_of(&legacy);
    assert!(
        pool(dir.path())
            .iter()
            .all(|p| recycle::index_of(p).is_some_and(|i| i > legacy_index)),
        "no legacy segment in the pool: {:?}",
        pool(dir.path())
    );
    drop(log);
    let (log, _) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    check_all(&log, &expect);
}

#[test]
fn the_pool_is_trimmed_at_open_and_no_new_segment_takes_a_pool_files_index() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path()).expect("dir");
    let file = |i: u64, len: u64| {
        std::fs::File::create(recycle::free_path(dir.path(), i))
            .and_then(|f| f.set_len(len))
            .expect("pool file");
    };
    for i in 4..=7 {
        file(i, SEGMENT);
    }
    file(9, SEGMENT / 2);
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("open");
    assert_eq!(rec, SharedRecovery::default());
    assert_eq!(
        pool(dir.path()),
        vec![
            recycle::free_path(dir.path(), 6),
            recycle::free_path(dir.path(), 7)
        ],
        "the newest of the right size, at most two"
    );
    let mut e = Expect::default();
    append(&log, DatabaseId(1), &mut e, 1, RECORD);
    log.sync().expect("sync");
    assert_eq!(log.stats().segments_reused, 1);
    let newest = newest_segment(dir.path());
    assert_eq!(index_of(&newest), 8, "above every pool file's index");
    assert_eq!(header(&newest).index, 8);
    assert!(header(&newest).reused);
    drop(log);
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("reopen");
    assert_eq!((rec.cut_bytes, rec.stale_segments), (0, 0));
    check(&log, DatabaseId(1), &e);
}

/// Segment `index` as a crash could leave it, made by hand: its header
/// (reused) and three records of database 1; right after them, with no
/// zeros between (the log's own writes pad their last block with zeros,
/// which would hide the case; a reuse must not depend on that), an
/// earlier life's entries: a database 7 from its first record on, and a
/// reset of database 1 that would drop everything above. Returns the
/// image and what database 1 holds.
fn earlier_life_image(index: u64) -> (Vec<u8>, Expect) {
    let new = format::SegmentHeader::new(index, true);
    let old = format::SegmentHeader::new(index + 1000, false);
    let mut image = new.encode();
    let mut this = Expect::default();
    for i in 0..3u8 {
        let r = tests::next(this.end(), 1, i, RECORD);
        format::encode(
            &mut image,
            Kind::Record,
            DatabaseId(1),
            u64::from(i),
            &r.bytes,
            new.seal(),
        );
        this.records.push(r);
    }
    let mut earlier = Expect::default();
    for i in 0..3u8 {
        let r = tests::next(earlier.end(), 1, i, RECORD);
        format::encode(
            &mut image,
            Kind::Record,
            DatabaseId(7),
            100 + u64::from(i),
            &r.bytes,
            old.seal(),
        );
        earlier.records.push(r);
    }
    let base = format::Base {
        start: crate::bookmark::Bookmark::ZERO,
        chain: crate::chain::ChainHash::GENESIS,
        history: crate::history::History::new(),
    };
    format::encode(
        &mut image,
        Kind::Reset,
        DatabaseId(1),
        200,
        &format::base_payload(&base),
        old.seal(),
    );
    (image, this)
}

#[test]
fn an_earlier_lifes_entries_right_after_this_lifes_end_are_never_read() {
    let dir = tempfile::tempdir().expect("dir");
    let (mut image, this) = earlier_life_image(5);
    image.resize(SEGMENT as usize, 0);
    std::fs::write(segment_path(dir.path(), 5), &image).expect("segment");
    let (log, rec) = SharedLog::open(dir.path(), config(SEGMENT, 64)).expect("open");
    assert_eq!(rec.entries, 3, "{rec:?}");
    assert_eq!((rec.cut_bytes, rec.damaged_bytes, rec.unchained), (0, 0, 0));
    assert!(rec.rolls_at_open);
    assert!(!log.holds(DatabaseId(7)), "no database of an earlier life");
    check(&log, DatabaseId(1), &this);
    assert_eq!(SharedLog::inspect(dir.path()).expect("inspect").len(), 1);
}

/// `WALRELAY_WRITE_SHARED_LOG_SEEDS=<dir>` writes fuzz seeds for the
/// shared log's recovery (segment 0, as the target reads it): the image
/// above, and a log the shared log wrote itself (two databases, a cut, a
/// release) with its salted header.
#[test]
fn shared_log_fuzz_seeds_follow_the_format() {
    let Ok(out) = std::env::var("WALRELAY_WRITE_SHARED_LOG_SEEDS") else {
        return;
    };
    let out = Path::new(&out);
    std::fs::create_dir_all(out).expect("seed dir");
    std::fs::write(out.join("earlier_life_after_end"), earlier_life_image(0).0).expect("seed");
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(64 << 10, 4)).expect("open");
    let mut expect = vec![Expect::default(); 3];
    for i in 0..3u8 {
        for id in 1..=2 {
            append(&log, DatabaseId(id), &mut expect[id as usize], i, RECORD);
        }
    }
    log.sync().expect("sync");
    log.database(DatabaseId(1))
        .truncate_after(expect[1].records[1].bookmark)
        .expect("cut");
    log.database(DatabaseId(2))
        .release_through(expect[2].records[0].bookmark)
        .expect("release");
    drop(log);
    let data = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
    let end = data.iter().rposition(|b| *b != 0).map_or(0, |l| l + 1);
    std::fs::write(
        out.join("salted_two_databases_cut_and_release"),
        &data[..end],
    )
    .expect("seed");
}
