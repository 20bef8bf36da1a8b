//! Quorum commit against its physical floor, measured in the same run.
//!
//! A primary replicates to five followers (W = 3) and one replica, all in
//! this process over loopback TCP, each follower with its own segment log
//! on the same disk. Reported:
//! - commit latency, one session (p50, p99) and its ratio to the floor:
//!   one 4 KiB overwrite of a preallocated file + fdatasync, plus one 4 KiB
//!   loopback round trip;
//! - throughput with 1 and 16 concurrent sessions (group commit);
//! - confirm lag: the leader's quorum instant to the replica's visibility;
//! - with `WALRELAY_BENCH_STEADY=1` (`pg_quorum.sh` sets it), one
//!   session's commit latency again in the steady state: an uploader
//!   beside each follower, as `walrelay up` runs one, and every log reusing
//!   its released segments instead of zero-filling new ones (see
//!   `walrelay_benches::steady`; `=quiet` stops the uploaders first).
//!
//! Beside the target's floor (the W-th of N concurrent overwrites), the
//! W-th of the eager followers' alone (all W of W by default), the structure of
//! what a commit waits for with fewer eager followers than N.
//!
//! The shared-disk floors are timed in blocks that alternate with the
//! commits they are compared with ([`FLOOR_BLOCKS`] on a fresh log, one
//! after each steady-state window), so that both see the same moments of
//! the disk: timed in one block apart, the floor's p99 moved from 263 to
//! 497 us between runs, and every p99 ratio with it.
//!
//! Replication is authenticated with a cluster key, as `walrelay up` runs
//! it (the `replication_auth` bench compares with and without).
//!
//! `cargo bench -p walrelay-benches --bench quorum` (full run);
//! `-- --test` runs a few iterations only (CI).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_benches::floor::{
    ConcurrentOverwrite, Durably, Percentiles, durable_overwrite, loopback_round_trip, percentiles,
    process_cpu_us, quorum_floor,
};
use walrelay_benches::{cluster, steady};
use walrelay_engine::Constraint;
use walrelay_replicator::ClusterKey;

fn show(name: &str, p: &Percentiles) {
    println!(
        "{name:<34} p50 {:>8.1} us   p99 {:>8.1} us   mean {:>8.1} us",
        p.p50_us, p.p99_us, p.mean_us
    );
}

/// Blocks of the fresh log's one-session commits, each followed by a block
/// of each shared-disk floor's rounds.
/// The workload's write: one row of 100 random bytes, the least
/// compressible data a user can store (a half-full page of them
/// compresses to about half).
const INSERT: &str = "INSERT INTO t(v) VALUES (randomblob(100))";
const FLOOR_BLOCKS: usize = 6;

