//! The fleet benchmark (`papers/fleet.md`): 100,000 databases created
//! through the HTTP API on this machine, then a query workload over a hot
//! set, with the latency at 10, 1,000, 10,000 and 100,000 databases.
//!
//! One node, in this process, as `walrelay node --control-plane` runs it:
//! the embedded catalog, the routing table, the host (local databases,
//! `synchronous=FULL`), the HTTP API on loopback. Measured:
//!
//! - creation: rate and latency percentiles (4 concurrent clients);
//! - query latency p50/p99 over a hot set of 10 databases at each count,
//!   and its ratio to the 10-database run (target ≤ 1.1×);
//! - memory (RSS) and file descriptors per idle and per open database;
//! - the heartbeat load at this count (beats/s follow open databases) and
//!   the control plane's cost per heartbeat with every row in the catalog;
//! - catalog reads on the query path (must be 0).
//!
//! Run: `cargo bench -p walrelay-benches --bench fleet` (100,000;
//! `WALRELAY_FLEET_DATABASES=N` for another count; `-- --test` for a quick
//! smoke run). Writes `target/fleet-latency.csv`; plot it with
//! `python3 benches/scripts/plot_fleet.py target/fleet-latency.csv papers/fleet-latency.svg`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use walrelay_engine::fleet::catalog::{Catalog, CatalogReads, SqliteCatalog};
use walrelay_engine::fleet::control::{ControlConfig, ControlPlane, Heartbeat, HostApi, HostNode};
use walrelay_engine::fleet::host::{Host, HostConfig, LocalOpener};
use walrelay_engine::fleet::routes::Routes;
use walrelay_engine::fleet::{Fleet, FleetConfig, LocalHostApi};
use walrelay_engine::http::auth::Auth;
use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
use walrelay_engine::{Database, Options};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

fn post(agent: &ureq::Agent, url: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let mut r = agent.post(url).send_json(body).expect("the node answers");
    let status = r.status().as_u16();
    (
        status,
        r.body_mut().read_json().unwrap_or(serde_json::Value::Null),
    )
}

struct Bench {
    url: String,
    fleet: Arc<Fleet>,
    control: Arc<ControlPlane>,
    host: Arc<Host>,
    reads: Arc<CatalogReads>,
    _server: walrelay_engine::http::server::HttpServer,
}

fn start(dir: &std::path::Path) -> Bench {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{addr}");
    let reads = Arc::new(CatalogReads::default());
    let catalog_db = Database::open(dir.join("catalog.db"), Options::default()).unwrap();
    let catalog: Arc<dyn Catalog> =
        Arc::new(SqliteCatalog::open(catalog_db, Arc::clone(&reads)).unwrap());
    let routes = Arc::new(Routes::open(&dir.join("routes.db")).unwrap());
    let host = Arc::new(
        Host::open(
            HostConfig {
                dir: dir.join("dbs"),
                max_open: 0,
                idle_close_ms: 600_000,
                max_hosted: 10_000_000,
            },
            Box::new(LocalOpener {
                options: Options {
                    readers: 1,
                    ..Options::default()
                },
            }),
        )
        .unwrap(),
    );
    let api: Arc<dyn HostApi> = Arc::new(LocalHostApi {
        host: Arc::clone(&host),
        routes: Arc::clone(&routes),
        self_url: url.clone(),
    });
    let control = Arc::new(ControlPlane::new(
        catalog,
        vec![HostNode {
            url: url.clone(),
            location: "local".into(),
            api,
        }],
        ControlConfig::default(),
    ));
    let fleet = Arc::new(Fleet::new(
        FleetConfig::new(url.clone()),
        routes,
        Some(Arc::clone(&host)),
        Some(Arc::clone(&control)),
        Arc::clone(&reads),
    ));
    fleet.start();
    let node = Node::new(
        Role::Fleet,
        HttpConfig {
            database: String::new(),
            ..HttpConfig::default()
        },
        Auth::Insecure,
    )
    .with_fleet(Arc::clone(&fleet));
    let server = serve(Arc::new(node), addr).unwrap();
    Bench {
        url,
        fleet,
        control,
        host,
        reads,
        _server: server,
    }
}

