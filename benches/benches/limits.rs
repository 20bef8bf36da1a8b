//! What runaway queries cost everyone else: `SELECT 1` and one-row writes
//! over HTTP, with and without 8 runaway queries running on the same node.
//!
//! One process: a primary (`Database`, no followers) behind its HTTP
//! server on 127.0.0.1. A client sends sequential requests:
//! - `SELECT 1 AS one` (a reader; the HTTP stack + JSON + a trivial read);
//! - `INSERT INTO w(v) VALUES (?1)`, 100 bytes of text (the writer).
//!
//! Both are measured twice: on an idle node, then while 8 other clients
//! each keep one runaway read (`WITH RECURSIVE ... SELECT count(*)`, never
//! ending on its own) running over HTTP; each runaway stops at the query
//! time limit (set to 2 s here) and its client sends it again. Reported:
//! p50/p99/mean of each series and the loaded/idle ratios. Nothing about
//! timing is asserted.
//!
//! `cargo bench -p walrelay-benches --bench limits` (full run); `-- --test`
//! runs a few iterations only (CI). The database lives in a temporary
//! directory under `WALRELAY_BENCH_DIR` (default: the current directory).
//! `WALRELAY_BENCH_SYNC=normal` commits without an fsync per commit
//! (default: full), to see how much of a write's slowdown is waking from
//! its fsync behind the runaways.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_benches::floor::{Percentiles, percentiles};
use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
use walrelay_engine::{Constraint, Database, Limits, Options, Synchronous};

const RUNAWAY: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
const RUNAWAYS: usize = 8;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

fn post(agent: &ureq::Agent, url: &str, body: &str) -> u16 {
    let mut r = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
        .expect("an answer");
    let _ = r.body_mut().read_to_vec();
    r.status().as_u16()
}

/// `iters` requests of each series after `warmup`, alternating the two
/// series in chunks of 10 so drift spreads over both.
fn measure(url: &str, warmup: usize, iters: usize) -> (Percentiles, Percentiles) {
    let a = agent();
    let select1 = r#"{"sql":"SELECT 1 AS one"}"#;
    let insert = format!(
        r#"{{"sql":"INSERT INTO w(v) VALUES (?1)","params":["{}"]}}"#,
        "x".repeat(100)
    );
    for _ in 0..warmup {
        assert_eq!(post(&a, url, select1), 200);
        assert_eq!(post(&a, url, &insert), 200);
    }
    let (mut reads, mut writes) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    while reads.len() < iters {
        for _ in 0..10.min(iters - reads.len()) {
            let t = Instant::now();
            assert_eq!(post(&a, url, select1), 200, "SELECT 1 answered");
            reads.push(t.elapsed());
        }
        for _ in 0..10.min(iters - writes.len()) {
            let t = Instant::now();
            assert_eq!(post(&a, url, &insert), 200, "INSERT answered");
            writes.push(t.elapsed());
        }
    }
    (percentiles(&mut reads), percentiles(&mut writes))
}

fn show(name: &str, p: &Percentiles) {
    println!(
        "  {name:<40} p50 {:>9.1} us   p99 {:>9.1} us   mean {:>9.1} us",
        p.p50_us, p.p99_us, p.mean_us
    );
}

fn show_ratio(name: &str, a: &Percentiles, b: &Percentiles) {
    let r = a.ratio_to(b);
    println!(
        "  {name:<40} p50 {:>9.2}x     p99 {:>9.2}x     mean {:>9.2}x",
        r.p50_us, r.p99_us, r.mean_us
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let (warmup, iters) = if quick { (3, 20) } else { (100, 1_000) };
    let root = tempfile::tempdir_in(std::env::var("WALRELAY_BENCH_DIR").unwrap_or(".".into()))
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");
    let db = Database::open(
        root.path().join("limits.db"),
        Options {
            limits: Limits {
                query_timeout_ms: 2_000,
                ..Limits::default()
            },
            synchronous: match std::env::var("WALRELAY_BENCH_SYNC").as_deref() {
                Ok("normal") => Synchronous::Normal,
                _ => Synchronous::Full,
            },
            ..Options::default()
        },
    )
    .expect("open");
    db.session(Constraint::FirstPrimary)
        .expect("session")
        .prepare("CREATE TABLE w(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .run()
        .expect("create");
    let server = serve(
        Arc::new(Node::new(
            Role::Primary(db.clone()),
            HttpConfig::default(),
            walrelay_engine::http::auth::Auth::Insecure,
        )),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .expect("serve");
    let url = format!("{}/v1/databases/main/query", server.url());

    let (idle_read, idle_write) = measure(&url, warmup, iters);

    let done = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicU64::new(0));
    let runaways: Vec<_> = (0..RUNAWAYS)
        .map(|_| {
            let (url, done, timed_out) = (url.clone(), Arc::clone(&done), Arc::clone(&timed_out));
            std::thread::spawn(move || {
                let a = agent();
                let body = serde_json::json!({ "sql": RUNAWAY }).to_string();
                while !done.load(Ordering::Relaxed) {
                    if post(&a, &url, &body) == 400 {
                        timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.readers_in_use().0 < RUNAWAYS {
        assert!(Instant::now() < deadline, "the runaways never all ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = Instant::now();
    let (busy_read, busy_write) = measure(&url, warmup, iters);
    let busy_secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    // Ends the runaways now rather than at their time limit.
    db.stop_queries();
    for r in runaways {
        let _ = r.join();
    }
    drop(server);

    println!(
        "{iters} sequential requests per series after {warmup} warm-up; {RUNAWAYS} runaway \
         reads (2 s limit, resent when stopped; {} stopped at the limit during the {busy_secs:.1} s \
         loaded phase), {} cores, synchronous={}:",
        timed_out.load(Ordering::Relaxed),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::var("WALRELAY_BENCH_SYNC").unwrap_or("full".into())
    );
    show("idle: SELECT 1", &idle_read);
    show("idle: INSERT one row", &idle_write);
    show("8 runaways: SELECT 1", &busy_read);
    show("8 runaways: INSERT one row", &busy_write);
    show_ratio("SELECT 1, runaways / idle", &busy_read, &idle_read);
    show_ratio("INSERT, runaways / idle", &busy_write, &idle_write);
}
