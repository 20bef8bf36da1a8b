//! Running cold storage beside a durability follower: the uploader thread
//! (its confirmed log into the store, snapshots, retention, releasing local
//! segments the store covers).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use walrelay_archive::{
    Archiver, ArchiverConfig, ArchiverStats, Flush, RoundReport, Source, SourceError, Store,
};
use walrelay_replicator::node::follower::FollowerNode;
use walrelay_replicator::node::follower_db::FollowerDb;
use walrelay_replicator::{Bookmark, Epoch};

/// How often the uploader looks at the log.
const ROUND_EVERY: Duration = Duration::from_millis(500);

/// A follower's log as the uploader sees it.
struct NodeSource(Arc<FollowerNode>);

impl Source for NodeSource {
    fn confirmed(&self) -> Bookmark {
        self.0.confirmed()
    }
    fn epoch(&self) -> Epoch {
        self.0.epoch()
    }
    fn log_start(&self) -> Bookmark {
        self.0.log_start()
    }
    fn read_confirmed(
        &self,
        after: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<bytes::Bytes>, SourceError> {
        Ok(self.0.read_confirmed(after, max_bytes)?)
    }
    fn confirmed_bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, SourceError> {
        Ok(self.0.confirmed_bytes_between(after, upto)?)
    }
    fn disk_bytes(&self) -> u64 {
        self.0.disk_bytes()
    }
    fn release_point(&self, keep_bytes: u64) -> Bookmark {
        self.0.release_point(keep_bytes)
    }
    fn release_through(&self, upto: Bookmark) -> Result<(), SourceError> {
        self.0.release_through(upto)?;
        Ok(())
    }
}

/// One database of a follower host as the uploader sees it. The questions
/// that cannot fail on a single-database follower answer "nothing yet"
/// (ZERO, 0) if the host cannot open the database right now; the next
/// round asks again.
struct DbSource(FollowerDb);

impl Source for DbSource {
    fn confirmed(&self) -> Bookmark {
        self.0.confirmed().unwrap_or(Bookmark::ZERO)
    }
    fn epoch(&self) -> Epoch {
        self.0.epoch().unwrap_or(Epoch(0))
    }
    fn log_start(&self) -> Bookmark {
        self.0.log_start().unwrap_or(Bookmark::ZERO)
    }
    fn read_confirmed(
        &self,
        after: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<bytes::Bytes>, SourceError> {
        Ok(self.0.read_confirmed(after, max_bytes)?)
    }
    fn confirmed_bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, SourceError> {
        Ok(self.0.confirmed_bytes_between(after, upto)?)
    }
    fn disk_bytes(&self) -> u64 {
        self.0.disk_bytes().unwrap_or(0)
    }
    fn release_point(&self, keep_bytes: u64) -> Bookmark {
        // Nothing to release when it cannot be asked: the log's start.
        self.0
            .release_point(keep_bytes)
            .unwrap_or_else(|_| self.log_start())
    }
    fn release_through(&self, upto: Bookmark) -> Result<(), SourceError> {
        self.0.release_through(upto)?;
        Ok(())
    }
}

/// How long a stopping process's uploader goes on uploading the confirmed
/// log: a stop must end in seconds, and the log is safe on the followers
/// until the next start archives it.
pub const STOP_UPLOAD: Duration = Duration::from_secs(5);

/// Rounds in a row with nothing to do after which an uploader started
/// with [`Uploader::start_db_until_idle`] ends.
const IDLE_ROUNDS: u32 = 2;

/// How an uploader that ended by itself left its database: everything
/// confirmed was archived (through `archived`), and the local log was
/// released as far as the store and `local_keep_bytes` allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idle {
    /// The store's archived end when it ended.
    pub archived: Bookmark,
    /// When a snapshot falls due though nothing new arrives (µs since the
    /// Unix epoch), if one will.
    pub snapshot_due_us: Option<u64>,
}

/// The uploader thread of one follower.
#[derive(Debug)]
pub struct Uploader {
    stop: Arc<AtomicBool>,
    /// The archiver's: set when the process stops (not when the uploader
    /// only yields its slot), so it winds down within [`STOP_UPLOAD`].
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<ArchiverStats>,
    idle: Arc<parking_lot::Mutex<Option<Idle>>>,
}

impl Uploader {
    /// Starts uploading `node`'s confirmed log.
    pub fn start(
        node: Arc<FollowerNode>,
        store: Store,
        config: ArchiverConfig,
    ) -> std::io::Result<Uploader> {
        Self::start_source(NodeSource(node), store, config, false)
    }

    /// Starts uploading one database of a follower host.
    pub fn start_db(
        db: FollowerDb,
        store: Store,
        config: ArchiverConfig,
    ) -> std::io::Result<Uploader> {
        Self::start_source(DbSource(db), store, config, false)
    }

