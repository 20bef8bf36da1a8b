//! The archive end to end against every store: the filesystem, memory,
//! and a local S3 emulator (moto_server; under `CI=true` a missing
//! emulator fails these tests instead of skipping it).

use anyhow::Result;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use walrelay_archive::Source as _;
use walrelay_archive::testing::{MemSource, Workload};
use walrelay_archive::{
    Archive, Archiver, ArchiverConfig, Flush, NoProgress, Progress, RestoreError, Store, names,
    restore_to_file,
};
use walrelay_replicator::{Bookmark, DatabaseId, Epoch, Sequence};

const DB: DatabaseId = DatabaseId(0x2a);

/// Runs `f` once per store kind, each on a fresh store.
fn each_store(name: &str, f: impl Fn(&Store, &Path) -> Result<()>) {
    let dir = tempfile::tempdir().unwrap();
    walrelay_archive::testing::each_store(name, dir.path(), true, |kind, store| {
        f(store, dir.path()).unwrap_or_else(|e| panic!("{kind} store: {e:#}"))
    });
}

fn config(work: &Path) -> ArchiverConfig {
    let mut c = ArchiverConfig::new(DB, work.join("work"));
    c.max_lag_ms = 0;
    c.max_lag_bytes = 0;
    c.object_bytes = 64 << 10;
    c.snapshot_log_bytes = 96 << 10;
    c.local_keep_bytes = 0;
    c
}

/// `n` transactions into `source`, all confirmed.
fn run(w: &mut Workload, source: &MemSource, n: usize) {
    for _ in 0..n {
        for r in w.transaction(12, 5) {
            source.push(r);
        }
    }
    source.confirm(w.at());
}

/// A restored database's bytes (shown by length and digest).
#[derive(PartialEq)]
struct Db(Vec<u8>);

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Db({} bytes, {})", self.0.len(), blake3::hash(&self.0))
    }
}

fn restore(store: &Store, at: Bookmark, out: &Path) -> Result<Db, RestoreError> {
    walrelay_archive::testing::restored(store, DB, at, out).map(Db)
}

#[test]
fn a_restore_at_random_archived_bookmarks_equals_the_shadow_copy() {
    each_store("random", |store, dir| {
        for seed in seeds() {
            let mut w = Workload::new(seed, 1024);
            let source = MemSource::new(Epoch(1));
            let mut up = Archiver::new(store.clone(), config(&dir.join(seed.to_string())));
            let db = DatabaseId(seed);
            let _ = db;
            for round in 0..6 {
                if round == 3 {
                    w.new_epoch(Epoch(2));
                    source.set_epoch(Epoch(2));
                }
                run(&mut w, &source, 15);
                up.round(&source, Flush::No)?;
            }
            let m = Archive::new(store.clone(), DB).manifest()?;
            assert_eq!(
                m.log_end,
                w.at(),
                "seed {seed}: everything confirmed is archived"
            );
            assert!(m.snapshots.len() >= 2, "seed {seed}: snapshots were cut");
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let points: Vec<Bookmark> = w.shadows.keys().copied().collect();
            for _ in 0..12 {
                let at = points[rng.random_range(0..points.len())];
                let got = restore(store, at, &dir.join("out.db"))?;
                assert_eq!(
                    got,
                    Db(w.shadows[&at].clone()),
                    "seed {seed}: restore at {at}"
                );
            }
            let got = restore(store, w.at(), &dir.join("out.db"))?;
            assert_eq!(
                got,
                Db(w.shadows[&w.at()].clone()),
                "seed {seed}: the newest bookmark"
            );
            // A fresh store per seed: wipe by using a new database id next
            // time would hide cross-talk; instead reset the store's keys.
            wipe(store)?;
        }
        Ok(())
    });
}