/// Runs `f(agent, i)` for every `i` in `from..to` on `clients` threads and
/// returns each call's latency.
fn drive(
    from: usize,
    to: usize,
    clients: usize,
    f: impl Fn(&ureq::Agent, usize) + Sync,
) -> Vec<Duration> {
    let next = AtomicUsize::new(from);
    let lat = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                let agent = agent();
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= to {
                        break;
                    }
                    let started = Instant::now();
                    f(&agent, i);
                    mine.push(started.elapsed());
                }
                lat.lock().unwrap().extend(mine);
            });
        }
    });
    lat.into_inner().unwrap()
}

/// Creates databases `from..to` through the API; each creation's latency.
fn create(b: &Bench, from: usize, to: usize, clients: usize) -> Vec<Duration> {
    drive(from, to, clients, |agent, i| {
        let (status, body) = post(
            agent,
            &format!("{}/v1/databases", b.url),
            &serde_json::json!({ "name": format!("db-{i}") }),
        );
        assert_eq!(status, 200, "create db-{i}: {body}");
    })
}

/// Query latencies over the hot set (reads by primary key; the hot set's
/// tables were made by `prepare_hot`).
fn workload(b: &Bench, hot: usize, queries: usize, clients: usize) -> Vec<Duration> {
    drive(0, queries, clients, |agent, i| {
        let db = format!("db-{}", i % hot);
        let (status, body) = post(
            agent,
            &format!("{}/v1/databases/{db}/query", b.url),
            &serde_json::json!({"sql": "SELECT v FROM kv WHERE k = ?1", "params": [i % 100]}),
        );
        assert_eq!(status, 200, "query {db}: {body}");
    })
}

