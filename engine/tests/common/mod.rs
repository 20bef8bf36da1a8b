//! Shared test support: a recording sink, page-set replay, the logical-page
//! oracle and the randomized workload generator.
#![allow(dead_code)] // each test binary uses a different part

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
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

/// A read that never ends on its own (the runaway of issue 9).
pub const RUNAWAY: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

/// A base port with `span` consecutive ports free on 127.0.0.1 (best
/// effort: they are only probed, then released).
pub fn free_port_base(span: u16) -> u16 {
    for attempt in 0..200u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let base = 20_000
            + (std::process::id() as u16 % 20_000)
            + ((nanos >> 8) as u16 ^ attempt as u16) % 5_000;
        let all_free =
            (0..span).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no free port range");
}

/// One HTTP/1.1 query sent over a raw socket: the socket, left open, so a
/// test can hang up mid-query (drop it) or read the answer.
pub fn send_query(addr: std::net::SocketAddr, sql: &str) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::json!({ "sql": sql }).to_string();
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/databases/main/query HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    s
}

/// A node's metric value (the first sample line starting with `name`).
pub fn metric(base_url: &str, name: &str) -> Option<u64> {
    let text = ureq::get(format!("{base_url}/metrics"))
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