#[test]
fn a_stopping_archiver_starts_no_snapshot_and_its_last_round_uploads_the_log_until_its_deadline() {
    each_store("stopping", |store, dir| {
        let mut w = Workload::new(11, 1024);
        let source = MemSource::new(Epoch(1));
        let mut up = Archiver::new(store.clone(), config(dir));
        run(&mut w, &source, 40);
        up.stopping_flag().store(true, Ordering::Relaxed);
        let r = up.round(&source, Flush::All)?;
        assert_eq!(
            (r.objects, r.snapshot),
            (0, None),
            "a stopping archiver leaves the log to its last round and takes no snapshot"
        );
        let past = Flush::Stop {
            deadline: Instant::now(),
        };
        assert_eq!(
            up.round(&source, past)?.objects,
            0,
            "no time left, no upload"
        );
        let in_time = Flush::Stop {
            deadline: Instant::now() + Duration::from_secs(600),
        };
        let r = up.round(&source, in_time)?;
        assert!(r.objects > 0);
        assert_eq!(r.snapshot, None, "the last round takes no snapshot");
        let m = Archive::new(store.clone(), DB).manifest()?;
        assert_eq!(m.log_end, w.at(), "in its time, everything confirmed");
        assert!(m.snapshots.is_empty());
        // Nothing was lost: the next start snapshots as usual and the
        // store restores the newest bookmark.
        let mut again = Archiver::new(store.clone(), config(dir));
        assert!(again.round(&source, Flush::All)?.snapshot.is_some());
        let got = restore(store, w.at(), &dir.join("out.db"))?;
        assert_eq!(got, Db(w.shadows[&w.at()].clone()));
        Ok(())
    });
}

/// Asks every restore to stop at once.
struct Abandoning;
impl Progress for Abandoning {
    fn abandoned(&self) -> bool {
        true
    }
}

#[test]
fn an_abandoned_restore_ends_with_a_typed_error_and_leaves_no_file() {
    each_store("abandoned", |store, dir| {
        let mut w = Workload::new(12, 1024);
        let source = MemSource::new(Epoch(1));
        let mut up = Archiver::new(store.clone(), config(dir));
        run(&mut w, &source, 20);
        up.round(&source, Flush::All)?;
        run(&mut w, &source, 5);
        up.round(&source, Flush::Log)?;
        let a = Archive::new(store.clone(), DB);
        let m = a.manifest()?;
        let out = dir.join("abandoned.db");
        let e = restore_to_file(&a, &m, w.at(), &out, &Abandoning);
        assert!(matches!(e, Err(RestoreError::Abandoned)), "{e:?}");
        assert!(!out.exists(), "no database file");
        assert!(
            !dir.join("abandoned.db.restoring").exists(),
            "no half-built file"
        );
        Ok(())
    });
}

fn seeds() -> Vec<u64> {
    let mut s = vec![1, 2, 3];
    if let Ok(extra) = std::env::var("WALRELAY_ARCHIVE_SEEDS") {
        s.extend(extra.split(',').filter_map(|x| x.parse::<u64>().ok()));
    } else {
        s.push(rand::rng().random_range(100..1_000_000));
    }
    eprintln!("seeds {s:?} (WALRELAY_ARCHIVE_SEEDS=a,b adds more)");
    s
}

fn wipe(store: &Store) -> Result<()> {
    for l in store.list(&names::database_prefix(DB), None)? {
        store.delete(&l.key)?;
    }
    Ok(())
}

#[test]
fn a_time_names_the_last_transaction_committed_by_then() {
    each_store("time", |store, dir| {
        let mut w = Workload::new(7, 512);
        let source = MemSource::new(Epoch(1));
        let mut up = Archiver::new(store.clone(), config(dir));
        run(&mut w, &source, 40);
        up.round(&source, Flush::No)?;
        let a = Archive::new(store.clone(), DB);
        let m = a.manifest()?;
        for (&b, &t) in w.times.iter().step_by(3) {
            assert_eq!(a.bookmark_at_time(&m, t)?, b, "exactly at its commit time");
            assert_eq!(a.bookmark_at_time(&m, t + 999)?, b, "just after it");
        }
        let first = *w.times.values().next().unwrap();
        assert_eq!(a.bookmark_at_time(&m, first - 1)?, Bookmark::ZERO);
        assert_eq!(a.bookmark_at_time(&m, u64::MAX)?, w.at());
        Ok(())
    });
}

