//! Cold-storage lifecycle benchmarks (issue 11, papers/lifecycle.md): each
//! result beside a floor measured in the same run.
//!
//! The database is a real SQLite database (`walrelay_benches::pages`: rows
//! of random-ish text and an index, 4 KiB pages) of `WALRELAY_LIFECYCLE_MB`
//! (default 200; 1 MB = 10^6 bytes), archived into a filesystem store the
//! way a follower's uploader archives it: the load as transactions of 1,024
//! pages, then small OLTP transactions captured from the WAL, fed as
//! records through `MemSource` to an `Archiver` (log objects of 16 MiB,
//! published per ~16 MiB):
//!
//! ```text
//! load (the whole database) | snapshot S1 | log L | snapshot S2 | log L
//!                                              ^ PITR by bookmark (L/2)
//!                                                   ^ PITR by time (0.9 L)
//! ```
//!
//! with L = `WALRELAY_LIFECYCLE_LOG_MB` (default 64) of record bytes. Every
//! restore is checked byte for byte against the SQLite file at that point.
//!
//! Measured (median of `WALRELAY_LIFECYCLE_REPS`, default 5):
//! - `restore latest|pitr-bookmark|pitr-time` (and `snapshot-only`, a
//!   restore of S2's own bookmark, to split the snapshot from the log), cold (every store file
//!   dropped from the page cache first: fdatasync + posix_fadvise
//!   DONTNEED per file) and warm. Timed: load the manifest, (for a time,
//!   find its bookmark,) restore into a file, fsynced and renamed.
//! - Their floor: read the same objects the restore reads (one thread,
//!   1 MiB reads, cold or warm as the restore), then write the restored
//!   size to a new file on the same disk and fsync it.
//! - `snapshot upload`: an uploader round that cuts a snapshot (rebuilds
//!   the image from the store, encodes parts, puts them), as MB/s of raw
//!   database; `snapshot encode+put`: just the encoding and puts. To the
//!   filesystem store and, if `moto_server` is on PATH, the S3 emulator.
//! - `bootstrap`: `walrelay_engine::replication::bootstrap` of a
//!   `WALRELAY_LIFECYCLE_BOOTSTRAP_MB` (default 1024) database (a snapshot
//!   plus 16 MB of log), cold, next to `cp` of the same database file on
//!   the same disk (cold source, destination fsynced: the floor).
//!
//! Target (issue 11): a 200 MB restore, latest and point in time, within
//! 1.15 s, half of Litestream's 2.30 s / 2.00 s measured on this machine.
//!
//! Run: `cargo bench -p walrelay-benches --bench lifecycle` (`-- --test`:
//! a few MB, one repetition). `WALRELAY_LIFECYCLE_DIR` picks the disk;
//! `WALRELAY_LIFECYCLE_KEEP=1` keeps the stores and databases afterwards.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use walrelay_archive::image::Image;
use walrelay_archive::snapshot::{self, SnapshotId};
use walrelay_archive::testing::{MemSource, S3Emulator};
use walrelay_archive::{
    Archive, Archiver, ArchiverConfig, Flush, NoProgress, Restored, RoundReport, Store, names,
    restore_to_file,
};
use walrelay_benches::floor::{evict, median, read_files, write_synced};
use walrelay_benches::pages::{PageSet, SqliteHistory};
use walrelay_replicator::{Bookmark, ChainHash, DatabaseId, Epoch, Record};

const DB: DatabaseId = DatabaseId(1);
const MB: u64 = 1_000_000;
const PAGE: u32 = 4096;
/// Pages per load transaction (4 MiB).
const LOAD_TXN_PAGES: u32 = 1024;
/// Record bytes after which the feeder runs an upload round.
const ROUND_BYTES: u64 = 16 << 20;
/// Commit-time gaps: load transactions, OLTP transactions.
const LOAD_GAP_US: u64 = 1_000;
const TXN_GAP_US: u64 = 50_000;
const TARGET_S: f64 = 1.15;
const LITESTREAM_LATEST_S: f64 = 2.30;
const LITESTREAM_PITR_S: f64 = 2.00;