fn prepare_hot(b: &Bench, hot: usize) {
    let agent = agent();
    for i in 0..hot {
        let url = format!("{}/v1/databases/db-{i}/query", b.url);
        let (status, body) = post(
            &agent,
            &url,
            &serde_json::json!({"sql": "CREATE TABLE IF NOT EXISTS kv(k INTEGER PRIMARY KEY, v TEXT); \
                INSERT OR IGNORE INTO kv SELECT value, 'value ' || value FROM generate_series(0, 99)"}),
        );
        if status != 200 {
            let (status, body2) = post(
                &agent,
                &url,
                &serde_json::json!({"sql": "CREATE TABLE IF NOT EXISTS kv(k INTEGER PRIMARY KEY, v TEXT); \
                    WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 99) \
                    INSERT OR IGNORE INTO kv SELECT i, 'value ' || i FROM n"}),
            );
            assert_eq!(status, 200, "prepare db-{i}: {body} / {body2}");
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let target: usize = if quick {
        200
    } else {
        std::env::var("WALRELAY_FLEET_DATABASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000)
    };
    let hot = 10;
    let queries = if quick { 200 } else { 20_000 };
    let clients = 4;
    let mut checkpoints: Vec<usize> = [10, 1_000, 10_000, 100_000, 1_000_000]
        .into_iter()
        .filter(|c| *c < target)
        .collect();
    checkpoints.push(target);
    let dir = tempfile::Builder::new()
        .prefix("walrelay-fleet-bench")
        .tempdir_in(std::env::var("WALRELAY_BENCH_DIR").unwrap_or_else(|_| "/tmp".into()))
        .unwrap();
    let b = start(dir.path());
    let (rss0, fds0) = (rss_kib(), fds());
    println!(
        "fleet bench: {target} databases, hot set {hot}, {queries} queries per count, {clients} clients"
    );
    let mut created = 0;
    let mut all_create = Vec::new();
    let mut rows = Vec::new();
    let mut baseline: Option<(Duration, Duration)> = None;
    let mut create_wall = Duration::ZERO;
    for &count in &checkpoints {
        let t = Instant::now();
        let mut lat = create(&b, created, count, clients);
        create_wall += t.elapsed();
        created = count;
        all_create.append(&mut lat);
        if count == checkpoints[0] {
            prepare_hot(&b, hot);
        }
        // Idle databases: everything but the hot set closes.
        b.host.close_idle();
        workload(&b, hot, queries / 10, clients); // warm up
        let mut q = workload(&b, hot, queries, clients);
        q.sort_unstable();
        let (p50, p99) = (pct(&q, 0.50), pct(&q, 0.99));
        let base = *baseline.get_or_insert((p50, p99));
        println!(
            "  {count:>8} databases: query p50 {:>7.1} us p99 {:>7.1} us (x{:.2} / x{:.2} of 10)  rss {} MiB  fds {}  open {}",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            p50.as_secs_f64() / base.0.as_secs_f64(),
            p99.as_secs_f64() / base.1.as_secs_f64(),
            rss_kib() / 1024,
            fds(),
            b.host.open_ids().len(),
        );
        rows.push((count, p50, p99, rss_kib(), fds()));
    }
    all_create.sort_unstable();
    println!(
        "creation: {} databases in {:.1} s = {:.0}/s with {clients} clients; p50 {:.2} ms p99 {:.2} ms",
        all_create.len(),
        create_wall.as_secs_f64(),
        all_create.len() as f64 / create_wall.as_secs_f64(),
        pct(&all_create, 0.5).as_secs_f64() * 1e3,
        pct(&all_create, 0.99).as_secs_f64() * 1e3,
    );
    // Idle cost: memory and descriptors per database created (the hot set
    // stays open throughout, so the difference is the idle ones').
    let (rss_n, fds_n) = (rss_kib(), fds());
    println!(
        "idle: {:.2} KiB of memory and {:.4} fds per database ({} databases; rss {} -> {} MiB, fds {fds0} -> {fds_n}); disk per idle database: {:.1} KiB",
        (rss_n.saturating_sub(rss0)) as f64 / target as f64,
        (fds_n as f64 - fds0 as f64) / target as f64,
        target,
        rss0 / 1024,
        rss_n / 1024,
        dir_kib(&dir.path().join("dbs")) as f64 / target as f64,
    );
    // Open cost: open `k` more databases (one query each, which also
    // creates its file) and see what it takes.
    let k = if quick { 20 } else { 500 }.min(target - hot);
    let (rss_a, fds_a) = (rss_kib(), fds());
    let agent = agent();
    for i in hot..hot + k {
        let (status, body) = post(
            &agent,
            &format!("{}/v1/databases/db-{i}/query", b.url),
            &serde_json::json!({"sql": "SELECT 1"}),
        );
        assert_eq!(status, 200, "{body}");
    }
    let (rss_b, fds_b) = (rss_kib(), fds());
    println!(
        "open: {:.1} KiB of memory and {:.2} fds per open database ({k} opened; {} open now, cap {})",
        rss_b.saturating_sub(rss_a) as f64 / k as f64,
        (fds_b as f64 - fds_a as f64) / k as f64,
        b.host.open_ids().len(),
        b.host.max_open(),
    );
    // Heartbeats: open databases beat every 30 s (+ up to 5 s jitter);
    // the control plane's cost per beat with every database in the catalog.
    let open = b.host.open_ids();
    let n = if quick { 200 } else { 5_000 };
    let states: Vec<_> = open
        .iter()
        .filter_map(|id| b.host.state(*id).ok().flatten())
        .collect();
    let t = Instant::now();
    for i in 0..n {
        let s = &states[i % states.len()];
        b.control
            .heartbeat(&Heartbeat {
                uuid: s.uuid.clone(),
                database_id: s.database_id,
                node: b.url.clone(),
            })
            .unwrap();
    }
    let per_beat = t.elapsed() / n as u32;
    println!(
        "heartbeats: {} open databases beat {:.1}/s at a 30 s interval; the control plane answers one in {:.1} us ({:.0} beats/s per core), so {target} active databases would need {:.2} cores",
        open.len(),
        open.len() as f64 / 32.5,
        per_beat.as_secs_f64() * 1e6,
        1.0 / per_beat.as_secs_f64(),
        target as f64 / 32.5 * per_beat.as_secs_f64(),
    );
    println!(
        "catalog reads: {} in all (creation, heartbeats), {} on the query path (must be 0); queries served {}",
        b.reads.total(),
        b.reads.on_query_path(),
        b.fleet.stats.queries.load(Ordering::Relaxed),
    );
    assert_eq!(
        b.reads.on_query_path(),
        0,
        "the query path read the catalog"
    );
    let csv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fleet-latency.csv");
    let mut text = String::from("databases,p50_us,p99_us,rss_kib,fds\n");
    for (count, p50, p99, rss, fds) in &rows {
        text.push_str(&format!(
            "{count},{:.1},{:.1},{rss},{fds}\n",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        ));
    }
    std::fs::write(&csv, text).unwrap();
    println!("wrote {}", csv.display());
    b.fleet.stop();
}

fn dir_kib(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-sk"])
        .arg(path)
        .output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}
