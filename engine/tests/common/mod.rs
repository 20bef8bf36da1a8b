//! Shared test support: a recording sink, page-set replay, the logical-page
//! oracle, the randomized workload generator, a local cluster's
//! credentials, and for tests with real processes ([`procs`]): `walrelay`
//! children, loopback ports and cluster key files.
#![allow(dead_code)] // each test binary uses a different part

pub mod consistency;
pub mod fleet;
pub mod gate;
pub mod http_kit;
pub mod pg;
pub mod procs;
pub mod raw_http;
pub mod redis;
pub mod up;

#[allow(unused_imports)] // not every test binary runs processes
pub use procs::*;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use walrelay_engine::local_cluster::LocalCluster;
use walrelay_engine::{
    Bookmark, CapturedTransaction, CheckpointMode, Database, PageSet, QueryError, Session,
    TransactionSink, Value,
};

/// What `PRAGMA integrity_check` says through `s` ("ok" when sound).
pub fn integrity(s: &Session) -> String {
    s.prepare("PRAGMA integrity_check")
        .first()
        .expect("integrity_check runs")
        .and_then(|row| {
            row.get("integrity_check")
                .and_then(|v| v.as_str().map(String::from))
        })
        .unwrap_or_default()
}

/// Remembers every committed transaction with its bookmark.
#[derive(Default)]
pub struct Recorder {
    pub txns: Mutex<Vec<(Bookmark, CapturedTransaction)>>,
}

impl TransactionSink for Recorder {
    fn committed(
        &self,
        bookmark: Bookmark,
        txn: &CapturedTransaction,
    ) -> Result<(), walrelay_engine::ShipError> {
        self.txns
            .lock()
            .expect("recorder lock")
            .push((bookmark, txn.clone()));
        Ok(())
    }
}

impl Recorder {
    pub fn len(&self) -> usize {
        self.txns.lock().expect("recorder lock").len()
    }
    pub fn since(&self, from: usize) -> Vec<(Bookmark, CapturedTransaction)> {
        self.txns.lock().expect("recorder lock")[from..].to_vec()
    }
}

/// `Authorization: Bearer <token>` for a local cluster's admin token.
pub fn admin_bearer(c: &LocalCluster) -> String {
    c.admin_token()
        .expect("the cluster runs with authentication")
        .bearer()
}

/// `GET {base}/metrics` with the cluster's admin token: the exposition.
pub fn metrics_text(c: &LocalCluster, base: &str) -> String {
    let mut resp = ureq::get(format!("{base}/metrics"))
        .header("authorization", admin_bearer(c))
        .call()
        .unwrap_or_else(|e| panic!("GET {base}/metrics: {e}"));
    assert_eq!(resp.status().as_u16(), 200);
    resp.body_mut().read_to_string().expect("metrics text")
}

/// Creates an empty WAL-mode database with the given page size, as a user
/// might hand walrelay.
pub fn create_db(path: &Path, page_size: u32) {
    let c = rusqlite::Connection::open(path).expect("create");
    c.execute_batch(&format!(
        "PRAGMA page_size={page_size}; PRAGMA journal_mode=WAL;"
    ))
    .expect("wal");
}

/// Applies a page set to a database file copy.
pub fn apply(file: &Path, ps: &PageSet) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .expect("open copy");
    for (no, image) in ps.pages() {
        f.write_all_at(image, no.file_offset(ps.page_size()))
            .expect("write page");
    }
    f.set_len(u64::from(ps.db_size_pages()) * u64::from(ps.page_size()))
        .expect("truncate copy");
}

/// The database's pages as SQLite itself sees them in a new read
/// transaction (`sqlite_dbpage`, which clients' SQL cannot reach).
pub fn logical_pages(s: &Session) -> Vec<Vec<u8>> {
    s.page_images().expect("page images")
}

/// Asserts that `copy` equals the primary page for page; returns the count.
pub fn assert_same_pages(copy: &Path, s: &Session, context: &str) -> usize {
    let want = logical_pages(s);
    let got = std::fs::read(copy).expect("read copy");
    let ps = want.first().map_or(0, Vec::len);
    assert_eq!(
        got.len(),
        want.len() * ps,
        "{context}: database size differs"
    );
    for (i, page) in want.iter().enumerate() {
        if got[i * ps..(i + 1) * ps] != page[..] {
            panic!("{context}: page {} differs", i + 1);
        }
    }
    want.len()
}

