//! The steady state of a follower's log, as `walrelay up` runs it: an
//! uploader beside each follower archives the confirmed log into cold
//! storage and releases the archived prefix, and a log that has released
//! segments reuses them at its rolls (`walrelay_replicator::recycle`)
//! instead of zero-filling new ones (`walrelay_replicator::prealloc`).
//! A fresh log writes about 1.3 bytes of zeros per byte of log until then.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use walrelay_archive::{ArchiverConfig, Store};
use walrelay_engine::archiving::Uploader;
use walrelay_replicator::DatabaseId;
use walrelay_replicator::node::follower::FollowerNode;

/// What the quorum bench's steady-state phase runs beside the commits it
/// times (`WALRELAY_BENCH_STEADY`: unset, none; `quiet`, [`Mode::Quiet`];
/// anything else, [`Mode::Uploading`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The uploaders go on (archiving, snapshots, releases), as in `up`.
    Uploading,
    /// The uploaders are stopped first: the logs reuse segments already
    /// released, and nothing archives beside the commits (a diagnostic).
    Quiet,
}

/// The steady-state phase asked for, if any.
pub fn mode() -> Option<Mode> {
    match std::env::var("WALRELAY_BENCH_STEADY").ok()?.as_str() {
        "" | "0" => None,
        "quiet" => Some(Mode::Quiet),
        _ => Some(Mode::Uploading),
    }
}

/// One-session windows timed in the steady state (each as long as the
/// fresh log's): background work comes every few seconds, so one short
/// window would catch it or not by chance.
pub const WINDOWS: usize = 4;

/// Rolls onto a reused segment each follower has made when its log is
/// taken to be in the steady state.
pub const ROLLS_ONTO_REUSED: u64 = 2;

/// The longest the bench loads the cluster waiting for the steady state.
pub const WARM_UP_LIMIT: Duration = Duration::from_secs(120);

/// How long one session writes after the warm-up before its commits are
/// timed: the burst's uploads and snapshots catch up meanwhile.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Now on `CLOCK_MONOTONIC`, in µs: the clock `perf record -k
/// CLOCK_MONOTONIC` stamps its events with, so that a timeline of commits
/// lines up with the disk's requests (`benches/scripts/steady_timeline.sh`).
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration,
    // and CLOCK_MONOTONIC is always available on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// The file `WALRELAY_BENCH_TIMELINE` names, if it is set.
fn timeline_path() -> Option<std::path::PathBuf> {
    std::env::var_os("WALRELAY_BENCH_TIMELINE").map(std::path::PathBuf::from)
}

/// The longest [`wait_for_observer`] waits.
const OBSERVER_WAIT: Duration = Duration::from_secs(30);

/// With `WALRELAY_BENCH_TIMELINE=<file>`: creates `<file>.ready` and waits
/// (at most [`OBSERVER_WAIT`]) for `<file>.go`, which an observer such as
/// `perf record` creates once it is recording, so that it records the
/// timed windows and not the warm-up.
pub fn wait_for_observer() {
    let Some(path) = timeline_path() else {
        return;
    };
    let with = |ext: &str| {
        let mut p = path.clone().into_os_string();
        p.push(ext);
        std::path::PathBuf::from(p)
    };
    std::fs::write(with(".ready"), b"").expect("the timeline's ready file");
    let waited = std::time::Instant::now();
    while !with(".go").exists() && waited.elapsed() < OBSERVER_WAIT {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// With `WALRELAY_BENCH_TIMELINE=<file>`, writes the steady-state commits
/// there, one line each: when it started (µs, [`monotonic_us`]) and how
/// long it took (µs).
pub fn write_timeline(started_us: &[u64], took: &[Duration]) {
    let Some(path) = timeline_path() else {
        return;
    };
    let lines: String = started_us
        .iter()
        .zip(took)
        .map(|(at, d)| format!("{at} {}\n", d.as_micros()))
        .collect();
    std::fs::write(&path, lines).expect("the timeline file");
}

/// Starts an uploader beside each follower of a [`crate::cluster`] under
/// `dir`, ranked by position, with the archiver's defaults (as `walrelay
/// up` configures them: upload within 10 s or 16 MiB times the rank, keep
/// the newest 64 MiB of archived log), into one store: in memory, standing
/// in for a remote one such as S3 (the uploads write nothing to the
/// followers' disk), or at `dir/store` on that disk, as `up`'s default
/// is, with `WALRELAY_BENCH_STORE=disk`. Stop them with [`Uploader::stop`].
pub fn start_uploaders(dir: &Path, followers: &[Arc<FollowerNode>]) -> Vec<Uploader> {
    let url = match std::env::var("WALRELAY_BENCH_STORE").as_deref() {
        Ok("disk") => dir.join("store").to_string_lossy().into_owned(),
        _ => "memory://".to_string(),
    };
    let store = Store::open(&url).expect("the bench's store");
    followers
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let work = dir.join(format!("follower-{i}")).join("archive");
            let mut config = ArchiverConfig::new(DatabaseId(1), work);
            config.rank = i as u32;
            Uploader::start(Arc::clone(f), store.clone(), config).expect("uploader")
        })
        .collect()
}
