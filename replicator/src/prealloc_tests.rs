//! Tests of `prealloc`: spares, their fill and its pace.

use super::*;

#[test]
fn a_spare_is_taken_only_for_its_index_and_a_size_it_covers() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("0000000000000003.seg");
    let mut spare = Spare::start(&path, 3, 8192).expect("thread");
    assert!(spare.wait(), "built");
    assert_eq!(std::fs::metadata(tmp_path(&path)).expect("tmp").len(), 8192);
    assert!(spare.take(4, 8192).is_none(), "another index");
    assert!(!tmp_path(&path).exists(), "a spare not taken is removed");

    let spare = Spare::start(&path, 3, 8192).expect("thread");
    assert!(spare.take(3, 8193).is_none(), "too small");
    let spare = Spare::start(&path, 3, 8192).expect("thread");
    let (file, size) = spare.take(3, 4096).expect("covers it");
    assert_eq!((file.metadata().expect("meta").len(), size), (8192, 8192));
    assert!(tmp_path(&path).exists(), "taken: left for the rename");
}

#[test]
fn a_segment_is_zeros_to_its_size_whether_or_not_that_is_whole_blocks() {
    let dir = tempfile::tempdir().expect("dir");
    for size in [4096, 3 * CHUNK, 2 * CHUNK + 4096 + 100, 100] {
        let tmp = dir.path().join("0000000000000001.seg.tmp");
        // What a crash left under the temporary name is overwritten.
        std::fs::write(&tmp, vec![0xffu8; 5000]).expect("leftover");
        let file = zero_filled(&tmp, size, None).expect("filled");
        assert_eq!(file.metadata().expect("meta").len(), size);
        let bytes = std::fs::read(&tmp).expect("read");
        assert!(bytes.iter().all(|&b| b == 0), "{size} bytes of zeros");
    }
}

#[test]
fn the_fill_allowance_spreads_over_the_active_segment_from_an_eighth_to_seven_eighths() {
    let (size, active) = (64 << 20, 64 << 20);
    let at = |written| fill_pace(size, written, active);
    let lead_only = Allowance {
        may: PACE_LEAD_BYTES,
        must: 0,
    };
    assert_eq!(at(0), lead_only, "only the lead before it starts");
    assert_eq!(at(8 << 20), lead_only, "only the lead at an eighth");
    let a = at(16 << 20);
    assert!(a.must > 0 && a.must < size, "part of it on the way: {a:?}");
    assert_eq!(a.may, a.must + PACE_LEAD_BYTES, "a lead of two chunks");
    assert!(at(20 << 20).must > a.must, "more as the log grows");
    // About as many zeros as log bytes: 64 MiB over 48 MiB of log.
    let per_log_byte = (at(40 << 20).must - a.must) as f64 / f64::from(24u32 << 20);
    assert!((1.2..1.5).contains(&per_log_byte), "{per_log_byte}");
    assert_eq!(
        at(56 << 20),
        Allowance::all(size),
        "all of it at seven eighths"
    );
    assert_eq!(at(active), Allowance::all(size));
    assert_eq!(
        fill_pace(size, 0, 0),
        Allowance::all(size),
        "no active segment"
    );
}

#[test]
fn a_small_spare_may_be_filled_at_once_and_must_be_once_the_active_segment_is_half_written() {
    let (size, active) = (1 << 20, 512 << 10);
    let at = |written| fill_pace(size, written, active);
    assert_eq!(at(64 << 10), Allowance { may: size, must: 0 });
    assert_eq!(at((256 << 10) - 1), Allowance { may: size, must: 0 });
    assert_eq!(at(256 << 10), Allowance::all(size));
}

