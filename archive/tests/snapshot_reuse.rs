//! Snapshots cut from the previous snapshot, end to end against every
//! store: the parts the log left alone are carried over, and every
//! snapshot restores exactly.

use walrelay_archive::testing::{MemSource, Workload, each_store, restored};
use walrelay_archive::{Archiver, ArchiverConfig, Flush};
use walrelay_replicator::{DatabaseId, Epoch};

const DB: DatabaseId = DatabaseId(0x51);

/// 64 KiB pages: 256 to a snapshot part.
const PAGE_SIZE: u32 = 65536;

#[test]
fn an_append_mostly_database_carries_its_middle_parts_and_restores_exactly_at_every_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    each_store("reuse", dir.path(), true, |kind, store| {
        let mut c = ArchiverConfig::new(DB, dir.path().join(format!("work-{kind}")));
        c.max_lag_ms = 0;
        c.max_lag_bytes = 0;
        c.snapshot_log_bytes = 1;
        c.local_keep_bytes = 0;
        let mut up = Archiver::new(store.clone(), c);
        let source = MemSource::new(Epoch(1));
        let mut w = Workload::new(5, PAGE_SIZE);
        // Four parts' worth, then appends: each grows the last part and
        // rewrites page 1 (SQLite's header holds the size), as an
        // append-only table does.
        let mut db = 3 * 256 + 40;
        for r in w.write(db, (1..=db).collect(), 64) {
            source.push(r);
        }
        for round in 0..4 {
            if round > 0 {
                db += 2;
                for r in w.write(db, vec![1, db - 2, db - 1, db], 64) {
                    source.push(r);
                }
            }
            source.confirm(w.at());
            up.round(&source, Flush::No)
                .unwrap_or_else(|e| panic!("{kind} store, round {round}: {e}"));
            let m = walrelay_archive::Archive::new(store.clone(), DB)
                .manifest()
                .unwrap();
            assert_eq!(
                m.snapshots.last().map(|s| s.bookmark),
                Some(w.at()),
                "{kind} store: round {round} cut a snapshot at the end"
            );
            let got = restored(store, DB, w.at(), &dir.path().join("out.db")).unwrap();
            assert!(
                got == w.shadows[&w.at()],
                "{kind} store: the snapshot of round {round} restores exactly"
            );
            // Only the newest shadow is needed (each is 52 MB).
            let at = w.at();
            w.shadows.retain(|b, _| *b == at);
        }
        let carried = up
            .stats()
            .snapshot_parts_carried
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            carried, 6,
            "{kind} store: parts 1 and 2 of each of three snapshots cut from the one before"
        );
    });
}