#[derive(Debug)]
struct Settings {
    test: bool,
    db_bytes: u64,
    log_bytes: u64,
    boot_bytes: u64,
    boot_log_bytes: u64,
    reps: usize,
    dir: PathBuf,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / MB as f64
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Feeds page sets to uploaders as the records a primary would send
/// (epoch 1, one record per transaction), all confirmed.
#[derive(Debug)]
struct Feeder {
    source: MemSource,
    last: Bookmark,
    chain: ChainHash,
    clock_us: u64,
    /// Record bytes pushed in all, and since the last round.
    log_bytes: u64,
    unrounded: u64,
}

impl Feeder {
    fn new() -> Feeder {
        Feeder {
            source: MemSource::new(Epoch(1)),
            last: Bookmark::ZERO,
            chain: ChainHash::GENESIS,
            // A day ago: inside the default 30-day retention.
            clock_us: walrelay_archive::archiver::now_us() - 86_400_000_000,
            log_bytes: 0,
            unrounded: 0,
        }
    }

    /// Pushes one transaction; returns its bookmark and commit time.
    fn push(&mut self, set: &PageSet, gap_us: u64) -> (Bookmark, u64) {
        self.clock_us += gap_us;
        let bookmark = Bookmark::new(Epoch(1), self.last.sequence.next().expect("sequence"));
        let r = Record {
            bookmark,
            previous: self.last,
            prev_chain: self.chain,
            commit_us: self.clock_us,
            page_size: PAGE,
            db_pages: set.db_pages,
            pages: set
                .pages
                .iter()
                .map(|(p, b)| (*p, Bytes::copy_from_slice(b)))
                .collect(),
        };
        let e = r.to_encoded().expect("record");
        self.chain = e.chain;
        self.last = bookmark;
        self.log_bytes += e.bytes.len() as u64;
        self.unrounded += e.bytes.len() as u64;
        self.source.push(e);
        (bookmark, self.clock_us)
    }

    fn round(&mut self, up: &mut Archiver, flush: Flush) -> RoundReport {
        self.source.confirm(self.last);
        self.unrounded = 0;
        up.round(&self.source, flush).expect("archive round")
    }

    /// An upload round once about an object's worth is pending.
    fn maybe_round(&mut self, up: &mut Archiver) {
        if self.unrounded >= ROUND_BYTES {
            self.round(up, Flush::Log);
        }
    }
}

/// Snapshots only when a round is `Flush::All`; nothing kept locally.
fn config(work: &Path) -> ArchiverConfig {
    let mut c = ArchiverConfig::new(DB, work.to_path_buf());
    c.snapshot_log_bytes = u64::MAX / 8;
    c.snapshot_every_ms = u64::MAX / 8;
    c.local_keep_bytes = 0;
    c
}

fn hash_file(path: &Path) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path).expect("open"))
        .expect("read");
    h.finalize()
}

/// The whole database file as load transactions.
fn load(h: &SqliteHistory, f: &mut Feeder, up: &mut Archiver) {
    let n = h.db_pages().expect("page count");
    let mut first = 1;
    while first <= n {
        let count = LOAD_TXN_PAGES.min(n - first + 1);
        let bytes = h.read_pages(first, count).expect("read pages");
        let set = PageSet {
            pages: bytes
                .chunks(PAGE as usize)
                .enumerate()
                .map(|(i, p)| (first + i as u32, p.to_vec()))
                .collect(),
            db_pages: first + count - 1,
        };
        f.push(&set, LOAD_GAP_US);
        f.maybe_round(up);
        first += count;
    }
}

/// A point of the history a restore is checked against.
#[derive(Debug, Clone, Copy)]
struct Point {
    bookmark: Bookmark,
    commit_us: u64,
    hash: blake3::Hash,
}