    /// Starts uploading one database of a follower host until there is
    /// nothing left to do: everything confirmed archived and the log
    /// released as far as it can be ([`Uploader::idle`] then says so and
    /// [`Uploader::is_finished`] is true). Between rounds it asks only
    /// what the host answers without reopening the database.
    pub fn start_db_until_idle(
        db: FollowerDb,
        store: Store,
        config: ArchiverConfig,
    ) -> std::io::Result<Uploader> {
        Self::start_source(DbSource(db), store, config, true)
    }

    fn start_source(
        source: impl Source + 'static,
        store: Store,
        config: ArchiverConfig,
        until_idle: bool,
    ) -> std::io::Result<Uploader> {
        let mut schedule = Schedule::new(config.rank);
        let mut archiver = Archiver::new(store, config);
        let stats = archiver.stats();
        let stopping = archiver.stopping_flag();
        let stopping_here = Arc::clone(&stopping);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let idle = Arc::new(parking_lot::Mutex::new(None));
        let idle_out = Arc::clone(&idle);
        let thread = std::thread::Builder::new()
            .name("walrelay-archiver".into())
            .spawn(move || {
                walrelay_replicator::background::lower_this_thread();
                let mut quiet = 0;
                let mut keeping_up = true;
                loop {
                    schedule.wait(&flag);
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    // Off the commit path (SCHED_IDLE) while it keeps up;
                    // at this thread's lowered priority when it does not.
                    let off_path = |work: &mut (dyn FnMut() + Send)| {
                        if keeping_up {
                            walrelay_replicator::background::run_idle(&mut *work);
                        } else {
                            work();
                        }
                    };
                    let report = archiver.round_off_path(&source, Flush::No, &off_path);
                    if keeping_up && archiver.behind() {
                        keeping_up = false;
                        tracing::warn!(database = %archiver.config().database, "uploads fall behind: rounds run at the uploader's own priority");
                    } else if !keeping_up && archiver.caught_up() {
                        keeping_up = true;
                        tracing::info!(database = %archiver.config().database, "uploads caught up: rounds run under SCHED_IDLE again");
                    }
                    if until_idle {
                        quiet = match report {
                            Ok(r) if nothing_done(&r, source.confirmed()) => quiet + 1,
                            _ => 0,
                        };
                        if quiet >= IDLE_ROUNDS {
                            *idle_out.lock() = Some(idle_state(&archiver));
                            return;
                        }
                    }
                }
                // An uploader yielding its slot leaves nothing confirmed
                // unarchived; a stopping process uploads for at most
                // STOP_UPLOAD and leaves the rest (still on the followers'
                // disks) to the next round after a restart.
                let last = if stopping_here.load(Ordering::Relaxed) {
                    Flush::Stop {
                        deadline: Instant::now() + STOP_UPLOAD,
                    }
                } else {
                    Flush::Log
                };
                match archiver.round(&source, last) {
                    Ok(r) if until_idle && nothing_done(&r, source.confirmed()) => {
                        *idle_out.lock() = Some(idle_state(&archiver));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(database = %archiver.config().database, error = %e, "the last upload before stopping failed")
                    }
                }
            })?;
        Ok(Uploader {
            stop,
            stopping,
            thread: Some(thread),
            stats,
            idle,
        })
    }

    /// Whether the thread has ended (by itself, or after a stop).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// How it left the database, if it ended with nothing left to do.
    pub fn idle(&self) -> Option<Idle> {
        *self.idle.lock()
    }

    /// Asks the thread to upload what is confirmed and end, without
    /// waiting for it: it finishes the round it is in, a snapshot
    /// included (an uploader yielding its slot to another database).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// As [`Uploader::request_stop`], for a stopping process: a snapshot
    /// being built or uploaded is abandoned and none starts, and the
    /// thread ends once the confirmed log is uploaded or [`STOP_UPLOAD`]
    /// has passed.
    pub fn request_shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
    }

    /// One status line's worth: what is archived and how far behind.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "archived={:08x}-{:016x} archive_lag_ms={} archive_lag_bytes={} objects={} snapshots={} carried_parts={} uploaded_bytes={} failures={}",
            get(&s.archived_epoch),
            get(&s.archived_sequence),
            get(&s.lag_ms),
            get(&s.lag_bytes),
            get(&s.objects_uploaded),
            get(&s.snapshots_uploaded),
            get(&s.snapshot_parts_carried),
            get(&s.bytes_uploaded) + get(&s.snapshot_bytes_uploaded),
            get(&s.failures)
        ) + &s
            .last_error
            .lock()
            .as_ref()
            .map(|e| format!(" last_error={e:?}"))
            .unwrap_or_default()
    }

    /// Uploads what is confirmed for at most [`STOP_UPLOAD`], skipping
    /// snapshots (see [`Uploader::request_shutdown`]), and stops; the
    /// state it left (see [`Uploader::idle`]).
    pub fn stop(mut self) -> Option<Idle> {
        self.request_shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.idle()
    }
}