#[test]
fn a_round_that_is_not_due_reads_only_the_first_unarchived_record_once() {
    each_store("tail", |store, dir| {
        let mut w = Workload::new(11, 512);
        let source = MemSource::new(Epoch(1));
        let mut c = config(dir);
        c.max_lag_ms = u64::MAX / 4; // never due by age
        c.max_lag_bytes = 1 << 20;
        let mut up = Archiver::new(store.clone(), c);
        assert_eq!(up.round(&source, Flush::No)?.objects, 0, "nothing to do");
        assert_eq!(source.bytes_read(), 0, "an empty log reads nothing");
        run(&mut w, &source, 20);
        assert_eq!(up.round(&source, Flush::No)?.objects, 0, "not due yet");
        let first = source.bytes_read();
        assert!(first > 0, "the first record is read for its age");
        assert!(first < source.disk_bytes(), "and only it");
        for _ in 0..4 {
            run(&mut w, &source, 20);
            assert_eq!(up.round(&source, Flush::No)?.objects, 0, "not due yet");
            assert_eq!(source.bytes_read(), first, "the tail's size is not read");
        }
        // Past the size threshold (known from the index) it uploads, and
        // reads the next tail's first record after.
        while source.disk_bytes() < 1 << 20 {
            run(&mut w, &source, 20);
        }
        assert!(up.round(&source, Flush::No)?.objects > 0);
        Ok(())
    });
}

#[test]
fn bookmarks_not_archived_inside_a_transaction_or_outside_history_are_refused() {
    each_store("refused", |store, dir| {
        let mut w = Workload::new(9, 512);
        let source = MemSource::new(Epoch(1));
        let mut up = Archiver::new(store.clone(), config(dir));
        // Transactions of several chunks each.
        for _ in 0..5 {
            for r in w.transaction(12, 2) {
                source.push(r);
            }
        }
        source.confirm(w.at());
        up.round(&source, Flush::No)?;
        let out = dir.join("x.db");
        let end = w.at();
        let later = Bookmark::new(end.epoch, Sequence(end.sequence.0 + 1));
        let e = restore(store, later, &out);
        assert!(matches!(e, Err(RestoreError::NotArchived { .. })), "{e:?}");
        let other_epoch = Bookmark::new(Epoch(9), Sequence(1));
        assert!(matches!(
            restore(store, other_epoch, &out),
            Err(RestoreError::NotArchived { .. })
        ));
        let first_txn = *w.shadows.keys().nth(1).unwrap();
        // Some chunk before the first transaction's end is mid-transaction.
        if first_txn.sequence.0 > 1 {
            let mid = Bookmark::new(first_txn.epoch, Sequence(1));
            assert!(matches!(
                restore(store, mid, &out),
                Err(RestoreError::NotInHistory { .. })
            ));
        }
        assert!(!out.exists(), "a refused restore leaves no file");
        Ok(())
    });
}

#[test]
fn a_corrupt_missing_or_foreign_object_is_a_clear_error_never_a_wrong_restore() {
    each_store("damage", |store, dir| {
        let mut w = Workload::new(11, 1024);
        let source = MemSource::new(Epoch(1));
        // Snapshots only when forced: the restore of `end` below needs the
        // log after the first one.
        let mut c = config(dir);
        c.snapshot_log_bytes = u64::MAX / 8;
        c.snapshot_every_ms = u64::MAX / 8;
        let mut up = Archiver::new(store.clone(), c);
        run(&mut w, &source, 30);
        up.round(&source, Flush::All)?;
        let out = dir.join("d.db");
        let m = Archive::new(store.clone(), DB).manifest()?;
        let snap = *m.snapshots.last().unwrap();
        let part = names::snapshot_part_key(DB, snap.bookmark, snap.generation, 0);
        run(&mut w, &source, 5);
        up.round(&source, Flush::No)?;
        let end = w.at();
        let logs: Vec<_> = store.list(&names::log_prefix(DB), None)?;
        // Damage a log object the restore of `end` needs: one after the
        // newest snapshot.
        let victim = logs
            .iter()
            .find(|l| names::parse_log_key(DB, &l.key).unwrap().previous >= snap.bookmark)
            .expect("a log object after the snapshot")
            .key
            .clone();
        let good = store.get(&victim)?.unwrap();
        let mut bad = good.to_vec();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        store.delete(&victim)?;
        store.create(&victim, bad.into())?;
        let e = restore(store, end, &out).unwrap_err();
        assert!(
            matches!(
                e,
                RestoreError::Format { .. } | RestoreError::Diverged { .. }
            ),
            "corrupt log object: {e}"
        );
        store.delete(&victim)?;
        let e = restore(store, end, &out).unwrap_err();
        assert!(
            matches!(e, RestoreError::Gap { .. }),
            "missing log object: {e}"
        );
        store.create(&victim, good)?;
        restore(store, end, &out)?;
        // A missing snapshot part.
        let held = store.get(&part)?.unwrap();
        store.delete(&part)?;
        let e = restore(store, snap.bookmark, &out).unwrap_err();
        assert!(
            matches!(e, RestoreError::Missing { .. }),
            "missing part: {e}"
        );
        store.create(&part, held)?;
        // A log object of a fenced or diverged writer in place of the
        // real first one: same start, another history.
        let first = victim.clone();
        let real = store.get(&first)?.unwrap();
        let mut rogue = Workload::new(99, 1024);
        let records: Vec<_> = (0..3).flat_map(|_| rogue.transaction(4, 4)).collect();
        // Re-anchored where the real object starts, with its own chain.
        let records = reanchor(records, names::parse_log_key(DB, &first).unwrap().previous);
        let obj = walrelay_archive::log_object::LogObject::new(DB, records)?;
        store.create(
            &names::log_key(DB, &obj.name(Epoch(1))),
            obj.encode()?.into(),
        )?;
        store.delete(&first)?;
        let e = restore(store, end, &out).unwrap_err();
        assert!(
            matches!(e, RestoreError::Diverged { .. } | RestoreError::Gap { .. }),
            "a diverged object: {e}"
        );
        store.create(&first, real)?;
        assert_eq!(restore(store, end, &out)?, Db(w.shadows[&end].clone()));
        assert!(!out.with_extension("db.restoring").exists());
        Ok(())
    });
}