/// A pause after each block of commits before a floor block: the cluster's
/// own background writes behind the commits (a spare's zeros, lazy
/// followers' batches) drain first rather than slow the floor down, which
/// would flatter the ratio.
const SETTLE_BEFORE_FLOOR: Duration = Duration::from_millis(200);

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let (floor_iters, latency_iters, throughput_secs) = if quick {
        (5, 20, 0.2)
    } else {
        (2_000, 3_000, 5.0)
    };
    let root = tempfile::tempdir_in(std::env::var("WALRELAY_BENCH_DIR").unwrap_or(".".into()))
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");

    let mut overwrite = durable_overwrite(root.path(), 4096, floor_iters).expect("overwrite floor");
    let mut rtt = loopback_round_trip(4096, floor_iters).expect("loopback floor");
    let overwrite = percentiles(&mut overwrite);
    let rtt = percentiles(&mut rtt);
    let floor = quorum_floor(&overwrite, &rtt);

    // N can be changed to see how much of the cost is the disk shared by
    // every follower on this one machine (N=1 isolates the software path).
    let n: usize = std::env::var("WALRELAY_BENCH_FOLLOWERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    // The same floor for followers that share this one disk: the W-th of N
    // concurrent overwrites, plus one round trip; made durable with
    // fdatasync (the target's floor), and the way the followers write
    // (O_DIRECT, RWF_DSYNC), which says how much of a commit is the disk's
    // path for their kind of write. Their files are prepared before the
    // cluster starts; their rounds are timed between the commits' blocks.
    let w = n / 2 + 1;
    let shared_disk = |how: Durably| {
        ConcurrentOverwrite::new(root.path(), 4096, n, w, how)
            .unwrap_or_else(|e| panic!("shared-disk floor ({how:?}): {e}"))
    };
    let (mut shared_disk, mut direct_disk) = (
        shared_disk(Durably::Fdatasync),
        shared_disk(Durably::DirectDsync),
    );
    // What the eager fan-out waits for at best: the W-th of only the
    // eager followers' concurrent writes (all of them, by default), where
    // the floor above is the W-th of all N. Their tails differ: the
    // slowest of three against the third of five.
    let eager = cluster::eager_followers().unwrap_or(w).clamp(w, n);
    let mut eager_disk =
        ConcurrentOverwrite::new(root.path(), 4096, eager, w, Durably::DirectDsync)
            .unwrap_or_else(|e| panic!("eager followers' floor: {e}"));
    let blocks = if quick { 1 } else { FLOOR_BLOCKS };
    let key = Some(ClusterKey::generate().expect("cluster key"));
    let cluster::BenchCluster {
        followers,
        primary,
        replica,
    } = cluster::start(root.path(), n, key);
    let primary = Arc::new(primary);
    println!(
        "transport {} / follower storage {}{}",
        primary.leader().backend(),
        followers[0].storage_backend(),
        if followers[0].direct_io() {
            ", O_DIRECT"
        } else {
            ""
        }
    );
    let s = primary
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        .run()
        .expect("create");

    // Warm up, then one session's commit latency.
    for _ in 0..latency_iters / 10 + 1 {
        s.prepare(INSERT).run().expect("insert");
    }
    let _ = replica.node().take_confirm_lags_us();
    // Each commit's latency, and when it started (CLOCK_MONOTONIC, us).
    let one_session = |iterations: usize| {
        let mut commit = Vec::with_capacity(iterations);
        let mut started_us = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            started_us.push(steady::monotonic_us());
            let t = Instant::now();
            s.prepare(INSERT).run().expect("insert");
            commit.push(t.elapsed());
        }
        (commit, started_us)
    };
    let (mut commits, mut shared, mut direct, mut eager_only) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Eager followers swapped out while one session commits: each swap is
    // a follower that trailed the others past a stall check, and holds a
    // commit for a check or two.
    let swaps_before = primary.status().eager_swaps;
    for _ in 0..blocks {
        commits.extend(one_session(latency_iters / blocks).0);
        std::thread::sleep(SETTLE_BEFORE_FLOOR);
        shared.extend(
            shared_disk
                .rounds(floor_iters / blocks)
                .expect("shared-disk floor"),
        );
        direct.extend(
            direct_disk
                .rounds(floor_iters / blocks)
                .expect("O_DIRECT shared-disk floor"),
        );
        eager_only.extend(
            eager_disk
                .rounds(floor_iters / blocks)
                .expect("eager followers' floor"),
        );
    }
    let swaps = primary.status().eager_swaps - swaps_before;
    let commit = percentiles(&mut commits);
    let shared = percentiles(&mut shared);
    let shared_floor = quorum_floor(&shared, &rtt);
    let direct = percentiles(&mut direct);
    let direct_floor = quorum_floor(&direct, &rtt);
    let eager_only = percentiles(&mut eager_only);
    let eager_floor = quorum_floor(&eager_only, &rtt);
    std::thread::sleep(Duration::from_millis(200));
    let mut lags: Vec<Duration> = replica
        .node()
        .take_confirm_lags_us()
        .into_iter()
        .map(Duration::from_micros)
        .collect();

    // Commits per second and CPU µs per commit (every node of this
    // in-process cluster: the process's CPU time).
    let throughput = |sessions: usize| -> (f64, f64) {
        let cpu0 = process_cpu_us();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..sessions)
            .map(|_| {
                let (p, stop, done) = (Arc::clone(&primary), Arc::clone(&stop), Arc::clone(&done));
                std::thread::spawn(move || {
                    let s = p
                        .database()
                        .session(Constraint::FirstPrimary)
                        .expect("session");
                    while !stop.load(Ordering::Relaxed) {
                        s.prepare(INSERT).run().expect("insert");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(throughput_secs));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("writer");
        }
        let commits = done.load(Ordering::Relaxed);
        let cpu = (process_cpu_us() - cpu0) as f64 / commits.max(1) as f64;
        (commits as f64 / started.elapsed().as_secs_f64(), cpu)
    };
    // WALRELAY_BENCH_PROFILE=<sessions>: only that throughput phase, for
    // 10 s, for a profiler attached to this process (see
    // papers/performance.md).
    if let Some(sessions) = std::env::var("WALRELAY_BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        println!(
            "profiling phase: {sessions} sessions, pid {}",
            std::process::id()
        );
        let started = Instant::now();
        let mut commits_per_s = Vec::new();
        while started.elapsed() < Duration::from_secs(10) {
            let before = primary.database().group_commit_stats();
            let (rate, cpu_us) = throughput(sessions);
            let after = primary.database().group_commit_stats();
            let per_group = (after.grouped_writes - before.grouped_writes) as f64
                / (after.groups - before.groups).max(1) as f64;
            commits_per_s.push((rate, cpu_us, per_group, after.led_alone - before.led_alone));
        }
        for (rate, cpu_us, per_group, alone) in commits_per_s {
            println!(
                "  {sessions} sessions: {rate:>8.0} commits/s, CPU per commit {cpu_us:>7.1} us, {per_group:.1} writes per group, {alone} led alone"
            );
        }
        return;
    }
    let (one, one_cpu_us) = throughput(1);
    let groups_before = primary.database().group_commit_stats();
    let (sixteen, sixteen_cpu_us) = throughput(16);
    let groups = primary.database().group_commit_stats();

    // WALRELAY_BENCH_STEADY: one session's commits again in the steady
    // state `walrelay up` runs in (see `steady`), after the phases above.
    let steady_run = steady::mode().map(|mode| {
        let mut uploaders = steady::start_uploaders(root.path(), &followers);
        let warm = Instant::now();
        let reached = loop {
            let reused = followers.iter().map(|f| f.segments_recycled()).min();
            if reused.unwrap_or(0) >= steady::ROLLS_ONTO_REUSED {
                break true;
            }
            if quick || warm.elapsed() > steady::WARM_UP_LIMIT {
                break false;
            }
            throughput(16);
        };
        let warm_secs = warm.elapsed().as_secs_f64();
        let settle = Instant::now();
        while !quick && settle.elapsed() < steady::SETTLE {
            throughput(1);
        }
        let settle_secs = settle.elapsed().as_secs_f64();
        if mode == steady::Mode::Quiet {
            for u in uploaders.drain(..) {
                u.stop();
            }
        }
        steady::wait_for_observer();
        let mut commits = Vec::new();
        let mut started_us = Vec::new();
        // A floor block after each window, as on the fresh log (the
        // uploaders, if on, go on beside both).
        let mut floor_rounds = Vec::new();
        for _ in 0..steady::WINDOWS {
            let (c, at) = one_session(latency_iters);
            commits.extend(c);
            started_us.extend(at);
            std::thread::sleep(SETTLE_BEFORE_FLOOR);
            floor_rounds.extend(
                shared_disk
                    .rounds(floor_iters / 2)
                    .expect("steady-state shared-disk floor"),
            );
        }
        steady::write_timeline(&started_us, &commits);
        if let Some(u) = uploaders.first() {
            println!("steady-state uploader 0: {}", u.summary());
        }
        for u in uploaders {
            u.stop();
        }
        let loads = (warm_secs, settle_secs);
        let floor = quorum_floor(&percentiles(&mut floor_rounds), &rtt);
        (mode, reached, loads, percentiles(&mut commits), floor)
    });

    println!(
        "floors (same run, same disk; the shared-disk ones in {blocks} blocks between the commits'):"
    );
    show("  4 KiB overwrite + fdatasync", &overwrite);
    show("  4 KiB loopback round trip", &rtt);
    show("  quorum floor (sum)", &floor);
    show("  W-th of N concurrent overwrites", &shared);
    show("  shared-disk quorum floor (sum)", &shared_floor);
    show("  W-th of N, O_DIRECT + RWF_DSYNC", &direct);
    show("  the same as a quorum floor (sum)", &direct_floor);
    show(
        &format!("  W-th of the {eager} eager, O_DIRECT"),
        &eager_only,
    );
    show("  the same as a quorum floor (sum)", &eager_floor);
    println!("walrelay, W={w} of N={n}, one replica:");
    show("  commit latency, 1 session", &commit);
    let ratio = commit.ratio_to(&floor);
    println!(
        "  commit / floor                   p50 {:>8.2}x     p99 {:>8.2}x   (target p50 <= 1.5x)",
        ratio.p50_us, ratio.p99_us
    );
    let ratio = commit.ratio_to(&shared_floor);
    println!(
        "  commit / shared-disk floor       p50 {:>8.2}x     p99 {:>8.2}x",
        ratio.p50_us, ratio.p99_us
    );
    let ratio = commit.ratio_to(&direct_floor);
    println!(
        "  commit / O_DIRECT floor          p50 {:>8.2}x     p99 {:>8.2}x   (the followers' kind of write)",
        ratio.p50_us, ratio.p99_us
    );
    let ratio = commit.ratio_to(&eager_floor);
    println!(
        "  commit / eager followers' floor  p50 {:>8.2}x     p99 {:>8.2}x   (the W-th of the eager only)",
        ratio.p50_us, ratio.p99_us
    );
    println!("  eager followers swapped out       {swaps:>8} (during the one-session blocks)");
    if let Some((mode, reached, (warm_secs, settle_secs), steady_commit, steady_floor)) = steady_run
    {
        println!(
            "  steady state ({mode:?}) after {warm_secs:.0} s at 16 sessions and {settle_secs:.0} s at 1: {}",
            if reached {
                "every follower reuses released segments"
            } else {
                "NOT reached (a follower has not yet reused released segments)"
            }
        );
        show("  steady-state commit, 1 session", &steady_commit);
        show("  shared-disk floor, steady phase", &steady_floor);
        let ratio = steady_commit.ratio_to(&steady_floor);
        println!(
            "  steady / shared-disk floor       p50 {:>8.2}x     p99 {:>8.2}x   (its blocks between the windows)",
            ratio.p50_us, ratio.p99_us
        );
        let ratio = steady_commit.ratio_to(&shared_floor);
        println!(
            "  steady / fresh phase's floor     p50 {:>8.2}x     p99 {:>8.2}x",
            ratio.p50_us, ratio.p99_us
        );
    }
    println!("  throughput, 1 session            {one:>10.0} commits/s");
    println!(
        "  throughput, 16 sessions          {sixteen:>10.0} commits/s   ({:.2}x one session)",
        sixteen / one.max(1.0)
    );
    println!(
        "  CPU per commit (all nodes)       1 session {one_cpu_us:>8.1} us   16 sessions {sixteen_cpu_us:>8.1} us"
    );
    let grouped = groups.grouped_writes - groups_before.grouped_writes;
    let group_txns = groups.groups - groups_before.groups;
    println!(
        "  group commit ({}, delay {} us), 16 sessions   {grouped} writes in {group_txns} group transactions ({:.1} each), {} led alone, {} run again alone",
        if cluster::group_commit() { "on" } else { "off" },
        cluster::group_commit_delay_us(),
        grouped as f64 / group_txns.max(1) as f64,
        groups.led_alone - groups_before.led_alone,
        groups.rerun_alone - groups_before.rerun_alone
    );
    if lags.is_empty() {
        println!("  confirm lag: no samples");
    } else {
        show("  confirm lag (quorum -> visible)", &percentiles(&mut lags));
    }
}
