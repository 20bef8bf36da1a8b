//! Latency over HTTP on loopback: reads on a replica against the primary,
//! writes forwarded by a replica against writes sent to the primary.
//!
//! A `LocalCluster` (a primary, five followers with W = 3, one replica, each
//! node with its HTTP endpoint on 127.0.0.1) runs in this process. One
//! client sends sequential requests. Reported, each as p50/p99/mean:
//! - a point read (`SELECT v FROM kv WHERE id = ?1`, 10,000 rows, a random
//!   id) sent to the primary and to the replica (a session whose bookmark
//!   the replica has already reached, and `first-unconstrained`), and the
//!   replica/primary ratio;
//! - a small INSERT sent to the primary and sent to the replica, which
//!   forwards it (a fresh `first-unconstrained` session per write, and one
//!   session carrying its bookmark from write to write), the ratio and the
//!   forwarding overhead (difference of p50s);
//! - floors from the same run: `SELECT 1` over HTTP to each node (the HTTP
//!   stack + JSON + a trivial statement), `SELECT 1` sent to the replica
//!   under `first-primary` (one forwarding hop with no write behind it), the
//!   same statements in process through the engine (no HTTP), and a raw
//!   loopback TCP round trip.
//!
//! Series of one phase are measured in rotating chunks so that drift over
//! the run spreads evenly over them. Nothing about timing is asserted.
//!
//! `cargo bench -p walrelay-benches --bench http` (full run);
//! `-- --test` runs a few iterations only (CI). The cluster lives in a
//! temporary directory under `WALRELAY_BENCH_DIR` (default: the current
//! directory, so the disk is the real one). `WALRELAY_BENCH_FOLLOWERS=n`
//! changes N (W is a majority of it).

use std::time::{Duration, Instant};
use walrelay_benches::floor::{Percentiles, loopback_round_trip, percentiles};
use walrelay_engine::http::api::{Body, Statement};
use walrelay_engine::http::client::Reply;
use walrelay_engine::local_cluster::{LocalCluster, LocalClusterConfig};
use walrelay_engine::{Bookmark, Constraint, Value};

const ROWS: i64 = 10_000;
const POINT_READ: &str = "SELECT v FROM kv WHERE id = ?1";
const INSERT: &str = "INSERT INTO w(v) VALUES (randomblob(100))";
/// Roughly the size of one of these HTTP requests, for the TCP floor.
const REQUEST_BYTES: usize = 256;

/// xorshift64*: reproducible ids without a dependency.
struct Rng(u64);

impl Rng {
    fn id(&mut self) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (r % ROWS as u64) as i64 + 1
    }
}

/// One measured series: `run` does one request for the given id and
/// returns its duration (building the request is not timed).
struct Series<'a> {
    name: &'static str,
    run: Box<dyn FnMut(i64) -> Duration + 'a>,
}

fn series<'a>(name: &'static str, run: impl FnMut(i64) -> Duration + 'a) -> Series<'a> {
    Series {
        name,
        run: Box::new(run),
    }
}

