//! Base states: replicas and primaries built once per process through the
//! public APIs, and the files each one leaves on disk.

use super::*;

/// A WAL's current generation: its salts and its valid frames (page
/// number, database size after a commit frame or 0), in order, up to the
/// first frame that breaks the chain.
#[derive(Debug, Clone, Default)]
pub(crate) struct WalScan {
    pub(crate) salt: Option<[u8; 8]>,
    pub(crate) frames: Vec<(u32, u32)>,
}

pub(crate) fn scan_wal(bytes: &[u8]) -> WalScan {
    let Some(Ok(h)) = bytes.get(..WAL_HEADER_BYTES).map(WalHeader::decode) else {
        return WalScan::default();
    };
    let mut salt = [0u8; 8];
    salt.copy_from_slice(&bytes[16..24]);
    let fb = frame_bytes(h.page_size) as usize;
    let mut prev = h.checksum;
    let mut frames = Vec::new();
    loop {
        let n = frames.len() as u32 + 1;
        let off = frame_offset(h.page_size, FrameNo::new(n)) as usize;
        let Some(frame) = bytes.get(off..off + fb) else {
            break;
        };
        let mut hb = [0u8; FRAME_HEADER_BYTES];
        hb.copy_from_slice(&frame[..FRAME_HEADER_BYTES]);
        let fh = FrameHeader::decode(&hb);
        match fh.validate(&h, FrameNo::new(n), prev, &hb, &frame[FRAME_HEADER_BYTES..]) {
            Ok(ck) => {
                prev = ck;
                frames.push((fh.page_no, fh.commit_db_pages));
            }
            Err(_) => break,
        }
    }
    WalScan {
        salt: Some(salt),
        frames,
    }
}

impl WalScan {
    /// Pages of the frames up to the last commit frame at or before
    /// `limit`, and that commit frame (0: none).
    pub(crate) fn cover(&self, limit: usize) -> (BTreeSet<u32>, usize) {
        let limit = limit.min(self.frames.len());
        let Some(c) = (1..=limit).rev().find(|&i| self.frames[i - 1].1 != 0) else {
            return (BTreeSet::new(), 0);
        };
        (self.frames[..c].iter().map(|f| f.0).collect(), c)
    }

    pub(crate) fn commits_through(&self, frame: usize) -> u64 {
        self.frames[..frame].iter().filter(|f| f.1 != 0).count() as u64
    }
}

pub(crate) enum Role {
    Replica {
        /// The watermark the base state's file yields.
        durable: Watermark,
        /// Every watermark that was persisted while building, with the
        /// transaction it stands for.
        history: Vec<(Watermark, u64)>,
        /// The watermark file as it was after each persist.
        snapshots: Vec<Vec<u8>>,
    },
    Primary,
}

pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) role: Role,
    pub(crate) files: Files,
    pub(crate) scan: WalScan,
    /// Transaction of the durable state.
    pub(crate) durable_state: u64,
    /// Frames of the WAL's generation that the durable state needs.
    pub(crate) durable_frame: usize,
    /// Newest transaction the database file may hold pages of.
    pub(crate) db_state: u64,
}

pub(crate) struct Base {
    pub(crate) run: PathBuf,
    pub(crate) scratch: PathBuf,
    /// `txns[k - 1]` turns state `k - 1` into state `k`.
    pub(crate) txns: Vec<PageSet>,
    pub(crate) scenarios: Vec<Scenario>,
}

pub(crate) fn read_files(db: &Path) -> Files {
    replica_files(db).map(|p| std::fs::read(p).ok())
}

pub(crate) fn write_files(db: &Path, files: &Files) {
    for (p, f) in replica_files(db).iter().zip(files) {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {}: {e}", p.display()),
        }
        if let Some(bytes) = f {
            std::fs::write(p, bytes).expect("write state file");
        }
    }
}

/// The watermark a watermark file's bytes yield, as `ReplicaWal::open`
/// would read it (`None`: the file is missing or empty, so open starts
/// over at its initial watermark; `Some(Err)`: it cannot be read).
pub(crate) fn read_mark(scratch: &Path, bytes: Option<&[u8]>) -> Option<Result<Watermark, String>> {
    let bytes = bytes.filter(|b| !b.is_empty())?;
    let p = scratch.join("mark");
    std::fs::write(&p, bytes).expect("scratch mark");
    let dummy = Watermark {
        bookmark: Bookmark::ZERO,
        salt: [0; 8],
        frame: 0,
        checksum: Default::default(),
        db_pages: 0,
        page_size: PAGE_SIZE,
    };
    Some(
        WatermarkFile::open(&p, dummy)
            .map(|(_, m)| m)
            .map_err(|e| e.to_string()),
    )
}

