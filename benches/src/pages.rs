//! Realistic database pages for the storage benchmarks: a real SQLite
//! database filled with rows of random-ish text, and a stream of small
//! OLTP transactions on it captured as page sets the way the primary's VFS
//! captures them (the transaction's WAL frames).
//!
//! Why a real database and not synthetic pages: what the archive costs
//! depends on how well pages compress (zstd level 3) and on how many
//! pages a transaction touches, and both come out right only from real
//! B-tree pages: cell pointers, free space, interior pages, an index on
//! integers, and text that repeats words but not whole rows.
//!
//! The rows: `events(id INTEGER PRIMARY KEY, account, created, kind,
//! body)` with an index on `(account, created)`; a body is 20 to 80
//! words drawn from a 4,096-word vocabulary (skewed, like prose) plus a
//! random 16-character token, so rows share words but never repeat.
//! Pages compress about 2.5x with zstd level 3 (the bench prints the
//! exact ratio).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rusqlite::{Connection, params};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One transaction's pages: (page number, image), ascending, and the
/// database's size in pages after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageSet {
    pub pages: Vec<(u32, Vec<u8>)>,
    pub db_pages: u32,
}

impl PageSet {
    /// Bytes of page images.
    pub fn bytes(&self) -> u64 {
        self.pages.iter().map(|(_, p)| p.len() as u64).sum()
    }
}

/// A SQLite database (WAL mode) and a generator of transactions on it.
#[derive(Debug)]
pub struct SqliteHistory {
    conn: Connection,
    path: PathBuf,
    rng: SmallRng,
    vocab: Vec<String>,
    accounts: i64,
    rows: i64,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

const WAL_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;

impl SqliteHistory {
    /// Creates a database at `path` of at least `target_bytes` (4 KiB
    /// pages), loaded without a journal, then switched to WAL mode and
    /// checkpointed: the file holds the whole database.
    pub fn create(path: &Path, target_bytes: u64, seed: u64) -> Result<SqliteHistory, Error> {
        let conn = Connection::open(path)?;
        conn.execute_batch(
            "PRAGMA page_size=4096; PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;
             CREATE TABLE events(id INTEGER PRIMARY KEY, account INTEGER NOT NULL,
                 created INTEGER NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL);
             CREATE INDEX events_account ON events(account, created);",
        )?;
        let mut rng = SmallRng::seed_from_u64(seed);
        let vocab = (0..4096)
            .map(|_| {
                let len = rng.random_range(2..=10);
                (0..len)
                    .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                    .collect()
            })
            .collect();
        let mut h = SqliteHistory {
            conn,
            path: path.to_path_buf(),
            rng,
            vocab,
            accounts: 1 + (target_bytes / 40_000).max(10) as i64,
            rows: 0,
        };
        loop {
            h.conn.execute_batch("BEGIN")?;
            for _ in 0..5_000 {
                h.insert_row()?;
            }
            h.conn.execute_batch("COMMIT")?;
            if h.db_pages()? as u64 * 4096 >= target_bytes {
                break;
            }
        }
        h.conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; PRAGMA wal_checkpoint(TRUNCATE);",
        )?;
        Ok(h)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn page_size(&self) -> u32 {
        4096
    }

    /// The database's size in pages (as the file holds it after a
    /// checkpoint).
    pub fn db_pages(&self) -> Result<u32, Error> {
        Ok(self
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get::<_, u32>(0))?)
    }

