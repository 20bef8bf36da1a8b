//! Shared test support: a recording sink, page-set replay, the logical-page
//! oracle, the randomized workload generator, and for tests with real
//! processes: `walrelay` children ([`Proc`]), loopback ports and cluster
//! key files.
#![allow(dead_code)] // each test binary uses a different part

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use walrelay_engine::{
    Bookmark, CapturedTransaction, CheckpointMode, Database, PageSet, QueryError, Session,
    TransactionSink, Value,
};

/// Remembers every committed transaction with its bookmark.
#[derive(Default)]
pub struct Recorder {
    pub txns: Mutex<Vec<(Bookmark, CapturedTransaction)>>,
}

impl TransactionSink for Recorder {
    fn committed(&self, bookmark: Bookmark, txn: &CapturedTransaction) -> Result<(), String> {
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

/// The primary's pages as SQLite itself sees them in a new read transaction.
pub fn logical_pages(s: &Session) -> Vec<Vec<u8>> {
    let r = s
        .prepare("SELECT pgno, data FROM sqlite_dbpage ORDER BY pgno")
        .raw()
        .expect("dbpage");
    r.rows
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            assert_eq!(
                row[0],
                Value::Integer(i as i64 + 1),
                "dbpage rows are dense"
            );
            match &row[1] {
                Value::Blob(b) => b.clone(),
                other => panic!("page data is {other:?}"),
            }
        })
        .collect()
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

// ---- processes, ports, keys ---------------------------------------------

/// A loopback port nobody listens on right now (released before use, so
/// another process could take it first; unlikely on loopback in a test).
pub fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// "a:1,b:2", as the `walrelay` address-list flags take it.
pub fn join_addrs(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until `addr` accepts TCP connections.
pub fn wait_accepting(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} at {addr} never accepted");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Creates a fresh cluster key file (mode 0600) in `dir`; returns its path
/// and the key, for processes (`--cluster-key`) and in-process nodes alike.
pub fn cluster_key_file(dir: &Path) -> (PathBuf, walrelay_engine::ClusterKey) {
    let path = dir.join("cluster.key");
    let key = walrelay_engine::ClusterKey::create(&path).expect("cluster key");
    (path, key)
}

/// The `--cluster-key FILE` arguments.
pub fn key_args(path: &Path) -> [String; 2] {
    ["--cluster-key".into(), path.display().to_string()]
}

/// A `walrelay` child process whose stdout and stderr lines are collected
/// (and drained, so a chatty process never blocks on a full pipe; stderr is
/// echoed to the test's). Killed on drop, which unwinding runs too, and by
/// the kernel if the test process dies.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(name: &str, args: &[String]) -> Proc {
        let mut command = Command::new(env!("CARGO_BIN_EXE_walrelay"));
        command
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: runs in the child between fork and exec and calls only
        // prctl(2), which is async-signal-safe: if the test process is
        // killed, the kernel kills the child rather than leave it holding
        // ports.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().expect("spawn walrelay");
        let collect = |stream: Box<dyn std::io::Read + Send>, echo: Option<String>| {
            let sink = Arc::new(Mutex::new(Vec::new()));
            let to = Arc::clone(&sink);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(name) = &echo {
                        eprintln!("[{name}] {line}");
                    }
                    to.lock().expect("lines").push(line);
                }
            });
            sink
        };
        let lines = collect(Box::new(child.stdout.take().expect("stdout")), None);
        let errors = collect(
            Box::new(child.stderr.take().expect("stderr")),
            Some(name.to_string()),
        );
        Proc {
            name: name.to_string(),
            child,
            lines,
            errors,
        }
    }

    /// Waits for a stdout line containing `needle`; fails (with what the
    /// process printed) if it exits or takes too long.
    pub fn wait_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before printing {needle:?}: {:#?} {:#?}",
                    self.name,
                    self.lines.lock().expect("lines"),
                    self.errors.lock().expect("errors")
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} never printed {needle:?}: {:#?}",
                self.name,
                self.lines.lock().expect("lines")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The stderr lines containing `needle` so far.
    pub fn error_lines(&self, needle: &str) -> Vec<String> {
        self.errors
            .lock()
            .expect("errors")
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// Fails (with what it printed) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}): {:#?}",
                self.name,
                self.lines.lock().expect("lines")
            );
        }
    }

    /// SIGINT (a clean stop), then waits for the exit.
    pub fn interrupt(&mut self) {
        // SAFETY: kill(2) with SIGINT on our own unreaped child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
        }
        let _ = self.child.wait();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