pub(crate) fn primary_conn(db: &Path) -> (walrelay_vfs::Attachment, Connection, Arc<Recorder>) {
    {
        let c = Connection::open(db).expect("create primary");
        c.execute_batch(&format!(
            "PRAGMA page_size={PAGE_SIZE}; PRAGMA journal_mode=WAL;"
        ))
        .expect("wal");
    }
    let rec = Arc::new(Recorder::default());
    let att = attach(db, rec.clone()).expect("attach primary");
    let c = open_vfs(db, OpenFlags::SQLITE_OPEN_READ_WRITE).expect("open primary");
    c.execute_batch("PRAGMA wal_autocheckpoint=0; PRAGMA synchronous=FULL;")
        .expect("pragmas");
    (att, c, rec)
}

pub(crate) fn checkpoint(c: &Connection) {
    let (mut log, mut done) = (0, 0);
    // SAFETY: a live handle, a NUL-terminated schema name, valid outs.
    let rc = unsafe {
        ffi::sqlite3_wal_checkpoint_v2(
            c.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_CHECKPOINT_PASSIVE,
            &mut log,
            &mut done,
        )
    };
    assert_eq!(rc, ffi::SQLITE_OK, "checkpoint");
    assert_eq!(log, done, "whole WAL checkpointed");
}

pub(crate) fn primary_scenario(
    name: &'static str,
    files: Files,
    durable: u64,
    db_state: u64,
) -> Scenario {
    let scan = scan_wal(files[WAL].as_deref().unwrap_or_default());
    let durable_frame = scan
        .frames
        .iter()
        .rposition(|f| f.1 != 0)
        .map_or(0, |i| i + 1);
    assert_eq!(
        db_state + scan.commits_through(durable_frame),
        durable,
        "{name}: WAL commits"
    );
    Scenario {
        name,
        role: Role::Primary,
        files,
        scan,
        durable_state: durable,
        durable_frame,
        db_state,
    }
}

/// The source primary: its page sets, and a crash image after 6
/// transactions with everything in the WAL.
pub(crate) fn build_primaries(dir: &Path) -> (Vec<PageSet>, Vec<Scenario>) {
    let mut out = Vec::new();
    let db = dir.join("source.db");
    let (att, c, rec) = primary_conn(&db);
    for k in 1..=TXNS {
        c.execute_batch(&txn_sql(k)).expect("source txn");
        if k == 6 {
            out.push(primary_scenario("primary", read_files(&db), 6, 0));
        }
    }
    assert_eq!(seen(&c).expect("source"), Seen::Whole(TXNS));
    drop(c);
    assert!(att.poisoned().is_none());
    drop(att);
    let txns: Vec<PageSet> = rec
        .0
        .lock()
        .expect("recorder")
        .iter()
        .map(|t| t.pages.clone())
        .collect();
    assert_eq!(txns.len() as u64, TXNS);

    // Checkpointed after 3, then 4..6 in a restarted WAL (whose tail still
    // holds frames of the previous generation).
    let db = dir.join("ckpt.db");
    let (att, c, _rec) = primary_conn(&db);
    for k in 1..=6 {
        c.execute_batch(&txn_sql(k)).expect("txn");
        if k == 3 {
            checkpoint(&c);
        }
    }
    out.push(primary_scenario(
        "primary-checkpointed",
        read_files(&db),
        6,
        3,
    ));
    drop(c);
    drop(att);
    (txns, out)
}

pub(crate) enum Step {
    Append(u64),
    /// The first half of transaction `k`'s pages as a non-final chunk.
    Chunk(u64),
    Confirm(u64),
    Persist,
    Checkpoint,
}

pub(crate) fn build_replica(
    dir: &Path,
    scratch: &Path,
    name: &'static str,
    txns: &[PageSet],
    steps: &[Step],
    db_state: u64,
) -> Scenario {
    let db = dir.join(format!("{name}.db"));
    let mark_path = WatermarkFile::path_for(&db);
    let mut history: Vec<(Watermark, u64)> = Vec::new();
    let mut snapshots: Vec<Vec<u8>> = Vec::new();
    let record = |history: &mut Vec<(Watermark, u64)>, snapshots: &mut Vec<Vec<u8>>| {
        let bytes = std::fs::read(&mark_path).expect("mark");
        if snapshots.last() != Some(&bytes) {
            let m = read_mark(scratch, Some(&bytes))
                .expect("mark exists")
                .expect("mark valid");
            history.push((m, m.bookmark.sequence.0));
            snapshots.push(bytes);
        }
    };
    {
        let mut r = ReplicaWal::open(
            &db,
            ReplicaInit {
                page_size: PAGE_SIZE,
                bookmark: Bookmark::ZERO,
            },
        )
        .expect("create replica");
        record(&mut history, &mut snapshots);
        for s in steps {
            match *s {
                Step::Append(k) => {
                    let a = r.append(bm(k), &txns[k as usize - 1]).expect("append");
                    assert!(matches!(a, Appended::Applied { .. }));
                }
                Step::Chunk(k) => {
                    let ps = &txns[k as usize - 1];
                    let half = PageSet::new(
                        ps.page_size(),
                        ps.db_size_pages(),
                        ps.pages()[..ps.len().div_ceil(2)].to_vec(),
                    )
                    .expect("chunk");
                    r.append_chunk(bm(k), &half, false).expect("chunk");
                }
                Step::Confirm(k) => r.confirm(bm(k)).expect("confirm"),
                Step::Persist => r.persist().expect("persist"),
                Step::Checkpoint => {
                    r.checkpoint().expect("checkpoint");
                }
            }
            record(&mut history, &mut snapshots);
        }
    }
    let files = read_files(&db);
    let durable = read_mark(scratch, files[MARK].as_deref())
        .expect("mark")
        .expect("mark valid");
    assert_eq!(Some(&durable), history.last().map(|h| &h.0));
    let scan = scan_wal(files[WAL].as_deref().unwrap_or_default());
    if durable.frame > 0 {
        assert_eq!(scan.salt, Some(durable.salt), "{name}: generation");
        assert!(
            scan.frames[durable.frame as usize - 1].1 != 0,
            "{name}: commit"
        );
    }
    Scenario {
        name,
        role: Role::Replica {
            durable,
            history,
            snapshots,
        },
        files,
        scan,
        durable_state: durable.bookmark.sequence.0,
        durable_frame: durable.frame as usize,
        db_state,
    }
}

