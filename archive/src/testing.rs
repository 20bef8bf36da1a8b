//! The shared test kit for cold storage (feature `test-support`): a local
//! S3 emulator process, a follower log in memory, and a workload with
//! shadow copies of the database at every bookmark.

use crate::archiver::{Source, SourceError};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use walrelay_replicator::{Bookmark, ChainHash, Encoded, Epoch, Record, Sequence};

/// A `moto_server` (PyPI moto) on 127.0.0.1, with one bucket; stopped by
/// PID on drop.
#[derive(Debug)]
pub struct S3Emulator {
    child: Child,
    port: u16,
}

/// Why the emulator is not there.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("moto_server is not installed (pip install 'moto[server]==5.2.1')")]
    NotInstalled,
    #[error("moto_server did not come up: {0}")]
    Start(String),
}

impl S3Emulator {
    /// Starts one. Tests that need it and are run under `CI=true` must
    /// fail, not skip, when this errors.
    pub fn start() -> Result<S3Emulator, EmulatorError> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| EmulatorError::Start(e.to_string()))?
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => EmulatorError::NotInstalled,
                _ => EmulatorError::Start(e.to_string()),
            })?;
        let mut emu = S3Emulator { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = emu.child.try_wait() {
                return Err(EmulatorError::Start(format!("exited with {status}")));
            }
            if emu.create_bucket("walrelay").is_ok() {
                return Ok(emu);
            }
            if Instant::now() > deadline {
                return Err(EmulatorError::Start("not listening after 60 s".into()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A store URL for a fresh prefix of the bucket.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "s3://walrelay/{prefix}?endpoint={}&region=us-east-1&access_key_id=test&secret_access_key=test",
            self.endpoint()
        )
    }

    fn create_bucket(&self, name: &str) -> std::io::Result<()> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        if reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200") {
            Ok(())
        } else {
            Err(std::io::Error::other(
                reply.lines().next().unwrap_or("").to_string(),
            ))
        }
    }
}

impl Drop for S3Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `f` once per kind of store, each fresh: the local filesystem
/// (under `dir`), memory (if `with_memory`), and the S3 emulator. Without
/// the emulator the S3 run is skipped with a message, except under
/// `CI=true`, where that is a failure.
pub fn each_store(
    name: &str,
    dir: &std::path::Path,
    with_memory: bool,
    mut f: impl FnMut(&str, &crate::Store),
) {
    let fs_dir = dir.join(format!("store-{name}"));
    let fs = crate::Store::open(fs_dir.to_str().expect("utf-8 path")).expect("filesystem store");
    f("filesystem", &fs);
    if with_memory {
        f(
            "memory",
            &crate::Store::open("memory://").expect("memory store"),
        );
    }
    match S3Emulator::start() {
        Ok(emu) => {
            let s3 = crate::Store::open(&emu.url(name)).expect("S3 store");
            f("S3 emulator", &s3);
        }
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the S3 emulator is required under CI=true: {e}")
        }
        Err(e) => eprintln!("SKIPPED the S3 emulator store: {e}"),
    }
}

/// Database `database` restored from `store` at `at` through the file
/// `out`: the file's bytes.
pub fn restored(
    store: &crate::Store,
    database: walrelay_replicator::DatabaseId,
    at: Bookmark,
    out: &std::path::Path,
) -> Result<Vec<u8>, crate::RestoreError> {
    let a = crate::Archive::new(store.clone(), database);
    let m = a.manifest()?;
    crate::restore_to_file(&a, &m, at, out, &crate::NoProgress)?;
    Ok(std::fs::read(out).expect("restored file"))
}

/// A durability follower's log in memory: records appended by a
/// [`Workload`], a confirmed point, and releases.
#[derive(Debug, Default)]
pub struct MemSource {
    inner: Mutex<MemLog>,
}

#[derive(Debug, Default)]
struct MemLog {
    records: Vec<Encoded>,
    start: Bookmark,
    confirmed: Bookmark,
    epoch: Epoch,
    /// Record bytes `read_confirmed` has returned, in all.
    read_bytes: u64,
}

impl MemLog {
    /// The confirmed records after `after` up to `upto`; an error if
    /// `after` was released.
    fn confirmed_between(
        &self,
        after: Bookmark,
        upto: Bookmark,
    ) -> Result<impl Iterator<Item = &Encoded>, SourceError> {
        if after < self.start {
            return Err(format!("released: {after} < {}", self.start).into());
        }
        let upto = upto.min(self.confirmed);
        Ok(self
            .records
            .iter()
            .filter(move |r| r.bookmark > after && r.bookmark <= upto))
    }
}

impl MemSource {
    pub fn new(epoch: Epoch) -> MemSource {
        let s = MemSource::default();
        s.inner.lock().epoch = epoch;
        s
    }

    pub fn push(&self, e: Encoded) {
        self.inner.lock().records.push(e);
    }

