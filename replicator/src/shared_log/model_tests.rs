//! The shared log against a model: random appends, syncs, cuts, releases,
//! resets, maintenance (with compaction forced by a tiny segment bound),
//! clean reopens and crashes (staged records lost) over a few databases;
//! after every reopen each database's index and bytes are exactly the
//! model's: all that was synced, nothing else.

use super::tests::{Expect, append, check, config, next};
use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::history::History;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const DBS: usize = 5;

/// Compactions over the runs (of each run's last open), to show they ran.
static COMPACTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn run(seed: u64, ops: usize) {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = config(8 << 10, 3);
    let mut rng = Rng(seed | 1);
    let mut model: Vec<Expect> = vec![Expect::default(); DBS];
    let mut epochs = [1u32; DBS];
    let (mut log, _) = SharedLog::open(dir.path(), cfg).expect("open");
    let mut deleted = 0;
    let mut durable = model.clone();
    for op in 0..ops {
        let d = rng.below(DBS as u64) as usize;
        let id = DatabaseId(d as u64);
        let db = log.database(id);
        match rng.below(100) {
            0..=59 => {
                let r = next(
                    model[d].end(),
                    epochs[d],
                    op as u8,
                    1 + rng.below(3) as usize * 400,
                );
                db.append_encoded(&r).expect("append");
                model[d].records.push(r);
            }
            60..=74 => {
                log.sync().expect("sync");
            }
            75..=79 => {
                // A cut: a new epoch follows the kept prefix.
                let n = model[d].records.len();
                let k = rng.below(n as u64 + 1) as usize;
                let keep = if k == 0 {
                    model[d].start
                } else {
                    model[d].records[k - 1].bookmark
                };
                db.truncate_after(keep).expect("cut");
                model[d].records.truncate(k);
                epochs[d] += 1;
            }
            80..=89 => {
                log.sync().expect("sync");
                let n = model[d].records.len();
                if n > 0 {
                    let k = rng.below(n as u64) as usize;
                    let upto = model[d].records[k].bookmark;
                    let released = db.release_through(upto).expect("release");
                    assert_eq!(released.start, upto);
                    model[d].start_chain = Some(model[d].records[k].chain);
                    model[d].start = upto;
                    model[d].records.drain(..=k);
                }
            }
            90..=91 => {
                let last = model[d].end().0;
                epochs[d] += 1;
                let start = Bookmark::new(Epoch(epochs[d]), Sequence(last.sequence.0 + 100));
                let chain = ChainHash::from_bytes([op as u8; 16]);
                let mut history = History::new();
                history.record(start);
                db.reset_to(start, chain, history).expect("reset");
                model[d] = Expect {
                    records: Vec::new(),
                    start,
                    start_chain: Some(chain),
                };
            }
            92..=95 => log.maintain().expect("maintain"),
            96..=97 => {
                // A crash: what was staged since the last sync is lost,
                // nothing synced is.
                deleted += log.stats().segments_deleted;
                drop(db);
                drop(log);
                model = durable.clone();
                let (reopened, rec) = SharedLog::open(dir.path(), cfg).expect("reopen");
                assert_eq!(
                    (rec.unchained, rec.cut_bytes),
                    (0, 0),
                    "seed {seed} op {op}: {rec:?}"
                );
                log = reopened;
                for (i, e) in model.iter().enumerate() {
                    check(&log, DatabaseId(i as u64), e);
                }
                continue;
            }
            _ => {
                log.sync().expect("sync");
                deleted += log.stats().segments_deleted;
                drop(db);
                drop(log);
                let (reopened, rec) = SharedLog::open(dir.path(), cfg).expect("reopen");
                assert_eq!(
                    (rec.unchained, rec.cut_bytes),
                    (0, 0),
                    "seed {seed} op {op}: {rec:?}"
                );
                log = reopened;
                for (i, e) in model.iter().enumerate() {
                    check(&log, DatabaseId(i as u64), e);
                }
                durable = model.clone();
                continue;
            }
        }
        if !(0..DBS).any(|i| log.database(DatabaseId(i as u64)).has_staged()) {
            // Everything staged is synced (every op but an append syncs).
            durable = model.clone();
        }
    }
    log.sync().expect("sync");
    for (i, e) in model.iter().enumerate() {
        check(&log, DatabaseId(i as u64), e);
    }
    deleted += log.stats().segments_deleted;
    assert!(deleted > 0, "seed {seed}: segments were deleted");
    COMPACTIONS.fetch_add(
        log.stats().compactions,
        std::sync::atomic::Ordering::Relaxed,
    );
}

#[test]
fn random_appends_cuts_releases_resets_compactions_and_reopens_match_a_model() {
    let seeds: u64 = std::env::var("WALRELAY_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    for seed in 1..=seeds {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 600);
    }
    assert!(
        COMPACTIONS.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "some run compacted"
    );
}

#[test]
fn a_model_run_compacts() {
    let dir = tempfile::tempdir().expect("dir");
    let (log, _) = SharedLog::open(dir.path(), config(8 << 10, 3)).expect("open");
    let mut lag = Expect::default();
    let mut busy = Expect::default();
    for i in 0..60u8 {
        if i % 15 == 0 {
            append(&log, DatabaseId(1), &mut lag, i, 400);
        }
        append(&log, DatabaseId(2), &mut busy, i, 400);
        log.sync().expect("sync");
        let upto = busy.end().0;
        log.database(DatabaseId(2))
            .release_through(upto)
            .expect("release");
        busy.start_chain = Some(busy.end().1);
        busy.records.clear();
        busy.start = upto;
    }
    assert!(log.stats().compactions > 0, "{:?}", log.stats());
    assert!(log.segments() <= 3);
    check(&log, DatabaseId(1), &lag);
    check(&log, DatabaseId(2), &busy);
}