/// Warms every series up, then measures `iters` requests of each in
/// chunks of `chunk`, rotating which series goes first.
fn measure(
    series: &mut [Series<'_>],
    warmup: usize,
    iters: usize,
    chunk: usize,
    rng: &mut Rng,
) -> Vec<Percentiles> {
    for s in series.iter_mut() {
        for _ in 0..warmup {
            (s.run)(rng.id());
        }
    }
    let mut samples: Vec<Vec<Duration>> =
        series.iter().map(|_| Vec::with_capacity(iters)).collect();
    let mut round = 0;
    while samples[0].len() < iters {
        let n = chunk.min(iters - samples[0].len());
        for k in 0..series.len() {
            let i = (round + k) % series.len();
            for _ in 0..n {
                let id = rng.id();
                samples[i].push((series[i].run)(id));
            }
        }
        round += 1;
    }
    samples.iter_mut().map(|s| percentiles(s)).collect()
}

fn one(sql: &str, params: Vec<Value>) -> Body {
    Body::One(Statement {
        sql: sql.into(),
        params,
    })
}

fn show(name: &str, p: &Percentiles) {
    println!(
        "  {name:<48} p50 {:>8.1} us   p99 {:>8.1} us   mean {:>8.1} us",
        p.p50_us, p.p99_us, p.mean_us
    );
}

fn show_ratio(name: &str, a: &Percentiles, b: &Percentiles) {
    let r = a.ratio_to(b);
    println!(
        "  {name:<48} p50 {:>8.2}x     p99 {:>8.2}x     mean {:>8.2}x",
        r.p50_us, r.p99_us, r.mean_us
    );
}

fn show_diff(name: &str, a: &Percentiles, b: &Percentiles) {
    println!(
        "  {name:<48} p50 {:>+8.1} us   p99 {:>+8.1} us   mean {:>+8.1} us",
        a.p50_us - b.p50_us,
        a.p99_us - b.p99_us,
        a.mean_us - b.mean_us
    );
}

/// Where a reply was served, checked (not timed) so that each series
/// measures the path its name says.
fn served_by_primary(r: &Reply) -> bool {
    r.response.result[0].meta.served_by_primary
}

fn wait_replica(c: &LocalCluster, b: Bookmark) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.replicas.iter().any(|r| r.replica().confirmed() < b) {
        assert!(Instant::now() < deadline, "the replica never reached {b}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The 1-minute load average (Linux), printed because a busy machine
/// shows in every tail here.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn main() {
    let load_before = load();
    let quick = std::env::args().any(|a| a == "--test");
    let (warmup, iters, chunk) = if quick { (5, 20, 5) } else { (200, 2_000, 50) };
    let root = tempfile::tempdir_in(std::env::var("WALRELAY_BENCH_DIR").unwrap_or(".".into()))
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");
    // As in the quorum bench, N can be changed to see how much of the cost
    // is five followers sharing this machine's disk and cores.
    let n: usize = std::env::var("WALRELAY_BENCH_FOLLOWERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let c = LocalCluster::start(
        root.path(),
        LocalClusterConfig {
            followers: n,
            replica_regions: vec!["region-a".into()],
            ..LocalClusterConfig::default()
        },
    )
    .expect("cluster");
    println!(
        "one process: primary + {n} followers (W={}) + {} replica, HTTP on loopback; \
         transport {} / follower storage {}",
        n / 2 + 1,
        c.replicas.len(),
        c.primary.leader().backend(),
        c.followers[0].storage_backend()
    );

    // The data, written in process (setup is not measured).
    let setup = c
        .primary
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    setup
        .prepare("CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .run()
        .expect("create kv");
    setup
        .prepare("CREATE TABLE w(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .run()
        .expect("create w");
    setup
        .prepare(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
             INSERT INTO kv(id, v) SELECT i, hex(randomblob(50)) FROM n",
        )
        .bind([Value::Integer(ROWS)])
        .run()
        .expect("fill kv");
    wait_replica(&c, setup.bookmark().expect("wrote"));

    let client = c.client("region-a");
    let primary_url = c.primary_http.url();
    let replica_url = c.replica_http[0].url();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);

    // Raw TCP first, on its own: the least any request here can cost.
    let mut rtt = loopback_round_trip(REQUEST_BYTES, iters).expect("loopback floor");
    let rtt = percentiles(&mut rtt);

    // Reads: no writes run meanwhile, so every bookmark is reached.
    let read_body = |id: i64| one(POINT_READ, vec![Value::Integer(id)]);
    let select1 = one("SELECT 1 AS one", vec![]);
    let p_session = client.session("first-unconstrained");
    let r_session = client.session("first-unconstrained");
    let p_select1 = client.session("first-unconstrained");
    let r_select1 = client.session("first-unconstrained");
    let e_primary = c
        .primary
        .database()
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    let e_replica = c.replicas[0]
        .replica()
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    let mut reads = vec![
        series("primary: point read", |id| {
            let b = read_body(id);
            let t = Instant::now();
            let r = p_session.query_via(&primary_url, &b).expect("read");
            let d = t.elapsed();
            assert!(served_by_primary(&r));
            d
        }),
        series("replica: point read (bookmark reached)", |id| {
            let b = read_body(id);
            let t = Instant::now();
            let r = r_session.query_via(&replica_url, &b).expect("read");
            let d = t.elapsed();
            assert!(!served_by_primary(&r), "the replica served it");
            d
        }),
        series("replica: point read (first-unconstrained)", |id| {
            let b = read_body(id);
            let s = client.session("first-unconstrained");
            let t = Instant::now();
            let r = s.query_via(&replica_url, &b).expect("read");
            let d = t.elapsed();
            assert!(!served_by_primary(&r), "the replica served it");
            d
        }),
        series("primary: SELECT 1", |_| {
            let t = Instant::now();
            p_select1
                .query_via(&primary_url, &select1)
                .expect("select 1");
            t.elapsed()
        }),
        series("replica: SELECT 1", |_| {
            let t = Instant::now();
            let r = r_select1
                .query_via(&replica_url, &select1)
                .expect("select 1");
            let d = t.elapsed();
            assert!(!served_by_primary(&r), "the replica served it");
            d
        }),
        series("replica: SELECT 1 forwarded (first-primary)", |_| {
            let s = client.session("first-primary");
            let t = Instant::now();
            let r = s.query_via(&replica_url, &select1).expect("select 1");
            let d = t.elapsed();
            assert!(served_by_primary(&r), "forwarded");
            d
        }),
        series("in process, primary: point read", |id| {
            let t = Instant::now();
            e_primary
                .prepare(POINT_READ)
                .bind([Value::Integer(id)])
                .all()
                .expect("read");
            t.elapsed()
        }),
        series("in process, replica: point read", |id| {
            let t = Instant::now();
            e_replica
                .prepare(POINT_READ)
                .bind([Value::Integer(id)])
                .all()
                .expect("read");
            t.elapsed()
        }),
        series("in process, primary: SELECT 1", |_| {
            let t = Instant::now();
            e_primary
                .prepare("SELECT 1 AS one")
                .all()
                .expect("select 1");
            t.elapsed()
        }),
    ];
    let names: Vec<&str> = reads.iter().map(|s| s.name).collect();
    let r = measure(&mut reads, warmup, iters, chunk, &mut rng);
    drop(reads);
    let [
        p_read,
        r_read,
        r_read_u,
        p_one,
        r_one,
        f_one,
        e_p_read,
        e_r_read,
        e_p_one,
    ] = r[..]
    else {
        unreachable!("nine read series")
    };

    // Writes: 100 random bytes each.
    let write_body = || one(INSERT, vec![]);
    let direct = client.session("first-unconstrained");
    let carried = client.session("first-unconstrained");
    let e_writer = c
        .primary
        .database()
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    // The servers' own clocks (`meta.duration`: from the write's start on
    // the primary to its confirmation), beside the clients': what a write
    // costs outside and inside the server's write path.
    let server_us = std::cell::RefCell::new(Vec::with_capacity(iters + warmup));
    let engine_us = std::cell::RefCell::new(Vec::with_capacity(iters + warmup));
    let mut writes = vec![
        series("primary: INSERT (direct)", |_| {
            let b = write_body();
            let t = Instant::now();
            let r = direct.query_via(&primary_url, &b).expect("write");
            let d = t.elapsed();
            let ms = r.response.result[0].meta.duration;
            server_us
                .borrow_mut()
                .push(Duration::from_secs_f64(ms / 1000.0));
            d
        }),
        series("replica: INSERT forwarded (first-unconstrained)", |_| {
            let b = write_body();
            let s = client.session("first-unconstrained");
            let t = Instant::now();
            let r = s.query_via(&replica_url, &b).expect("write");
            let d = t.elapsed();
            assert!(served_by_primary(&r), "forwarded");
            d
        }),
        series("replica: INSERT forwarded (session bookmark)", |_| {
            let b = write_body();
            let t = Instant::now();
            let r = carried.query_via(&replica_url, &b).expect("write");
            let d = t.elapsed();
            assert!(served_by_primary(&r), "forwarded");
            d
        }),
        series("in process, primary: INSERT", |_| {
            let t = Instant::now();
            let r = e_writer.prepare(INSERT).run().expect("write");
            let d = t.elapsed();
            engine_us
                .borrow_mut()
                .push(Duration::from_micros(r.meta.duration_us));
            d
        }),
    ];
    let write_names: Vec<&str> = writes.iter().map(|s| s.name).collect();
    let w = measure(&mut writes, warmup, iters, chunk, &mut rng);
    drop(writes);
    let [w_direct, w_fwd_u, w_fwd_s, e_write] = w[..] else {
        unreachable!("four write series")
    };
    // Warm-up samples included: a few hundred of thousands move no p50.
    let server = percentiles(&mut server_us.into_inner());
    let engine = percentiles(&mut engine_us.into_inner());

    println!(
        "{iters} sequential requests per series after {warmup} warm-up, one client \
         (load average {load_before} before, {} after):",
        load()
    );
    println!("floors:");
    show("raw loopback TCP round trip (256 B -> 8 B)", &rtt);
    for (name, p) in names.iter().zip(&r).skip(3) {
        show(name, p);
    }
    println!("reads (point read by primary key, {ROWS} rows):");
    for (name, p) in names.iter().zip(&r).take(3) {
        show(name, p);
    }
    show_ratio("replica / primary (bookmark reached)", &r_read, &p_read);
    show_ratio(
        "replica / primary (first-unconstrained)",
        &r_read_u,
        &p_read,
    );
    show_diff(
        "HTTP + JSON on the primary (HTTP - in process)",
        &p_read,
        &e_p_read,
    );
    show_diff(
        "HTTP + JSON on the replica (HTTP - in process)",
        &r_read,
        &e_r_read,
    );
    show_diff("SELECT 1: HTTP - in process (primary)", &p_one, &e_p_one);
    show_diff("replica SELECT 1 - primary SELECT 1", &r_one, &p_one);
    show_diff("forwarding hop, no write (fwd - SELECT 1)", &f_one, &p_one);
    println!(
        "writes (INSERT of 100 bytes, quorum commit W={} of N={n}):",
        n / 2 + 1
    );
    for (name, p) in write_names.iter().zip(&w) {
        show(name, p);
    }
    show_ratio(
        "forwarded / direct (first-unconstrained)",
        &w_fwd_u,
        &w_direct,
    );
    show_ratio("forwarded / direct (session bookmark)", &w_fwd_s, &w_direct);
    show_diff(
        "forwarding overhead (first-unconstrained)",
        &w_fwd_u,
        &w_direct,
    );
    show_diff(
        "forwarding overhead (session bookmark)",
        &w_fwd_s,
        &w_direct,
    );
    show_diff(
        "HTTP + JSON on a direct write (HTTP - in proc)",
        &w_direct,
        &e_write,
    );
    println!("the servers' own clocks (meta.duration, start of the write to its confirmation):");
    show("primary: INSERT (direct), server's duration", &server);
    show("in process, primary: INSERT, engine's duration", &engine);
    show_diff("direct INSERT: client - server", &w_direct, &server);
    show_diff("server - engine (the HTTP write path)", &server, &engine);
}