    pub fn confirm(&self, upto: Bookmark) {
        self.inner.lock().confirmed = upto;
    }

    pub fn set_epoch(&self, epoch: Epoch) {
        self.inner.lock().epoch = epoch;
    }

    pub fn held(&self) -> usize {
        self.inner.lock().records.len()
    }

    /// Record bytes read through [`Source::read_confirmed`] so far.
    pub fn bytes_read(&self) -> u64 {
        self.inner.lock().read_bytes
    }
}

impl Source for MemSource {
    fn confirmed(&self) -> Bookmark {
        let l = self.inner.lock();
        l.confirmed
            .min(l.records.last().map_or(l.start, |r| r.bookmark))
    }
    fn epoch(&self) -> Epoch {
        self.inner.lock().epoch
    }
    fn log_start(&self) -> Bookmark {
        self.inner.lock().start
    }
    fn read_confirmed(&self, after: Bookmark, max_bytes: usize) -> Result<Vec<Bytes>, SourceError> {
        let mut l = self.inner.lock();
        let mut out = Vec::new();
        let mut bytes = 0;
        for r in l.confirmed_between(after, l.confirmed)? {
            if !out.is_empty() && bytes + r.bytes.len() > max_bytes {
                break;
            }
            bytes += r.bytes.len();
            out.push(r.bytes.clone());
        }
        l.read_bytes += bytes as u64;
        Ok(out)
    }
    fn confirmed_bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, SourceError> {
        let l = self.inner.lock();
        Ok(l.confirmed_between(after, upto)?
            .map(|r| r.bytes.len() as u64)
            .sum())
    }
    fn disk_bytes(&self) -> u64 {
        self.inner
            .lock()
            .records
            .iter()
            .map(|r| r.bytes.len() as u64)
            .sum()
    }
    fn release_point(&self, keep_bytes: u64) -> Bookmark {
        let l = self.inner.lock();
        let mut kept = 0u64;
        for r in l.records.iter().rev() {
            kept += r.bytes.len() as u64;
            if kept >= keep_bytes {
                return r.previous;
            }
        }
        l.start
    }
    fn release_through(&self, upto: Bookmark) -> Result<(), SourceError> {
        let mut l = self.inner.lock();
        if upto > l.confirmed {
            return Err("release past confirmed".into());
        }
        l.records.retain(|r| r.bookmark > upto);
        l.start = l.start.max(upto);
        Ok(())
    }
}

/// A random workload over a small database, with the database's exact
/// image after every transaction (the shadow copies restores are compared
/// with).
#[derive(Debug)]
pub struct Workload {
    rng: rand::rngs::SmallRng,
    pub page_size: u32,
    pages: Vec<Vec<u8>>,
    at: Bookmark,
    /// The last record's bookmark (what the next record follows).
    last: Bookmark,
    chain: ChainHash,
    /// The database after each transaction (and at ZERO: empty).
    pub shadows: BTreeMap<Bookmark, Vec<u8>>,
    /// Each transaction's commit time (µs; the clock starts a day ago and
    /// advances up to 2 s per transaction).
    pub times: BTreeMap<Bookmark, u64>,
    pub clock_us: u64,
}

impl Workload {
    pub fn new(seed: u64, page_size: u32) -> Workload {
        use rand::SeedableRng;
        let mut shadows = BTreeMap::new();
        shadows.insert(Bookmark::ZERO, Vec::new());
        Workload {
            rng: rand::rngs::SmallRng::seed_from_u64(seed),
            page_size,
            pages: Vec::new(),
            at: Bookmark::ZERO,
            last: Bookmark::ZERO,
            chain: ChainHash::GENESIS,
            shadows,
            times: BTreeMap::new(),
            // A day ago, so retention windows measured from now hold it.
            clock_us: crate::archiver::now_us().saturating_sub(86_400_000_000),
        }
    }

    pub fn at(&self) -> Bookmark {
        self.at
    }

    /// Starts a new epoch (a failover): the next transaction is its first.
    pub fn new_epoch(&mut self, epoch: Epoch) {
        assert!(epoch > self.at.epoch);
        self.at = Bookmark::new(epoch, Sequence(0));
        // Sequence 0 of an epoch is never a record: the history continues
        // from the last record, which `previous` keeps naming.
    }

    /// One random transaction of up to `max_pages` pages (it may grow or
    /// shrink the database), split into chunks of at most `chunk_pages`;
    /// returns its records.
    pub fn transaction(&mut self, max_pages: u32, chunk_pages: usize) -> Vec<Encoded> {
        use rand::Rng;
        let len = self.pages.len() as u32;
        let db_pages = match self.rng.random_range(0..10) {
            0 if len > 2 => len - self.rng.random_range(1..=len / 2),
            0..=3 => len + self.rng.random_range(1..=max_pages),
            _ => len.max(1),
        };
        let mut touched: Vec<u32> = (0..self.rng.random_range(1..=max_pages))
            .map(|_| self.rng.random_range(1..=db_pages))
            .collect();
        if db_pages > len {
            touched.extend(len + 1..=db_pages);
        }
        self.write(db_pages, touched, chunk_pages)
    }