/// Number of tests seeds / steps: bounded by default, large with
/// WALRELAY_SOAK=1.
pub fn soak() -> bool {
    std::env::var("WALRELAY_SOAK").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// Which seed(s) to run: WALRELAY_SEED replays one; otherwise fresh seeds
/// from the clock, printed so a failure can be replayed.
pub fn seeds(default_count: usize, soak_count: usize) -> Vec<u64> {
    if let Ok(s) = std::env::var("WALRELAY_SEED") {
        return vec![s.parse().expect("WALRELAY_SEED is a u64")];
    }
    let n = if soak() { soak_count } else { default_count };
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (0..n as u64)
        .map(|i| base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect()
}

/// One step of the randomized workload.
#[derive(Debug, Clone)]
pub enum Op {
    Insert {
        table: usize,
        sizes: Vec<usize>,
    },
    InsertBatch {
        table: usize,
        sizes: Vec<usize>,
    },
    Update {
        table: usize,
        every: i64,
        size: usize,
    },
    Delete {
        table: usize,
        modulo: i64,
        rem: i64,
    },
    CreateTable,
    DropTable {
        table: usize,
    },
    CreateIndex {
        table: usize,
    },
    AddColumn {
        table: usize,
    },
    Vacuum,
    SavepointRollback {
        table: usize,
        kept: Vec<usize>,
        undone: Vec<usize>,
    },
    FailingBatch {
        table: usize,
        sizes: Vec<usize>,
    },
    Checkpoint(CheckpointMode),
}

/// The workload generator: random ops over a small, evolving schema.
pub struct Workload {
    pub rng: SmallRng,
    pub page_size: usize,
    tables: Vec<Option<TableState>>,
}

#[derive(Clone)]
struct TableState {
    columns: usize,
    indexed: bool,
}

impl Workload {
    pub fn new(seed: u64, page_size: usize) -> Workload {
        Workload {
            rng: SmallRng::seed_from_u64(seed),
            page_size,
            tables: Vec::new(),
        }
    }

    fn live_table(&mut self) -> Option<usize> {
        let live: Vec<usize> = self
            .tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some())
            .map(|(i, _)| i)
            .collect();
        if live.is_empty() {
            None
        } else {
            Some(live[self.rng.random_range(0..live.len())])
        }
    }

    /// Payload sizes: mostly small, some spanning several overflow pages.
    fn sizes(&mut self, n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| match self.rng.random_range(0..10) {
                0..=5 => self.rng.random_range(0..200),
                6..=8 => self.rng.random_range(200..self.page_size * 2),
                _ => self
                    .rng
                    .random_range(self.page_size * 2..self.page_size * 6),
            })
            .collect()
    }

    pub fn next_op(&mut self) -> Op {
        let Some(t) = self.live_table() else {
            return Op::CreateTable;
        };
        let n = self.rng.random_range(1..12);
        match self.rng.random_range(0..100) {
            0..=24 => Op::Insert {
                table: t,
                sizes: self.sizes(n),
            },
            25..=39 => Op::InsertBatch {
                table: t,
                sizes: self.sizes(n * 4),
            },
            40..=49 => Op::Update {
                table: t,
                every: self.rng.random_range(2..6),
                size: self.sizes(1)[0],
            },
            50..=57 => Op::Delete {
                table: t,
                modulo: self.rng.random_range(2..5),
                rem: self.rng.random_range(0..2),
            },
            58..=61 => Op::CreateTable,
            62..=63 if self.tables.iter().flatten().count() > 1 => Op::DropTable { table: t },
            64..=66 => Op::CreateIndex { table: t },
            67..=68 => Op::AddColumn { table: t },
            69..=71 => Op::Vacuum,
            72..=80 => {
                let kept = self.sizes(n);
                let undone = self.sizes(n * 3);
                Op::SavepointRollback {
                    table: t,
                    kept,
                    undone,
                }
            }
            81..=88 => Op::FailingBatch {
                table: t,
                sizes: self.sizes(n * 4),
            },
            89..=92 => Op::Checkpoint(CheckpointMode::Passive),
            93..=95 => Op::Checkpoint(CheckpointMode::Restart),
            96..=97 => Op::Checkpoint(CheckpointMode::Truncate),
            _ => Op::Checkpoint(CheckpointMode::Full),
        }
    }

    fn blob(&mut self, size: usize) -> Value {
        let mut b = vec![0u8; size];
        self.rng.fill(&mut b[..]);
        Value::Blob(b)
    }

    fn insert_sql(t: usize) -> String {
        format!("INSERT INTO t{t}(k, v) VALUES (?1, ?2)")
    }

    /// Runs `op`; returns whether it was expected to fail (and did).
    pub fn apply(&mut self, db: &Database, s: &Session, op: &Op) -> Result<bool, QueryError> {
        match op {
            Op::Insert { table, sizes } => {
                for &size in sizes {
                    let k = self.rng.random::<i64>();
                    let v = self.blob(size);
                    s.prepare(Self::insert_sql(*table))
                        .bind([Value::from(k), v])
                        .run()?;
                }
            }
            Op::InsertBatch { table, sizes } => {
                let mut stmts = Vec::new();
                for &size in sizes {
                    let k = self.rng.random::<i64>();
                    let v = self.blob(size);
                    stmts.push(
                        s.prepare(Self::insert_sql(*table))
                            .bind([Value::from(k), v]),
                    );
                }
                s.batch(stmts)?;
            }
            Op::Update { table, every, size } => {
                let v = self.blob(*size);
                s.prepare(format!("UPDATE t{table} SET v = ?1 WHERE id % ?2 = 0"))
                    .bind([v, Value::from(*every)])
                    .run()?;
            }
            Op::Delete { table, modulo, rem } => {
                s.prepare(format!("DELETE FROM t{table} WHERE id % ?1 = ?2"))
                    .bind([*modulo, *rem])
                    .run()?;
            }
            Op::CreateTable => {
                let i = self.tables.len();
                s.prepare(format!(
                    "CREATE TABLE t{i}(id INTEGER PRIMARY KEY, k INTEGER UNIQUE, v BLOB)"
                ))
                .run()?;
                self.tables.push(Some(TableState {
                    columns: 0,
                    indexed: false,
                }));
            }
            Op::DropTable { table } => {
                s.prepare(format!("DROP TABLE t{table}")).run()?;
                self.tables[*table] = None;
            }
            Op::CreateIndex { table } => {
                let st = self.tables[*table].as_mut().expect("live table");
                if st.indexed {
                    s.prepare(format!("DROP INDEX i{table}")).run()?;
                } else {
                    s.prepare(format!("CREATE INDEX i{table} ON t{table}(v)"))
                        .run()?;
                }
                st.indexed = !st.indexed;
            }
            Op::AddColumn { table } => {
                let st = self.tables[*table].as_mut().expect("live table");
                st.columns += 1;
                s.prepare(format!(
                    "ALTER TABLE t{table} ADD COLUMN c{} TEXT DEFAULT 'x'",
                    st.columns
                ))
                .run()?;
            }
            Op::Vacuum => {
                s.prepare("VACUUM").run()?;
            }
            Op::SavepointRollback {
                table,
                kept,
                undone,
            } => {
                let mut stmts = vec![s.prepare("SAVEPOINT outer_sp")];
                for &size in kept {
                    let k = self.rng.random::<i64>();
                    let v = self.blob(size);
                    stmts.push(
                        s.prepare(Self::insert_sql(*table))
                            .bind([Value::from(k), v]),
                    );
                }
                stmts.push(s.prepare("SAVEPOINT inner_sp"));
                for &size in undone {
                    let k = self.rng.random::<i64>();
                    let v = self.blob(size);
                    stmts.push(
                        s.prepare(Self::insert_sql(*table))
                            .bind([Value::from(k), v]),
                    );
                }
                stmts.push(s.prepare(format!("DELETE FROM t{table} WHERE id % 3 = 0")));
                stmts.push(s.prepare("ROLLBACK TO inner_sp"));
                stmts.push(s.prepare("RELEASE outer_sp"));
                s.batch(stmts)?;
            }
            Op::FailingBatch { table, sizes } => {
                let mut stmts = Vec::new();
                let k = self.rng.random::<i64>();
                for &size in sizes {
                    let k2 = self.rng.random::<i64>();
                    let v = self.blob(size);
                    stmts.push(
                        s.prepare(Self::insert_sql(*table))
                            .bind([Value::from(k2), v]),
                    );
                }
                // The same unique key twice: the batch must fail as a whole.
                stmts.push(
                    s.prepare(Self::insert_sql(*table))
                        .bind([Value::from(k), Value::Null]),
                );
                stmts.push(
                    s.prepare(Self::insert_sql(*table))
                        .bind([Value::from(k), Value::Null]),
                );
                return match s.batch(stmts) {
                    Err(QueryError::Batch { .. }) => Ok(true),
                    Err(e) => Err(e),
                    Ok(_) => panic!("a batch with a duplicate unique key committed"),
                };
            }
            Op::Checkpoint(mode) => {
                // Busy is acceptable for RESTART/TRUNCATE; it changes nothing.
                let _ = db.checkpoint(*mode);
            }
        }
        Ok(false)
    }
}