/// OLTP transactions until `bytes` of records; at each fraction of the
/// way in `marks`, the point reached (with the database file's hash).
fn updates(
    h: &mut SqliteHistory,
    f: &mut Feeder,
    up: &mut Archiver,
    bytes: u64,
    marks: &[f64],
) -> Vec<Point> {
    let start = f.log_bytes;
    let mut points = Vec::new();
    while f.log_bytes - start < bytes {
        let set = h.transaction().expect("transaction");
        let (bookmark, commit_us) = f.push(&set, TXN_GAP_US);
        let done = (f.log_bytes - start) as f64 / bytes as f64;
        if marks.get(points.len()).is_some_and(|&m| done >= m) {
            points.push(Point {
                bookmark,
                commit_us,
                hash: hash_file(h.path()),
            });
        }
        f.maybe_round(up);
    }
    assert_eq!(points.len(), marks.len(), "every mark reached");
    points
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("dir entry");
            if e.file_type().expect("file type").is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

fn evict_all(paths: &[PathBuf]) {
    for p in paths {
        evict(p).unwrap_or_else(|e| panic!("evict {}: {e}", p.display()));
    }
}

/// The store's files a restore of `target` reads (snapshot parts, log
/// objects), from its plan.
fn plan_files(store: &Store, store_dir: &Path, target: Bookmark) -> Vec<PathBuf> {
    let a = Archive::new(store.clone(), DB);
    let m = a.manifest().expect("manifest");
    let plan = a.plan(&m, target).expect("plan");
    let mut keys = Vec::new();
    if let Some(s) = plan.snapshot {
        for p in 0..m.snapshot_id(&s).parts() {
            keys.push(names::snapshot_part_key(DB, s.bookmark, s.generation, p));
        }
    }
    keys.extend(plan.logs.iter().map(|n| names::log_key(DB, n)));
    keys.iter()
        .map(|k| {
            let p = store_dir.join(k);
            assert!(p.is_file(), "store object {k} is not at {}", p.display());
            p
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Latest,
    At(Bookmark),
    Time(u64),
}

/// One timed restore (manifest, the time's bookmark, the restore).
fn restore_once(store: &Store, target: Target, out: &Path) -> (Duration, Restored) {
    let _ = std::fs::remove_file(out);
    let start = Instant::now();
    let a = Archive::new(store.clone(), DB);
    let m = a.manifest().expect("manifest");
    let b = match target {
        Target::Latest => m.log_end,
        Target::At(b) => b,
        Target::Time(t) => a.bookmark_at_time(&m, t).expect("bookmark at time"),
    };
    let r = restore_to_file(&a, &m, b, out, &NoProgress).expect("restore");
    (start.elapsed(), r)
}

/// The floor of a restore: read `files`, write `out_bytes` durably.
fn floor_once(files: &[PathBuf], out_bytes: u64, scratch: &Path) -> (Duration, Duration, u64) {
    let (read, n) = read_files(files).expect("read floor");
    let write = write_synced(scratch, out_bytes).expect("write floor");
    std::fs::remove_file(scratch).expect("remove floor file");
    (read, write, n)
}

struct Built {
    store: Store,
    store_dir: PathBuf,
    history: SqliteHistory,
    feeder: Feeder,
    up: Archiver,
    latest: Point,
    at_s2: Point,
    pitr: Point,
    pitr_time: Point,
}

fn build(s: &Settings) -> Built {
    let started = Instant::now();
    let store_dir = s.dir.join("store");
    let store = Store::open(store_dir.to_str().expect("utf-8")).expect("store");
    let mut history =
        SqliteHistory::create(&s.dir.join("source.db"), s.db_bytes, 1).expect("database");
    let created = started.elapsed();
    let mut feeder = Feeder::new();
    let mut up = Archiver::new(store.clone(), config(&s.dir.join("work")));
    load(&history, &mut feeder, &mut up);
    let s1 = feeder.round(&mut up, Flush::All).snapshot.expect("S1");
    let marks = updates(&mut history, &mut feeder, &mut up, s.log_bytes, &[0.5, 0.9]);
    let s2 = feeder.round(&mut up, Flush::All).snapshot.expect("S2");
    let at_s2 = Point {
        bookmark: s2,
        commit_us: feeder.clock_us,
        hash: hash_file(history.path()),
    };
    updates(&mut history, &mut feeder, &mut up, s.log_bytes, &[]);
    feeder.round(&mut up, Flush::Log);
    let latest = Point {
        bookmark: feeder.last,
        commit_us: feeder.clock_us,
        hash: hash_file(history.path()),
    };
    let raw = u64::from(history.db_pages().expect("pages")) * u64::from(PAGE);
    let stored: u64 = files_under(&store_dir)
        .iter()
        .map(|p| p.metadata().expect("stat").len())
        .sum();
    let m = Archive::new(store.clone(), DB)
        .manifest()
        .expect("manifest");
    let s2e = m.snapshots.iter().find(|e| e.bookmark == s2).expect("S2");
    let s2_files = plan_files(&store, &store_dir, s2e.bookmark);
    let s2_bytes: u64 = s2_files.iter().map(|p| p.metadata().unwrap().len()).sum();
    println!(
        "lifecycle setup: database {:.1} MB ({} pages) in {:.1} s, archived in {:.1} s: S1 {s1}, {:.1} MB of log, S2 {s2} ({} parts, {:.1} MB, zstd ratio {:.2}), {:.1} MB of log to {}; store {:.1} MB",
        mb(raw),
        raw / u64::from(PAGE),
        secs(created),
        secs(started.elapsed() - created),
        mb(s.log_bytes),
        s2_files.len(),
        mb(s2_bytes),
        u64::from(s2e.db_pages) as f64 * f64::from(PAGE) / s2_bytes as f64,
        mb(s.log_bytes),
        latest.bookmark,
        mb(stored),
    );
    Built {
        store,
        store_dir,
        history,
        feeder,
        up,
        latest,
        at_s2,
        pitr: marks[0],
        pitr_time: marks[1],
    }
}

/// Restores of `target` cold and warm, beside their floors; prints them.
fn measure_restore(
    s: &Settings,
    b: &Built,
    name: &str,
    target: Target,
    expect: Point,
    anchor: Option<f64>,
) {
    let out = s.dir.join("restored.db");
    let scratch = s.dir.join("floor.out");
    let files = plan_files(&b.store, &b.store_dir, expect.bookmark);
    let all = files_under(&b.store_dir);
    // First, untimed: check the restore is the database, byte for byte.
    let (_, r) = restore_once(&b.store, target, &out);
    assert_eq!(r.bookmark, expect.bookmark, "{name}: restored bookmark");
    assert_eq!(hash_file(&out), expect.hash, "{name}: restored bytes");
    let out_bytes = u64::from(r.db_pages) * u64::from(r.page_size);
    for cold in [true, false] {
        let (mut t, mut fr, mut fw) = (Vec::new(), Vec::new(), Vec::new());
        let mut read_bytes = 0;
        for _ in 0..s.reps {
            if cold {
                evict_all(&all);
            }
            t.push(restore_once(&b.store, target, &out).0);
            if cold {
                evict_all(&all);
            }
            let (r, w, n) = floor_once(&files, out_bytes, &scratch);
            fr.push(r);
            fw.push(w);
            read_bytes = n;
        }
        let best = secs(*t.iter().min().expect("samples"));
        let (t, fr, fw) = (secs(median(&t)), secs(median(&fr)), secs(median(&fw)));
        let floor = fr + fw;
        let temp = if cold { "cold" } else { "warm" };
        let verdict = match anchor {
            Some(a) if t <= TARGET_S => format!(
                "target <= {TARGET_S} s: met | Litestream {a:.2} s: {:.2}x",
                t / a
            ),
            Some(a) => format!(
                "target <= {TARGET_S} s: MISSED | Litestream {a:.2} s: {:.2}x",
                t / a
            ),
            None => "no target (shows the snapshot's share)".to_string(),
        };
        println!(
            "lifecycle restore {name:<13} {temp}: {t:.3} s | floor {floor:.3} s (read {:.1} MB in {fr:.3} s + write {:.1} MB in {fw:.3} s) | ratio {:.2}x | {verdict} | {} objects, median of {} (best {best:.3} s)",
            mb(read_bytes),
            mb(out_bytes),
            t / floor,
            files.len(),
            s.reps
        );
    }
}

/// Encodes the image at `path` into snapshot parts and puts them (two
/// parts at a time, as the uploader does), under a bench-only database
/// id; returns the time.
fn encode_put(store: &Store, path: &Path, generation: u32) -> Duration {
    let db_pages = (path.metadata().expect("stat").len() / u64::from(PAGE)) as u32;
    let id = SnapshotId {
        database: DatabaseId(0xbe),
        bookmark: Bookmark::new(Epoch(1), walrelay_replicator::Sequence(1)),
        chain: ChainHash::GENESIS,
        commit_us: 0,
        page_size: PAGE,
        db_pages,
    };
    let image = Image::open(path, PAGE, db_pages).expect("image");
    let parts: Vec<u32> = (0..id.parts()).collect();
    let start = Instant::now();
    for batch in parts.chunks(2) {
        let encoded: Vec<Vec<u8>> = std::thread::scope(|sc| {
            let hs: Vec<_> = batch
                .iter()
                .map(|&p| {
                    let (image, id) = (&image, &id);
                    sc.spawn(move || {
                        let (first, count) = id.part_pages(p);
                        let pages = image.read_pages(first, count).expect("pages");
                        snapshot::encode_part(id, p, &pages).expect("encode")
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("encoder")).collect()
        });
        for (&p, bytes) in batch.iter().zip(encoded) {
            let key = names::snapshot_part_key(id.database, id.bookmark, Epoch(generation), p);
            store.create(&key, Bytes::from(bytes)).expect("put part");
        }
    }
    start.elapsed()
}

/// The CPU floor of the same bytes: zstd level 3 (the archive's level) of
/// the image at `path` in 16 MiB parts on every core, compressing and then
/// decompressing, from and to memory. Prints MB/s of raw bytes.
fn zstd_floor(path: &Path) {
    let raw = std::fs::read(path).expect("read image");
    let parts: Vec<&[u8]> = raw.chunks(snapshot::PART_RAW_BYTES as usize).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let on_cores = |f: &(dyn Fn(usize) -> Vec<u8> + Sync)| -> (Duration, Vec<Vec<u8>>) {
        let start = Instant::now();
        let mut out = Vec::new();
        for batch in (0..parts.len()).collect::<Vec<_>>().chunks(cores) {
            out.extend(std::thread::scope(|sc| {
                let hs: Vec<_> = batch.iter().map(|&i| sc.spawn(move || f(i))).collect();
                hs.into_iter()
                    .map(|h| h.join().expect("zstd"))
                    .collect::<Vec<_>>()
            }));
        }
        (start.elapsed(), out)
    };
    let (c, frames) = on_cores(&|i| zstd::bulk::compress(parts[i], 3).expect("compress"));
    let (d, _) =
        on_cores(&|i| zstd::bulk::decompress(&frames[i], parts[i].len()).expect("decompress"));
    let z: usize = frames.iter().map(Vec::len).sum();
    println!(
        "lifecycle cpu floor zstd-3 on {cores} threads: compress {:.0} MB/s, decompress {:.0} MB/s of raw ({:.1} MB -> {:.1} MB, in 16 MiB parts)",
        mb(raw.len() as u64) / secs(c),
        mb(raw.len() as u64) / secs(d),
        mb(raw.len() as u64),
        mb(z as u64)
    );
}

/// Snapshot rounds (one small transaction first, so there is something
/// new) and encode+put alone, to `store`; prints MB/s of raw database.
fn measure_snapshots(
    s: &Settings,
    b: &mut Built,
    up: Option<&mut Archiver>,
    store: &Store,
    kind: &str,
) {
    let up = match up {
        Some(u) => u,
        None => &mut b.up,
    };
    let raw = u64::from(b.history.db_pages().expect("pages")) * u64::from(PAGE);
    let (mut rounds, mut puts) = (Vec::new(), Vec::new());
    let image = s.dir.join("restored.db");
    let stats = up.stats();
    let carried = || stats.snapshot_parts_carried.load(Ordering::Relaxed);
    let carried_before = carried();
    for i in 0..s.reps.min(3) {
        let set = b.history.transaction().expect("transaction");
        b.feeder.push(&set, TXN_GAP_US);
        b.feeder.round(up, Flush::Log);
        let start = Instant::now();
        let report = b.feeder.round(up, Flush::All);
        rounds.push(start.elapsed());
        assert!(report.snapshot.is_some(), "{kind}: a snapshot was cut");
        puts.push(encode_put(store, &image, 100 + i as u32));
    }
    let (r, p) = (median(&rounds), median(&puts));
    let parts = raw.div_ceil(snapshot::PART_RAW_BYTES);
    println!(
        "lifecycle snapshot upload {kind:<12}: round (log + snapshot from the previous one + put) {:.3} s = {:.0} MB/s of raw database | encode+put alone {:.3} s = {:.0} MB/s | {:.1} MB raw, {} of {} parts carried over, median of {}",
        secs(r),
        mb(raw) / secs(r),
        secs(p),
        mb(raw) / secs(p),
        mb(raw),
        carried() - carried_before,
        parts * rounds.len() as u64,
        rounds.len()
    );
}

/// Copies what a restore of the newest state reads, and the newest
/// manifest, from the filesystem store to `to`.
fn copy_latest(b: &Built, to: &Store) {
    let m = Archive::new(b.store.clone(), DB)
        .manifest()
        .expect("manifest");
    let mut keys = vec![names::manifest_key(DB, m.sequence)];
    for p in plan_files(&b.store, &b.store_dir, m.log_end) {
        let k = p.strip_prefix(&b.store_dir).expect("under the store");
        keys.push(k.to_str().expect("utf-8").to_string());
    }
    for k in keys {
        let bytes = b.store.get(&k).expect("get").expect("object");
        to.create(&k, bytes).expect("put");
    }
}

fn measure_s3(s: &Settings, b: &mut Built) {
    let emu = match S3Emulator::start() {
        Ok(e) => e,
        Err(e) => {
            println!("lifecycle snapshot upload s3-emulator: skipped ({e})");
            return;
        }
    };
    let s3 = Store::open(&emu.url("lifecycle")).expect("S3 store");
    let started = Instant::now();
    copy_latest(b, &s3);
    let copied = started.elapsed();
    let mut up = Archiver::new(s3.clone(), config(&s.dir.join("work-s3")));
    measure_snapshots(s, b, Some(&mut up), &s3, "s3-emulator");
    let out = s.dir.join("restored-s3.db");
    let mut t = Vec::new();
    for _ in 0..s.reps.min(3) {
        t.push(restore_once(&s3, Target::Latest, &out).0);
    }
    let _ = std::fs::remove_file(&out);
    println!(
        "lifecycle restore latest (s3-emulator, informative: moto is one Python process): {:.3} s, median of {} (copying the objects in took {:.1} s)",
        secs(median(&t)),
        t.len(),
        secs(copied)
    );
}

/// A replica's bootstrap from the store next to `cp` of the database.
fn measure_bootstrap(s: &Settings) {
    let dir = s.dir.join("boot");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let store_dir = dir.join("store");
    let store = Store::open(store_dir.to_str().expect("utf-8")).expect("store");
    let started = Instant::now();
    let mut h = SqliteHistory::create(&dir.join("source.db"), s.boot_bytes, 2).expect("database");
    let mut f = Feeder::new();
    let mut up = Archiver::new(store.clone(), config(&dir.join("work")));
    load(&h, &mut f, &mut up);
    f.round(&mut up, Flush::All);
    updates(&mut h, &mut f, &mut up, s.boot_log_bytes, &[]);
    f.round(&mut up, Flush::Log);
    let expect = hash_file(h.path());
    let raw = h.path().metadata().expect("stat").len();
    println!(
        "lifecycle bootstrap setup: database {:.1} MB (a snapshot and {:.1} MB of log after it), built and archived in {:.1} s",
        mb(raw),
        mb(s.boot_log_bytes),
        secs(started.elapsed())
    );
    let out = dir.join("replica.sqlite");
    let copy = dir.join("copy.sqlite");
    let all = files_under(&store_dir);
    let (mut boot, mut cp, mut cp_warm) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..s.reps.min(3) {
        let _ = std::fs::remove_file(&out);
        evict_all(&all);
        let start = Instant::now();
        walrelay_engine::replication::bootstrap(&store, DB, &out)
            .expect("bootstrap")
            .expect("bootstrapped from the store");
        boot.push(start.elapsed());
        if i == 0 {
            assert_eq!(hash_file(&out), expect, "bootstrapped bytes");
        }
        let _ = std::fs::remove_file(&out);
        for cold in [true, false] {
            let _ = std::fs::remove_file(&copy);
            if cold {
                evict(h.path()).expect("evict");
            }
            let start = Instant::now();
            let ok = std::process::Command::new("cp")
                .arg(h.path())
                .arg(&copy)
                .status()
                .expect("cp");
            assert!(ok.success(), "cp failed");
            if cold {
                std::fs::File::open(&copy)
                    .and_then(|f| f.sync_all())
                    .expect("fsync");
                cp.push(start.elapsed());
            } else {
                cp_warm.push(start.elapsed());
            }
        }
        let _ = std::fs::remove_file(&copy);
    }
    let best = secs(*boot.iter().min().expect("samples"));
    let (t, c, w) = (
        secs(median(&boot)),
        secs(median(&cp)),
        secs(median(&cp_warm)),
    );
    println!(
        "lifecycle bootstrap {:.0} MB cold: {t:.3} s ({:.0} MB/s) | floor cp cold + fsync {c:.3} s | ratio {:.2}x | cp warm, no fsync {w:.3} s | median of {} (best {best:.3} s)",
        mb(raw),
        mb(raw) / t,
        t / c,
        boot.len()
    );
}

fn main() {
    // cargo passes `--bench`, and CI `-- --test`.
    let test = std::env::args().skip(1).any(|a| a == "--test");
    let tmp = match std::env::var_os("WALRELAY_LIFECYCLE_DIR") {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("tempdir");
    let (db, log, boot, boot_log, reps) = if test {
        (4, 1, 8, 1, 1)
    } else {
        (200, 64, 1024, 16, 5)
    };
    let s = Settings {
        test,
        db_bytes: env_u64("WALRELAY_LIFECYCLE_MB", db) * MB,
        log_bytes: env_u64("WALRELAY_LIFECYCLE_LOG_MB", log) * MB,
        boot_bytes: env_u64("WALRELAY_LIFECYCLE_BOOTSTRAP_MB", boot) * MB,
        boot_log_bytes: boot_log * MB,
        reps: env_u64("WALRELAY_LIFECYCLE_REPS", reps).max(1) as usize,
        dir: tmp.path().to_path_buf(),
    };
    println!(
        "lifecycle: dir={} test={} database={} MB log={} MB bootstrap={} MB reps={} loadavg={}",
        s.dir.display(),
        s.test,
        mb(s.db_bytes),
        mb(s.log_bytes),
        mb(s.boot_bytes),
        s.reps,
        loadavg()
    );
    let mut b = build(&s);
    let (latest, at_s2, pitr, at_time) = (b.latest, b.at_s2, b.pitr, b.pitr_time);
    let (ls_latest, ls_pitr) = (Some(LITESTREAM_LATEST_S), Some(LITESTREAM_PITR_S));
    measure_restore(&s, &b, "latest", Target::Latest, latest, ls_latest);
    measure_restore(
        &s,
        &b,
        "pitr-bookmark",
        Target::At(pitr.bookmark),
        pitr,
        ls_pitr,
    );
    // Halfway to the next transaction's commit: names `at_time`.
    let ts = at_time.commit_us + TXN_GAP_US / 2;
    measure_restore(&s, &b, "pitr-time", Target::Time(ts), at_time, ls_pitr);
    // The newest snapshot alone (no log after it): the snapshot's share.
    measure_restore(
        &s,
        &b,
        "snapshot-only",
        Target::At(at_s2.bookmark),
        at_s2,
        None,
    );
    zstd_floor(&s.dir.join("restored.db"));
    let fs = b.store.clone();
    measure_snapshots(&s, &mut b, None, &fs, "filesystem");
    measure_s3(&s, &mut b);
    measure_bootstrap(&s);
    println!("lifecycle: done, loadavg={}", loadavg());
    if std::env::var_os("WALRELAY_LIFECYCLE_KEEP").is_some() {
        println!("lifecycle: kept {}", tmp.keep().display());
    }
}