/// Rewrites records to follow `at` (with a chain of their own).
fn reanchor(
    records: Vec<walrelay_replicator::Encoded>,
    at: Bookmark,
) -> Vec<walrelay_replicator::Encoded> {
    let mut previous = at;
    let mut chain = walrelay_replicator::ChainHash::from_bytes([0xee; 16]);
    let mut out = Vec::new();
    for (i, e) in records.into_iter().enumerate() {
        let mut r = e.record().unwrap();
        r.previous = previous;
        r.prev_chain = chain;
        r.bookmark = Bookmark::new(at.epoch, Sequence(at.sequence.0 + 1 + i as u64));
        let e2 = r.to_encoded_chunk(e.continued()).unwrap();
        previous = e2.bookmark;
        chain = e2.chain;
        out.push(e2);
    }
    out
}

#[test]
fn an_uploader_of_an_older_epoch_is_fenced_and_writes_nothing() {
    each_store("fenced", |store, dir| {
        let mut w = Workload::new(13, 512);
        let new = MemSource::new(Epoch(3));
        let old = MemSource::new(Epoch(2));
        let mut a = Archiver::new(store.clone(), config(&dir.join("a")));
        let mut b = Archiver::new(store.clone(), config(&dir.join("b")));
        run(&mut w, &new, 5);
        a.round(&new, Flush::No)?;
        for r in w.transaction(4, 4) {
            old.push(r);
        }
        let before = store.list(&names::database_prefix(DB), None)?;
        let report = b.round(&old, Flush::No)?;
        assert!(report.fenced);
        assert_eq!(store.list(&names::database_prefix(DB), None)?, before);
        Ok(())
    });
}

#[test]
fn two_uploaders_racing_write_identical_objects_and_one_history() {
    each_store("race", |store, dir| {
        let mut w = Workload::new(17, 1024);
        let s = MemSource::new(Epoch(1));
        let mut a = Archiver::new(store.clone(), config(&dir.join("a")));
        let mut b = Archiver::new(store.clone(), config(&dir.join("b")));
        for i in 0..8 {
            run(&mut w, &s, 6);
            if i % 2 == 0 {
                a.round(&s, Flush::No)?;
                b.round(&s, Flush::No)?;
            } else {
                b.round(&s, Flush::No)?;
                a.round(&s, Flush::No)?;
            }
        }
        let got = restore(store, w.at(), &dir.join("r.db"))?;
        assert_eq!(got, Db(w.shadows[&w.at()].clone()));
        Ok(())
    });
}