/// A local cluster driven over raw HTTP: requests are built by hand (not
/// with the crate's client or `api` types), so what is tested is the wire
/// format itself.
pub struct HttpCluster {
    // Field order is drop order: the cluster stops before its directory goes.
    pub c: walrelay_engine::local_cluster::LocalCluster,
    pub dir: tempfile::TempDir,
    pub(crate) agent: ureq::Agent,
}

/// What a test saw of one HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: Option<String>,
    pub bookmark: Option<String>,
    pub json: serde_json::Value,
}

/// Everything a refused request must leave as it was: the primary's latest
/// bookmark and every page of the primary and of each replica, and how far
/// each replica has got.
#[derive(Debug, PartialEq)]
pub struct ClusterState {
    pub bookmark: Bookmark,
    pub primary_pages: Vec<Vec<u8>>,
    pub replica_pages: Vec<Vec<Vec<u8>>>,
    pub replicas: Vec<Bookmark>,
}

impl ClusterState {
    pub fn assert_same(&self, after: &ClusterState, what: &str) {
        assert_eq!(
            after.bookmark, self.bookmark,
            "{what}: the primary issued a bookmark"
        );
        assert!(
            after.primary_pages == self.primary_pages,
            "{what}: a page of the primary changed"
        );
        assert!(
            after.replica_pages == self.replica_pages,
            "{what}: a page of a replica changed"
        );
        assert_eq!(
            after.replicas, self.replicas,
            "{what}: a replica moved without a write"
        );
    }
}