    /// One transaction that leaves the database at `db_pages` pages and
    /// writes the pages `touched` (each at most `db_pages`; pages it grows
    /// the database by and does not write read as zeros), split into
    /// chunks of at most `chunk_pages`; returns its records.
    pub fn write(
        &mut self,
        db_pages: u32,
        mut touched: Vec<u32>,
        chunk_pages: usize,
    ) -> Vec<Encoded> {
        use rand::Rng;
        self.pages
            .resize(db_pages as usize, vec![0; self.page_size as usize]);
        touched.sort_unstable();
        touched.dedup();
        assert!(touched.iter().all(|&p| p >= 1 && p <= db_pages));
        self.clock_us += self.rng.random_range(1_000..200_000);
        let mut pages = Vec::new();
        for p in touched {
            let mut img = vec![0u8; self.page_size as usize];
            self.rng.fill(&mut img[..64]);
            img[64..].fill((p % 251) as u8);
            self.pages[p as usize - 1] = img.clone();
            pages.push((p, Bytes::from(img)));
        }
        let chunks: Vec<Vec<(u32, Bytes)>> = pages
            .chunks(chunk_pages.max(1))
            .map(|c| c.to_vec())
            .collect();
        let n = chunks.len();
        let mut out = Vec::new();
        let mut previous = self.last;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let bookmark = Bookmark::new(self.at.epoch, self.at.sequence.next().expect("sequence"));
            self.at = bookmark;
            let r = Record {
                bookmark,
                previous,
                prev_chain: self.chain,
                commit_us: self.clock_us,
                page_size: self.page_size,
                db_pages,
                pages: chunk,
            };
            let e = r.to_encoded_chunk(i + 1 < n).expect("encode");
            self.chain = e.chain;
            previous = bookmark;
            out.push(e);
        }
        self.last = self.at;
        self.shadows.insert(self.at, self.pages.concat());
        self.times.insert(self.at, self.clock_us);
        out
    }
}

/// An object store that crashes: after `budget` writes (puts, deletes,
/// copies) every operation fails, as if the uploader's process died there.
/// The objects written so far stay in `inner`, for a restarted uploader.
#[derive(Debug)]
pub struct CrashingStore {
    inner: std::sync::Arc<dyn object_store::ObjectStore>,
    counter: std::sync::Arc<WriteBudget>,
}

#[derive(Debug)]
struct WriteBudget {
    budget: std::sync::atomic::AtomicI64,
    writes: std::sync::atomic::AtomicU64,
}

impl WriteBudget {
    fn crashed(&self) -> bool {
        self.budget.load(std::sync::atomic::Ordering::SeqCst) == 0
    }

    fn write(&self) -> object_store::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let b = self.budget.load(SeqCst);
        if b == 0 {
            return Err(crash());
        }
        if b > 0 {
            self.budget.fetch_sub(1, SeqCst);
        }
        self.writes.fetch_add(1, SeqCst);
        Ok(())
    }
}

impl CrashingStore {
    /// `budget` writes before the crash (negative: never).
    pub fn new(inner: std::sync::Arc<dyn object_store::ObjectStore>, budget: i64) -> CrashingStore {
        CrashingStore {
            inner,
            counter: std::sync::Arc::new(WriteBudget {
                budget: std::sync::atomic::AtomicI64::new(budget),
                writes: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// Writes that went through.
    pub fn writes(&self) -> u64 {
        self.counter
            .writes
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn crash() -> object_store::Error {
    object_store::Error::Generic {
        store: "crashing",
        source: "the uploader crashed here".into(),
    }
}

impl std::fmt::Display for CrashingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CrashingStore")
    }
}

type PathStream =
    futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>;

#[async_trait::async_trait]
impl object_store::ObjectStore for CrashingStore {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.counter.write()?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.counter.write()?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        if self.counter.crashed() {
            return Err(crash());
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(&self, locations: PathStream) -> PathStream {
        use futures::StreamExt;
        let (inner, counter) = (
            std::sync::Arc::clone(&self.inner),
            std::sync::Arc::clone(&self.counter),
        );
        locations
            .then(move |p| {
                let (inner, counter) = (
                    std::sync::Arc::clone(&inner),
                    std::sync::Arc::clone(&counter),
                );
                async move {
                    let p = p?;
                    counter.write()?;
                    let one: PathStream = futures::stream::iter([Ok(p)]).boxed();
                    inner
                        .delete_stream(one)
                        .next()
                        .await
                        .unwrap_or_else(|| Err(crash()))
                }
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        use futures::StreamExt;
        if self.counter.crashed() {
            return futures::stream::iter([Err(crash())]).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        if self.counter.crashed() {
            return Err(crash());
        }
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.counter.write()?;
        self.inner.copy_opts(from, to, options).await
    }
}