pub(crate) fn build() -> Base {
    const PREFIX: &str = "walrelay-fuzz-crash-";
    let parent = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    // Work directories of earlier processes of this target that are gone.
    for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix(PREFIX));
        if pid.is_some_and(|p| !Path::new("/proc").join(p).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let root = parent.join(format!("{PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (build, run, scratch) = (root.join("build"), root.join("run"), root.join("scratch"));
    for d in [&build, &run, &scratch] {
        std::fs::create_dir_all(d).expect("work dir");
    }
    // Initialises SQLite before seeding its PRNG.
    drop(Connection::open_in_memory().expect("sqlite"));
    seed_prng();
    let (txns, mut scenarios) = build_primaries(&build);
    use Step::*;
    let replicas: [(&'static str, Vec<Step>, u64); 4] = [
        // W@2, W@3 persisted; 4 confirmed only; 5 unconfirmed; half of 6.
        (
            "replica",
            vec![
                Append(1),
                Append(2),
                Confirm(2),
                Persist,
                Append(3),
                Confirm(3),
                Persist,
                Append(4),
                Confirm(4),
                Append(5),
                Chunk(6),
            ],
            0,
        ),
        // The database file holds 1..3 (checkpointed while 4 was
        // unconfirmed, so the WAL keeps its generation); W@4 persisted.
        (
            "replica-checkpointed",
            vec![
                Append(1),
                Append(2),
                Append(3),
                Confirm(3),
                Append(4),
                Checkpoint,
                Confirm(4),
                Persist,
                Append(5),
                Confirm(5),
                Append(6),
            ],
            3,
        ),
        // Checkpointed at 3, then appending 4 restarted the WAL (watermark
        // frame 0 in the new generation); W@4 in the new generation.
        (
            "replica-restarted",
            vec![
                Append(1),
                Append(2),
                Append(3),
                Confirm(3),
                Checkpoint,
                Append(4),
                Confirm(4),
                Persist,
                Append(5),
                Confirm(5),
                Append(6),
            ],
            3,
        ),
        // As above, but the durable watermark is the restart's (frame 0).
        (
            "replica-restart-frame0",
            vec![
                Append(1),
                Append(2),
                Append(3),
                Confirm(3),
                Checkpoint,
                Append(4),
                Confirm(4),
                Append(5),
            ],
            3,
        ),
    ];
    for (name, steps, db_state) in replicas {
        scenarios.push(build_replica(
            &build, &scratch, name, &txns, &steps, db_state,
        ));
    }
    let _ = std::fs::remove_dir_all(&build);
    for (i, sc) in scenarios.iter().enumerate() {
        trace(|| {
            format!(
                "scenario {i} {}: durable transaction {} (frame {}), database file at {}, \
                 {} bytes, WAL {} bytes with {} valid frames",
                sc.name,
                sc.durable_state,
                sc.durable_frame,
                sc.db_state,
                sc.files[DB].as_ref().map_or(0, Vec::len),
                sc.files[WAL].as_ref().map_or(0, Vec::len),
                sc.scan.frames.len()
            )
        });
    }
    Base {
        run,
        scratch,
        txns,
        scenarios,
    }
}

pub(crate) static BASE: OnceLock<Base> = OnceLock::new();

/// `WALRELAY_FUZZ_TRACE=1` prints the base states and, per execution, how
/// it was classified and what happened (to see which checks inputs reach).
pub(crate) fn trace(line: impl FnOnce() -> String) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("WALRELAY_FUZZ_TRACE").is_some()) {
        eprintln!("{}", line());
    }
}