impl HttpCluster {
    /// Starts a cluster under a fresh directory, runs `setup` on the
    /// primary and waits until every replica has it.
    pub fn start(
        config: walrelay_engine::local_cluster::LocalClusterConfig,
        setup: &[&str],
    ) -> HttpCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = walrelay_engine::local_cluster::LocalCluster::start(dir.path(), config)
            .expect("cluster");
        let s = c
            .primary
            .database()
            .session(walrelay_engine::Constraint::FirstPrimary)
            .expect("session");
        for sql in setup {
            s.prepare(*sql)
                .run()
                .unwrap_or_else(|e| panic!("setup {sql}: {e}"));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(std::time::Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let h = HttpCluster { c, dir, agent };
        h.wait_replicas();
        h
    }

    /// Waits until every replica has confirmed the primary's latest and
    /// made it visible.
    pub fn wait_replicas(&self) {
        let latest = self.c.primary.database().latest_bookmark();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for r in &self.c.replicas {
            assert!(
                r.node()
                    .wait_confirmed(latest, std::time::Duration::from_secs(10)),
                "a replica never caught up with {latest}"
            );
            while r.replica().confirmed() < latest {
                assert!(
                    std::time::Instant::now() < deadline,
                    "a replica confirmed {latest} but never made it visible"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// The primary and the first replica, by name and base URL.
    pub fn nodes(&self) -> [(&'static str, String); 2] {
        [
            ("primary", self.c.primary_http.url()),
            ("replica", self.c.replica_http[0].url()),
        ]
    }

    /// POSTs `body` as it is to database `main`, as the first query of an
    /// unconstrained session (so a read is served where it is sent).
    pub fn post(&self, base: &str, body: &[u8]) -> Reply {
        self.post_raw(base, "main", Some(b"first-unconstrained"), body)
    }

    /// POSTs `body` as it is, with `header` as `x-d1-bookmark` (raw bytes,
    /// so that non-text values can be sent too).
    pub fn post_raw(
        &self,
        base: &str,
        database: &str,
        header: Option<&[u8]>,
        body: &[u8],
    ) -> Reply {
        let mut req = self
            .agent
            .post(format!("{base}/v1/databases/{database}/query"))
            .header("content-type", "application/json")
            .header("authorization", admin_bearer(&self.c));
        if let Some(h) = header {
            req = req.header("x-d1-bookmark", h);
        }
        let mut resp = req.send(body).expect("the node answers");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (content_type, bookmark) = (header("content-type"), header("x-d1-bookmark"));
        let text = resp.body_mut().read_to_string().expect("a body");
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {text:?}"));
        Reply {
            status: resp.status().as_u16(),
            content_type,
            bookmark,
            json,
        }
    }

    /// A node's `/metrics` text.
    pub fn metrics(&self, base: &str) -> String {
        metrics_text(&self.c, base)
    }

    pub fn state(&self) -> ClusterState {
        let db = self.c.primary.database();
        ClusterState {
            bookmark: db.latest_bookmark(),
            primary_pages: db.page_images().expect("primary pages"),
            replica_pages: self
                .c
                .replicas
                .iter()
                .map(|r| r.replica().database().page_images().expect("replica pages"))
                .collect(),
            replicas: self
                .c
                .replicas
                .iter()
                .map(|r| r.replica().confirmed())
                .collect(),
        }
    }

    /// Sends `body` to the primary and the replica; each must answer with
    /// D1's error shape (`status`, `code`, a message containing
    /// `message_has`) and leave every node's pages as they were.
    pub fn refuse(&self, what: &str, body: &[u8], status: u16, code: u32, message_has: &str) {
        for (node, url) in self.nodes() {
            // A write just before (the caller's) may still be on its way
            // to the replicas: compare from a settled state.
            self.wait_replicas();
            let before = self.state();
            let r = self.post(&url, body);
            let what = format!("{what} (sent to the {node})");
            assert_d1_error(&r, status, code, message_has, &what);
            if let Some(b) = &r.bookmark {
                assert!(
                    b.as_str() <= before.bookmark.to_string().as_str(),
                    "{what}: answered with bookmark {b}, beyond the latest {}",
                    before.bookmark
                );
            }
            before.assert_same(&self.state(), &what);
        }
    }
}

/// D1's error shape: `{"result": [], "success": false,
/// "errors": [{"code": n, "message": "..."}], "messages": []}`.
pub fn assert_d1_error(r: &Reply, status: u16, code: u32, message_has: &str, what: &str) {
    assert_eq!(r.status, status, "{what}: status; body {}", r.json);
    assert_eq!(
        r.content_type.as_deref(),
        Some("application/json"),
        "{what}: content type"
    );
    assert_eq!(r.json["success"], false, "{what}: {}", r.json);
    assert_eq!(
        r.json["result"],
        serde_json::json!([]),
        "{what}: {}",
        r.json
    );
    assert!(r.json["messages"].is_array(), "{what}: {}", r.json);
    let errors = r.json["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: errors is not an array: {}", r.json));
    assert_eq!(errors.len(), 1, "{what}: one error: {}", r.json);
    assert_eq!(errors[0]["code"], code, "{what}: code: {}", r.json);
    let message = errors[0]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: message is not a string: {}", r.json));
    assert!(
        message.contains(message_has),
        "{what}: the message {message:?} should say {message_has:?}"
    );
}

/// A read that never ends on its own (the runaway of issue 9).
pub const RUNAWAY: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

/// A base port with `span` consecutive ports free on 127.0.0.1 (best
/// effort: they are only probed, then released). Ranges handed out in
/// this process are never handed out again, so tests running at once in
/// one binary cannot be given overlapping ranges before either binds.
pub fn free_port_base(span: u16) -> u16 {
    static GIVEN: std::sync::Mutex<Vec<std::ops::Range<u16>>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let free = |given: &[std::ops::Range<u16>], base: u16| {
        let range = base..base + span;
        given
            .iter()
            .all(|g| range.end <= g.start || g.end <= range.start)
            && range
                .clone()
                .all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
    };
    let top = procs::ephemeral_start().saturating_sub(span);
    // Random bases first (tests running at once rarely collide), then
    // every base in order: a busy stretch of ports never fails a test.
    let mut chosen = None;
    for attempt in 0..2_000u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // Below the ephemeral ports (see `free_port`), above its range.
        let room = top.saturating_sub(20_000).max(1);
        let mix = (std::process::id() as u16) ^ ((nanos >> 8) as u16) ^ (attempt as u16);
        let base = 20_000 + mix % room;
        if free(&given, base) {
            chosen = Some(base);
            break;
        }
    }
    let base = chosen.unwrap_or_else(|| {
        (20_000..top)
            .step_by(usize::from(span))
            .find(|b| free(&given, *b))
            .expect("no free port range on 127.0.0.1 below the ephemeral ports")
    });
    given.push(base..base + span);
    base
}

/// A node's metric value (the first sample line starting with `name`).
pub fn metric(base_url: &str, name: &str) -> Option<u64> {
    let text = ureq::get(format!("{base_url}/metrics"))
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    metric_in(&text, name)
}

/// A metric's value in a `/metrics` text (the first sample line starting
/// with `name`).
pub fn metric_in(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