#[test]
fn spares_are_staggered_by_part_of_a_chunk_in_whole_blocks_and_never_past_their_size() {
    let dir = tempfile::tempdir().expect("dir");
    let mut staggers = std::collections::HashSet::new();
    for i in 0..8u64 {
        let path = dir.path().join(format!("{i:016x}.seg"));
        let size = 4 << 20;
        let spare = Spare::start_paced(&path, i, size, Allowance::NONE).expect("a spare");
        assert!(spare.stagger < CHUNK);
        assert_eq!(spare.stagger % direct_io::BLOCK, 0);
        staggers.insert(spare.stagger);
        spare.pace(Allowance {
            may: 2 * CHUNK,
            must: CHUNK,
        });
        let (may, must) = (&spare.pace.may, &spare.pace.must);
        assert_eq!(
            must.load(Ordering::Relaxed),
            CHUNK + spare.stagger,
            "staggered"
        );
        assert_eq!(may.load(Ordering::Relaxed), 2 * CHUNK + spare.stagger);
        spare.pace(Allowance::all(size));
        assert_eq!(
            may.load(Ordering::Relaxed),
            size,
            "never past the spare's size"
        );
        assert_eq!(must.load(Ordering::Relaxed), size);
    }
    assert!(staggers.len() > 1, "not all the same: {staggers:?}");
}

/// Appends to `spare`'s log every 200 us, with `allowed`, until `stop`.
fn keep_busy(spare: &Spare, allowed: Allowance, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        spare.pace(allowed);
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Polls until `f` holds or 10 s pass; then whether it holds.
fn within_10_s(f: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// A spare of 4 MiB with no stagger (so chunk bounds are exact) and
/// the bytes it has written so far.
fn unstaggered(dir: &Path) -> (Spare, impl Fn() -> u64) {
    let path = dir.join("0000000000000002.seg");
    let mut spare = Spare::start_paced(&path, 2, 4 << 20, Allowance::NONE).expect("thread");
    spare.stagger = 0;
    // Quiet only after 200 ms: a test thread appending every 200 us
    // keeps the log busy even on a loaded machine.
    spare.pace.quiet_us.store(200_000, Ordering::Relaxed);
    let tmp = tmp_path(&path);
    (spare, move || {
        std::fs::metadata(&tmp).map_or(0, |m| m.len())
    })
}

#[test]
fn a_busy_logs_spare_writes_what_is_due_and_what_is_only_allowed_once_the_log_is_quiet() {
    let dir = tempfile::tempdir().expect("dir");
    let (mut spare, filled) = unstaggered(dir.path());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let allowed = Allowance {
            may: 3 * CHUNK,
            must: CHUNK,
        };
        let (spare, stop) = (&spare, &stop);
        s.spawn(move || keep_busy(spare, allowed, stop));
        assert!(within_10_s(|| filled() >= CHUNK), "what is due is written");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            filled(),
            CHUNK,
            "allowed, not due, and the log busy: held back"
        );
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        within_10_s(|| filled() >= 3 * CHUNK),
        "written once the log is quiet"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(filled(), 3 * CHUNK, "never past what is allowed");
    spare.pace(Allowance::NONE);
    assert!(spare.wait(), "the roll lifts the pace and waits");
    assert_eq!(filled(), 4 << 20);
}

#[test]
fn a_quiet_logs_spare_fills_what_is_allowed_without_waiting_for_it_to_fall_due() {
    let dir = tempfile::tempdir().expect("dir");
    let (spare, filled) = unstaggered(dir.path());
    spare.pace(Allowance {
        may: 4 << 20,
        must: 0,
    });
    assert!(
        within_10_s(|| spare.is_done()),
        "the whole spare, built and synced while the log is quiet"
    );
    assert_eq!(filled(), 4 << 20);
}

#[test]
fn dropping_a_paced_spare_stops_it_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("0000000000000001.seg");
    let spare = Spare::start_paced(&path, 1, 64 << 20, Allowance::NONE).expect("thread");
    let started = std::time::Instant::now();
    drop(spare);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!tmp_path(&path).exists());
}

#[test]
fn dropping_a_spare_mid_way_stops_it_and_leaves_no_file() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("0000000000000001.seg");
    drop(Spare::start(&path, 1, 256 << 20).expect("thread"));
    assert!(!tmp_path(&path).exists());
    let created = create_segment(dir.path(), &path, 1, 4096, None).expect("inline");
    assert!(!created.from_spare);
    assert_eq!(std::fs::metadata(&path).expect("seg").len(), 4096);
}