#[test]
fn a_crash_at_any_step_of_an_upload_leaves_a_store_that_restores_exactly() {
    each_store("crash", |store, dir| {
        let mut w = Workload::new(21, 1024);
        let s = MemSource::new(Epoch(1));
        let mut up = Archiver::new(store.clone(), config(dir));
        run(&mut w, &s, 10);
        up.round(&s, Flush::No)?;
        let archived = w.at();
        // Crash after uploading a log object, before publishing it: the
        // object is there, the manifest does not cover it.
        run(&mut w, &s, 5);
        let orphan = {
            let mut c = config(dir);
            c.object_bytes = u64::MAX / 4;
            let records: Vec<_> =
                walrelay_archive::Source::read_confirmed(&s, archived, usize::MAX)
                    .unwrap()
                    .iter()
                    .map(|b| walrelay_replicator::Encoded::decode(b).unwrap().0)
                    .collect();
            let obj = walrelay_archive::log_object::LogObject::new(DB, records)?;
            let key = names::log_key(DB, &obj.name(Epoch(1)));
            store.create(&key, obj.encode()?.into())?;
            key
        };
        assert_eq!(
            restore(store, archived, &dir.join("c.db"))?,
            Db(w.shadows[&archived].clone())
        );
        // The next round (a restarted uploader) publishes on top of it.
        let mut again = Archiver::new(store.clone(), config(dir));
        again.round(&s, Flush::No)?;
        assert_eq!(
            restore(store, w.at(), &dir.join("c.db"))?,
            Db(w.shadows[&w.at()].clone())
        );
        let _ = orphan;
        Ok(())
    });
}

#[test]
fn retention_drops_old_snapshots_and_log_but_keeps_the_horizon_restorable() {
    each_store("retention", |store, dir| {
        let mut w = Workload::new(23, 1024);
        let s = MemSource::new(Epoch(1));
        let mut c = config(dir);
        c.retention_ms = 1000 * 24 * 3_600_000; // far longer than the workload's clock
        let mut up = Archiver::new(store.clone(), c.clone());
        for _ in 0..5 {
            run(&mut w, &s, 15);
            up.round(&s, Flush::All)?;
        }
        let a = Archive::new(store.clone(), DB);
        let m = a.manifest()?;
        assert!(m.snapshots.len() >= 4);
        assert_eq!(m.retained_from, Bookmark::ZERO);
        // Now a short retention: everything but the newest snapshot before
        // the horizon goes (the workload's clock is in 2023).
        c.retention_ms = 1;
        let mut pruner = Archiver::new(store.clone(), c);
        run(&mut w, &s, 3);
        pruner.round(&s, Flush::All)?;
        let m = a.manifest()?;
        assert_eq!(m.snapshots.len(), 1, "only the horizon's snapshot stays");
        assert_eq!(m.retained_from, m.snapshots[0].bookmark);
        assert!(matches!(
            restore(store, Bookmark::ZERO, &dir.join("r.db")),
            Err(RestoreError::BeforeRetention { .. })
        ));
        assert_eq!(
            restore(store, w.at(), &dir.join("r.db"))?,
            Db(w.shadows[&w.at()].clone())
        );
        assert_eq!(
            restore(store, m.retained_from, &dir.join("r.db"))?,
            Db(w.shadows[&m.retained_from].clone())
        );
        for l in store.list(&names::log_prefix(DB), None)? {
            let n = names::parse_log_key(DB, &l.key).unwrap();
            assert!(
                n.last > m.retained_from,
                "log before the horizon deleted: {}",
                l.key
            );
        }
        Ok(())
    });
}

#[test]
fn a_follower_releases_only_archived_records_and_keeps_its_local_bytes() {
    each_store("release", |store, dir| {
        let mut w = Workload::new(29, 1024);
        let s = MemSource::new(Epoch(1));
        let mut c = config(dir);
        c.local_keep_bytes = 20 << 10;
        c.max_lag_ms = u64::MAX / 8;
        c.max_lag_bytes = u64::MAX / 8;
        let mut up = Archiver::new(store.clone(), c);
        run(&mut w, &s, 30);
        let report = up.round(&s, Flush::No)?;
        assert_eq!(
            report.released_to, None,
            "nothing archived, nothing released"
        );
        assert!(s.held() > 0);
        up.round(&s, Flush::All)?;
        use walrelay_archive::Source;
        assert!(s.log_start() > Bookmark::ZERO);
        assert!(s.disk_bytes() >= 20 << 10, "keeps its local bytes");
        Ok(())
    });
}