    /// `count` pages from page `first` (1-based) of the database file.
    pub fn read_pages(&self, first: u32, count: u32) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; count as usize * 4096];
        File::open(&self.path)?.read_exact_at(&mut buf, u64::from(first - 1) * 4096)?;
        Ok(buf)
    }

    fn body(&mut self) -> String {
        let words = self.rng.random_range(20..=80);
        let mut s = String::with_capacity(words * 7 + 20);
        for _ in 0..words {
            // Skewed towards the low indices, as word use is.
            let x: f64 = self.rng.random();
            s.push_str(&self.vocab[(x * x * 4096.0) as usize]);
            s.push(' ');
        }
        for _ in 0..16 {
            s.push(char::from(
                b"0123456789abcdef"[self.rng.random_range(0..16)],
            ));
        }
        s
    }

    fn insert_row(&mut self) -> Result<(), Error> {
        let body = self.body();
        let account = self.rng.random_range(1..=self.accounts);
        let kind = ["view", "click", "purchase", "signup", "refund"][self.rng.random_range(0..5)];
        self.rows += 1;
        self.conn
            .prepare_cached(
                "INSERT INTO events(account, created, kind, body) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![account, 1_700_000_000 + self.rows, kind, body])?;
        Ok(())
    }

    /// One small OLTP transaction (update 1 to 8 random rows' bodies,
    /// insert 1 to 4 rows, now and then delete one), returned as the pages
    /// it wrote, read from the WAL; then a checkpoint, so the file holds
    /// the database again.
    pub fn transaction(&mut self) -> Result<PageSet, Error> {
        self.conn.execute_batch("BEGIN")?;
        for _ in 0..self.rng.random_range(1..=8) {
            let id = self.rng.random_range(1..=self.rows);
            let body = self.body();
            self.conn
                .prepare_cached("UPDATE events SET body = ?1 WHERE id = ?2")?
                .execute(params![body, id])?;
        }
        for _ in 0..self.rng.random_range(1..=4) {
            self.insert_row()?;
        }
        if self.rng.random_range(0..10) == 0 {
            let id = self.rng.random_range(1..=self.rows);
            self.conn
                .prepare_cached("DELETE FROM events WHERE id = ?1")?
                .execute(params![id])?;
        }
        self.conn.execute_batch("COMMIT")?;
        let set = read_wal(&wal_path(&self.path))?;
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            })?;
        Ok(set)
    }
}

fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// The pages of the committed transactions in a WAL file (the newest
/// image of each page) and the database size of the last commit.
pub fn read_wal(path: &Path) -> Result<PageSet, Error> {
    let wal = std::fs::read(path)?;
    if wal.len() < WAL_HEADER {
        return Err("no WAL header".into());
    }
    let be = |at: usize| u32::from_be_bytes(wal[at..at + 4].try_into().expect("4 bytes"));
    let page_size = be(8) as usize;
    let salts = &wal[16..24];
    let mut pages = std::collections::BTreeMap::new();
    let mut pending = Vec::new();
    let mut db_pages = 0;
    let mut at = WAL_HEADER;
    while at + FRAME_HEADER + page_size <= wal.len() {
        if &wal[at + 8..at + 16] != salts {
            break;
        }
        let page_no = be(at);
        let commit = be(at + 4);
        pending.push((
            page_no,
            wal[at + FRAME_HEADER..at + FRAME_HEADER + page_size].to_vec(),
        ));
        if commit != 0 {
            pages.extend(pending.drain(..));
            db_pages = commit;
        }
        at += FRAME_HEADER + page_size;
    }
    if db_pages == 0 {
        return Err("no committed transaction in the WAL".into());
    }
    Ok(PageSet {
        pages: pages.into_iter().collect(),
        db_pages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_replayed_on_the_loaded_file_give_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = SqliteHistory::create(&dir.path().join("h.db"), 1 << 20, 1).unwrap();
        let n = h.db_pages().unwrap();
        assert!(u64::from(n) * 4096 >= 1 << 20);
        let mut image = h.read_pages(1, n).unwrap();
        for _ in 0..30 {
            let t = h.transaction().unwrap();
            assert!(!t.pages.is_empty());
            image.resize(t.db_pages as usize * 4096, 0);
            for (p, bytes) in &t.pages {
                let at = (*p as usize - 1) * 4096;
                image[at..at + 4096].copy_from_slice(bytes);
            }
        }
        assert_eq!(image, std::fs::read(h.path()).unwrap());
    }
}
