//! What authenticating the replication ports costs, measured in one run.
//!
//! Two clusters in this process, alike but for the key: a primary, N
//! followers (W a majority) and one replica each, over loopback TCP on
//! the same disk — one with `auth: None`, one with a cluster key (the
//! handshake at connection start, a BLAKE3 tag on every frame). One session
//! commits on each in alternating rounds, so drift in the machine's load
//! hits both alike. Reported: commit latency (p50, p99) and confirm lag
//! (quorum -> visible on the replica) for each, the keyed/open ratios, and
//! the tag's own cost per 4 KiB frame.
//!
//! `cargo bench -p walrelay-benches --bench replication_auth` (full run);
//! `-- --test` runs a few iterations only (CI).

use std::time::{Duration, Instant};
use walrelay_benches::cluster::{self, BenchCluster};
use walrelay_benches::floor::{Percentiles, percentiles};
use walrelay_engine::{Constraint, Session, Value};
use walrelay_replicator::ClusterKey;

fn session(c: &BenchCluster) -> Session {
    let s = c
        .primary
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        .run()
        .expect("create");
    s
}

fn commit(s: &Session, row: &Value) -> Duration {
    let t = Instant::now();
    s.prepare("INSERT INTO t(v) VALUES (?1)")
        .bind([row.clone()])
        .run()
        .expect("insert");
    t.elapsed()
}

fn show(name: &str, p: &Percentiles) {
    println!(
        "{name:<34} p50 {:>8.1} us   p99 {:>8.1} us   mean {:>8.1} us",
        p.p50_us, p.p99_us, p.mean_us
    );
}

fn lags(c: &BenchCluster) -> Vec<Duration> {
    c.replica
        .node()
        .take_confirm_lags_us()
        .into_iter()
        .map(Duration::from_micros)
        .collect()
}

/// The tag on one Append of a 4 KiB page (frame header, record header,
/// page), as the transports compute it: keyed BLAKE3 over the sequence
/// number and the frame's parts.
fn tag_cost(iterations: usize) -> Percentiles {
    let key = [7u8; 32];
    let head = [0u8; 6];
    let record = vec![9u8; 4096 + 64];
    let mut samples = Vec::with_capacity(iterations);
    for seq in 0..iterations as u64 {
        let t = Instant::now();
        let mut h = blake3::Hasher::new_keyed(&key);
        h.update(&seq.to_be_bytes());
        h.update(&head);
        h.update(&record);
        std::hint::black_box(h.finalize());
        samples.push(t.elapsed());
    }
    percentiles(&mut samples)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let (rounds, per_round, tag_iters) = if quick {
        (2, 10, 100)
    } else {
        (20, 150, 100_000)
    };
    let n: usize = std::env::var("WALRELAY_BENCH_FOLLOWERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let root = tempfile::tempdir_in(std::env::var("WALRELAY_BENCH_DIR").unwrap_or(".".into()))
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");
    let open_dir = root.path().join("open");
    let keyed_dir = root.path().join("keyed");
    let open = cluster::start(&open_dir, n, None);
    let keyed = cluster::start(
        &keyed_dir,
        n,
        Some(ClusterKey::generate().expect("cluster key")),
    );
    println!(
        "transport {}, W={} of N={n}, one replica each",
        keyed.primary.leader().backend(),
        n / 2 + 1
    );
    let (so, sk) = (session(&open), session(&keyed));
    let row = Value::Blob(vec![7u8; 100]);
    for _ in 0..per_round {
        commit(&so, &row);
        commit(&sk, &row);
    }
    let _ = (lags(&open), lags(&keyed));
    let (mut open_commit, mut keyed_commit) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always follows the other.
        let order: [(&Session, &mut Vec<Duration>); 2] = if round % 2 == 0 {
            [(&so, &mut open_commit), (&sk, &mut keyed_commit)]
        } else {
            [(&sk, &mut keyed_commit), (&so, &mut open_commit)]
        };
        for (s, out) in order {
            for _ in 0..per_round {
                out.push(commit(s, &row));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let (mut open_lag, mut keyed_lag) = (lags(&open), lags(&keyed));
    assert_eq!(keyed.primary.leader().auth_refusals(), 0);

    let open_commit = percentiles(&mut open_commit);
    let keyed_commit = percentiles(&mut keyed_commit);
    println!(
        "commit latency, 1 session ({} commits each):",
        rounds * per_round
    );
    show("  open (auth: None)", &open_commit);
    show("  authenticated (cluster key)", &keyed_commit);
    let r = keyed_commit.ratio_to(&open_commit);
    println!(
        "  authenticated / open             p50 {:>8.3}x     p99 {:>8.3}x",
        r.p50_us, r.p99_us
    );
    if open_lag.is_empty() || keyed_lag.is_empty() {
        println!("confirm lag: no samples");
    } else {
        let (o, k) = (percentiles(&mut open_lag), percentiles(&mut keyed_lag));
        println!("confirm lag (quorum -> visible on the replica):");
        show("  open", &o);
        show("  authenticated", &k);
        let r = k.ratio_to(&o);
        println!(
            "  authenticated / open             p50 {:>8.3}x     p99 {:>8.3}x",
            r.p50_us, r.p99_us
        );
    }
    show("BLAKE3 tag of a 4 KiB Append", &tag_cost(tag_iters));
}