#[test]
fn a_fork_at_any_bookmark_restores_equal_to_its_origin_there_and_reuses_snapshot_parts() {
    each_store("fork", |store, dir| {
        let mut w = Workload::new(31, 1024);
        let s = MemSource::new(Epoch(1));
        let mut up = Archiver::new(store.clone(), config(dir));
        for _ in 0..4 {
            run(&mut w, &s, 12);
            up.round(&s, Flush::All)?;
        }
        let points: Vec<Bookmark> = w.shadows.keys().copied().collect();
        let m = Archive::new(store.clone(), DB).manifest()?;
        let at_snapshot = m.snapshots[1].bookmark;
        let between = points[points.len() * 2 / 3];
        for (i, at) in [at_snapshot, between].into_iter().enumerate() {
            let to = DatabaseId(0x100 + i as u64);
            let forked = walrelay_archive::fork(store, DB, at, to)?;
            assert!(forked.parts_reused >= 1, "the snapshot's parts are reused");
            let fa = Archive::new(store.clone(), to);
            let fm = fa.manifest()?;
            assert_eq!(fm.log_end, at);
            restore_to_file(&fa, &fm, at, &dir.join("fork.db"), &NoProgress)?;
            assert_eq!(
                Db(std::fs::read(dir.join("fork.db"))?),
                Db(w.shadows[&at].clone()),
                "fork at {at}"
            );
            assert!(matches!(
                walrelay_archive::fork(store, DB, at, to),
                Err(walrelay_archive::ForkError::Exists(_))
            ));
        }
        // The origin is untouched.
        assert_eq!(
            restore(store, w.at(), &dir.join("o.db"))?,
            Db(w.shadows[&w.at()].clone())
        );
        Ok(())
    });
}

#[test]
fn five_uploaders_at_once_keep_one_contiguous_restorable_history() {
    each_store("concurrent", |store, dir| {
        let w = std::sync::Mutex::new(Workload::new(37, 1024));
        let s = MemSource::new(Epoch(1));
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            for i in 0..5 {
                let (store, s, stop) = (store.clone(), &s, &stop);
                let mut c = config(&dir.join(format!("u{i}")));
                c.rank = i;
                sc.spawn(move || {
                    let mut up = Archiver::new(store, c);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = up.round(s, Flush::No);
                    }
                });
            }
            for _ in 0..40 {
                let mut w = w.lock().unwrap();
                run(&mut w, &s, 3);
                drop(w);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let w = w.into_inner().unwrap();
        let mut up = Archiver::new(store.clone(), config(&dir.join("last")));
        up.round(&s, Flush::All)?;
        assert_eq!(
            restore(store, w.at(), &dir.join("c.db"))?,
            Db(w.shadows[&w.at()].clone())
        );
        Ok(())
    });
}

/// The scenario a crash interrupts: three batches, each uploaded,
/// snapshotted and pruned (a 1 ms retention drops every snapshot but the
/// newest and the log before it, so every round also deletes).
fn crash_scenario(store: &Store, dir: &Path, w: &mut Workload, s: &MemSource) {
    let mut c = config(dir);
    c.retention_ms = 1;
    let mut up = Archiver::new(store.clone(), c);
    for _ in 0..3 {
        run(w, s, 8);
        // After the crash every round fails: that is the point.
        let _ = up.round(s, Flush::All);
    }
}