/// Whether a round found nothing to do: all of `confirmed` archived (or
/// the store fenced this follower), nothing uploaded, snapshotted,
/// deleted or released.
fn nothing_done(r: &RoundReport, confirmed: Bookmark) -> bool {
    (r.fenced || r.archived_to >= confirmed)
        && r.objects == 0
        && r.snapshot.is_none()
        && r.deleted == 0
        && r.released_to.is_none()
}

/// The state an idle uploader leaves, with when a snapshot of the log
/// after the newest one falls due by time alone.
fn idle_state(archiver: &Archiver) -> Idle {
    let m = archiver.archive().manifest().ok();
    let config = archiver.config();
    let patience = 1 + 2 * u64::from(config.rank);
    let snapshot_due_us = m.as_ref().and_then(|m| {
        let newest = m.snapshots.last()?;
        (newest.bookmark < m.log_end).then(|| {
            newest
                .commit_us
                .saturating_add(config.snapshot_every_ms.saturating_mul(patience * 1000))
        })
    });
    Idle {
        archived: m.map_or(Bookmark::ZERO, |m| m.log_end),
        snapshot_due_us,
    }
}

/// When an uploader's rounds run: one every [`ROUND_EVERY`], at a phase
/// its rank sets. The followers' uploaders all start together, and a
/// round's work lands on the disk they share (on the test machine, one
/// disk for all five): most of all the releases after an upload, each a
/// burst of unlinks and a directory sync, which made commits wait when
/// all five came at once (papers/performance.md, lever 61). At a phase
/// apart they come a fifth of a period apart.
struct Schedule {
    next: Instant,
}

impl Schedule {
    /// Uploaders whose phases differ.
    const PHASES: u32 = 5;

    fn new(rank: u32) -> Schedule {
        Schedule {
            next: Instant::now() + Self::phase(rank),
        }
    }

    /// Where in the period rounds of `rank` start.
    fn phase(rank: u32) -> Duration {
        ROUND_EVERY * (rank % Self::PHASES) / Self::PHASES
    }

    /// Sleeps until the next round is due (at once if `flag` is set). A
    /// round that overran its period makes the next start a whole period
    /// later, at the same phase.
    fn wait(&mut self, flag: &AtomicBool) {
        sleep_unless(flag, self.next.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        while self.next <= now {
            self.next += ROUND_EVERY;
        }
    }
}

/// Sleeps `total`, waking early if `flag` is set.
fn sleep_unless(flag: &AtomicBool, total: Duration) {
    let step = Duration::from_millis(50);
    let mut left = total;
    while !left.is_zero() && !flag.load(Ordering::Relaxed) {
        let d = left.min(step);
        std::thread::sleep(d);
        left -= d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploaders_of_the_first_five_ranks_start_their_rounds_a_fifth_of_a_period_apart() {
        let phases: Vec<Duration> = (0..5).map(Schedule::phase).collect();
        assert_eq!(phases[0], Duration::ZERO);
        for w in phases.windows(2) {
            assert_eq!(w[1] - w[0], ROUND_EVERY / 5);
        }
        assert!(phases[4] < ROUND_EVERY);
        assert_eq!(
            Schedule::phase(5),
            Schedule::phase(0),
            "ranks past five share phases"
        );
    }

    #[test]
    fn a_round_that_overran_its_period_keeps_its_phase() {
        let flag = AtomicBool::new(false);
        let mut s = Schedule::new(2);
        let first = s.next;
        s.wait(&flag);
        assert!(Instant::now() >= first);
        assert_eq!(s.next, first + ROUND_EVERY);
        std::thread::sleep(ROUND_EVERY * 2 + ROUND_EVERY / 2);
        s.wait(&flag);
        let periods = (s.next - first).as_nanos() / ROUND_EVERY.as_nanos();
        assert_eq!(s.next, first + ROUND_EVERY * periods as u32, "on the phase");
        assert!(periods >= 3, "{periods}");
    }

    #[test]
    fn a_stop_ends_the_wait_for_a_round() {
        let flag = AtomicBool::new(true);
        let mut s = Schedule::new(4);
        let started = Instant::now();
        s.wait(&flag);
        assert!(
            started.elapsed() < ROUND_EVERY / 5 * 4,
            "did not sleep out the phase"
        );
    }
}