/// Restores every shadow bookmark the manifest says it retains (at most
/// `limit`, spread out) and compares.
fn check_retained(store: &Store, dir: &Path, w: &Workload, limit: usize) -> Result<()> {
    let a = Archive::new(store.clone(), DB);
    let m = match a.manifest() {
        Ok(m) => m,
        Err(RestoreError::NoManifest) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let points: Vec<Bookmark> = w
        .shadows
        .keys()
        .copied()
        .filter(|b| *b >= m.retained_from && *b <= m.log_end)
        .collect();
    let step = points.len().div_ceil(limit).max(1);
    for at in points.iter().step_by(step).chain(points.last()) {
        let got = restore(store, *at, &dir.join("crash.db")).map_err(|e| {
            anyhow::anyhow!(
                "restore at {at} (retained {} ..= {}): {e}",
                m.retained_from,
                m.log_end
            )
        })?;
        assert_eq!(got, Db(w.shadows[at].clone()), "restore at {at}");
    }
    Ok(())
}

#[test]
fn a_crash_after_any_store_write_leaves_every_retained_bookmark_exact_and_a_restart_finishes() {
    use object_store::ObjectStore;
    use object_store::prefix::PrefixStore;
    use std::sync::Arc;
    use walrelay_archive::testing::CrashingStore;
    each_store("crashes", |base, dir| {
        let backend = base.object_store();
        // A fresh, empty part of the store for each run.
        let fresh = |name: &str| -> Arc<dyn ObjectStore> {
            Arc::new(PrefixStore::new(Arc::clone(&backend), name.to_string()))
        };
        // How many writes the whole scenario makes.
        let total = {
            let crashing = Arc::new(CrashingStore::new(fresh("count"), -1));
            let store = Store::from_object_store(crashing.clone(), "count")?;
            crash_scenario(
                &store,
                dir,
                &mut Workload::new(41, 1024),
                &MemSource::new(Epoch(1)),
            );
            crashing.writes()
        };
        assert!(
            total > 20,
            "the scenario writes, publishes and deletes ({total} writes)"
        );
        for k in 0..=total {
            let part = fresh(&format!("crash-{k}"));
            let crashing = Store::from_object_store(
                Arc::new(CrashingStore::new(Arc::clone(&part), k as i64)),
                "crashing",
            )?;
            let mut w = Workload::new(41, 1024);
            let s = MemSource::new(Epoch(1));
            crash_scenario(&crashing, dir, &mut w, &s);
            // What the crash left: every retained bookmark restores exactly.
            let after = Store::from_object_store(part, "after")?;
            check_retained(&after, dir, &w, 4)
                .map_err(|e| anyhow::anyhow!("after a crash at write {k} of {total}: {e:#}"))?;
            // A restarted uploader finishes the job.
            let mut up = Archiver::new(after.clone(), config(dir));
            up.round(&s, Flush::All)
                .map_err(|e| anyhow::anyhow!("restart after a crash at write {k}: {e}"))?;
            check_retained(&after, dir, &w, 4).map_err(|e| {
                anyhow::anyhow!("after the restart from a crash at write {k}: {e:#}")
            })?;
            let m = Archive::new(after.clone(), DB).manifest()?;
            assert_eq!(
                m.log_end,
                w.at(),
                "crash at write {k}: everything archived after the restart"
            );
        }
        Ok(())
    });
}

#[test]
fn a_round_off_path_runs_its_uploads_once_through_the_runner_and_still_releases() {
    each_store("off-path", |store, dir| {
        let mut w = Workload::new(31, 1024);
        let s = MemSource::new(Epoch(1));
        let mut c = config(dir);
        c.local_keep_bytes = 20 << 10;
        let mut up = Archiver::new(store.clone(), c);
        run(&mut w, &s, 30);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        // The work runs on another thread, as the follower's idle runner does.
        let on_a_thread = |work: &mut (dyn FnMut() + Send)| {
            calls.fetch_add(1, Ordering::Relaxed);
            std::thread::scope(|t| {
                t.spawn(&mut *work);
            });
        };
        let report = up.round_off_path(&s, Flush::All, &on_a_thread)?;
        assert_eq!(calls.load(Ordering::Relaxed), 1, "one call a round");
        assert!(report.objects > 0, "uploaded off the path");
        assert_eq!(report.archived_to, w.at(), "everything confirmed");
        assert!(report.released_to.is_some(), "released on the caller");
        assert!(s.log_start() > Bookmark::ZERO);
        Ok(())
    });
}

#[test]
fn uploads_fall_behind_at_twice_what_makes_one_due_and_catch_up_below_it_for_the_rank() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().join("store").display())).unwrap();
    for (rank, patience) in [(0, 1), (2, 5)] {
        let mut c = config(dir.path());
        c.rank = rank;
        c.max_lag_bytes = 1 << 20;
        c.max_lag_ms = 10_000;
        let up = Archiver::new(store.clone(), c);
        let stats = up.stats();
        assert!(!up.behind(), "an empty tail keeps up");
        stats
            .lag_bytes
            .store((2 << 20) * patience - 1, Ordering::Relaxed);
        assert!(!up.behind(), "rank {rank}: just under twice its bytes");
        stats
            .lag_bytes
            .store((2 << 20) * patience, Ordering::Relaxed);
        assert!(up.behind(), "rank {rank}: twice its bytes");
        stats.lag_bytes.store(0, Ordering::Relaxed);
        stats.lag_ms.store(20_000 * patience, Ordering::Relaxed);
        assert!(up.behind(), "rank {rank}: twice its age");
    }
}
