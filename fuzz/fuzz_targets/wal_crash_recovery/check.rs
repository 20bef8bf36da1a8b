//! The properties checked after opening a mutated state: of a replica and
//! of a primary (see the target's module docs).

use super::*;

pub(crate) fn check_replica(base: &Base, sc: &Scenario, files: &Files) {
    let Role::Replica {
        durable, history, ..
    } = &sc.role
    else {
        unreachable!()
    };
    let db = base.run.join("replica.db");
    let intact = intact_frames(sc, files);
    // The watermark the open will find.
    let mark = read_mark(&base.scratch, files[MARK].as_deref());
    let (m, k) = match &mark {
        Some(Err(_)) => (None, None),
        None => (
            Some(Watermark {
                bookmark: Bookmark::ZERO,
                salt: [0; 8],
                frame: 0,
                checksum: Default::default(),
                db_pages: 0,
                page_size: PAGE_SIZE,
            }),
            Some(0),
        ),
        Some(Ok(m)) => (Some(*m), history.iter().find(|h| h.0 == *m).map(|h| h.1)),
    };
    let crash_state = m == Some(*durable);
    let base_db = sc.files[DB].as_deref().unwrap_or_default();
    let base_pages = (base_db.len() / PS) as u32;
    let (cover, db_ok, prefix_ok) = match m {
        Some(m) if m.frame > 0 && sc.scan.salt == Some(m.salt) => {
            let (cover, _) = sc.scan.cover(intact.min(m.frame as usize));
            let ok = db_plausible(base_db, files[DB].as_deref(), &cover, m.db_pages);
            (cover, ok, intact >= m.frame as usize)
        }
        // No WAL frame survives the open: the database file alone, whose
        // size is its length in the base state.
        Some(m) => {
            let cover = BTreeSet::new();
            let ok = db_plausible(base_db, files[DB].as_deref(), &cover, base_pages);
            (cover, ok, m.frame == 0)
        }
        None => (BTreeSet::new(), false, false),
    };
    let must_open = crash_state && db_ok && prefix_ok;
    let ctx = || {
        format!(
            "{}: watermark {m:?} (history {k:?}, durable {durable:?}), intact frames {intact}, \
             cover {cover:?}, db plausible {db_ok}, prefix intact {prefix_ok}; {}",
            sc.name,
            changes(sc, files)
        )
    };

    let opened = ReplicaWal::open(
        &db,
        ReplicaInit {
            page_size: PAGE_SIZE,
            bookmark: Bookmark::ZERO,
        },
    );
    let mut r = match opened {
        Err(e) => {
            assert!(
                !must_open,
                "a crash state of the replica did not open: {e:?}\n{}\n{}",
                ctx(),
                sqlite_log::recent()
            );
            trace(|| format!("refused: {e} | {}", ctx()));
            return;
        }
        Ok(r) => r,
    };
    assert!(
        !matches!(mark, Some(Err(_))),
        "opened although the watermark file cannot be read\n{}",
        ctx()
    );
    // Forged watermarks say what they say: only the absence of panics.
    let Some(k) = k else {
        trace(|| format!("opened on a forged watermark | {}", ctx()));
        return;
    };
    assert_eq!(r.confirmed(), bm(k), "confirmed position\n{}", ctx());
    if !db_ok {
        trace(|| format!("opened on media damage | {}", ctx()));
        return; // media damage the WAL does not cover
    }
    let reader = open_vfs(&db, OpenFlags::SQLITE_OPEN_READ_ONLY);
    let reader = match reader {
        Ok(c) => c,
        Err(e) => {
            assert!(!must_open, "no reader on a crash state: {e}\n{}", ctx());
            return;
        }
    };
    let state = seen(&reader);
    match &state {
        Ok(Seen::Whole(j)) => assert!(
            *j <= sc.durable_state,
            "revealed transaction {j} past the durable watermark\n{}",
            ctx()
        ),
        Ok(Seen::Mixed { max_marker, why }) => assert!(
            *max_marker <= sc.durable_state,
            "revealed marker {max_marker} past the durable watermark ({why})\n{}",
            ctx()
        ),
        Err(e) => assert!(!must_open, "read failed on a crash state: {e}\n{}", ctx()),
    }
    // The database file does not run ahead of the watermark found: exactly
    // its transaction, intact.
    if k >= sc.db_state && prefix_ok {
        assert_eq!(
            state.as_ref().ok(),
            Some(&Seen::Whole(k)),
            "state after recovery\n{}",
            ctx()
        );
        let check = integrity(&reader);
        assert!(
            check.as_ref().is_ok_and(|v| v == &["ok"]),
            "integrity_check after recovery: {check:?}\n{}",
            ctx()
        );
    }
    if !must_open {
        trace(|| format!("opened, saw {state:?} | {}", ctx()));
        return;
    }
    // And it goes on: the next transaction appends, reveals and
    // checkpoints.
    let next = k + 1;
    let a = r
        .append(bm(next), &base.txns[next as usize - 1])
        .unwrap_or_else(|e| panic!("append {next} after recovery: {e}\n{}", ctx()));
    assert!(matches!(a, Appended::Applied { .. }), "{}", ctx());
    r.confirm(bm(next))
        .unwrap_or_else(|e| panic!("confirm {next} after recovery: {e}\n{}", ctx()));
    assert_eq!(seen(&reader).ok(), Some(Seen::Whole(next)), "{}", ctx());
    r.checkpoint()
        .unwrap_or_else(|e| panic!("checkpoint after recovery: {e}\n{}", ctx()));
    assert_eq!(seen(&reader).ok(), Some(Seen::Whole(next)), "{}", ctx());
    assert!(integrity_ok(&reader), "integrity after going on\n{}", ctx());
    // Readers and checkpoints trust the applier's wal-index; only a
    // recovery checks that the frames written after the crash continue the
    // checksum chain: persist, close, reopen.
    r.persist()
        .unwrap_or_else(|e| panic!("persist after recovery: {e}\n{}", ctx()));
    drop(reader);
    drop(r);
    let r = ReplicaWal::open(
        &db,
        ReplicaInit {
            page_size: PAGE_SIZE,
            bookmark: Bookmark::ZERO,
        },
    )
    .unwrap_or_else(|e| panic!("reopen after going on: {e}\n{}", ctx()));
    assert_eq!(r.confirmed(), bm(next), "{}", ctx());
    let reader = open_vfs(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap_or_else(|e| panic!("reader after reopen: {e}\n{}", ctx()));
    assert_eq!(seen(&reader).ok(), Some(Seen::Whole(next)), "{}", ctx());
    drop(reader);
    trace(|| format!("crash state: opened at {k}, went on to {next} | {}", ctx()));
}

// ------------------------------------------------------------ primary

pub(crate) fn pages(c: &Connection) -> rusqlite::Result<Vec<Vec<u8>>> {
    let mut s = c.prepare("SELECT data FROM sqlite_dbpage ORDER BY pgno")?;
    s.query_map([], |r| r.get(0))?.collect()
}

pub(crate) fn check_primary(base: &Base, sc: &Scenario, files: &Files) {
    let db = base.run.join("primary.db");
    let intact = intact_frames(sc, files);
    let (cover, c) = sc.scan.cover(intact.min(sc.durable_frame));
    let base_db = sc.files[DB].as_deref().unwrap_or_default();
    // The database's size in pages at that commit (or the file's own).
    let db_pages = if c > 0 {
        sc.scan.frames[c - 1].1
    } else {
        (base_db.len() / PS) as u32
    };
    let db_ok = db_plausible(base_db, files[DB].as_deref(), &cover, db_pages);
    // SQLite's recovery keeps the WAL's valid prefix, up to its last commit.
    let expect = sc.db_state + sc.scan.commits_through(c);
    let ctx = || {
        format!(
            "{}: intact frames {intact}, last intact commit frame {c}, cover {cover:?}, \
             db plausible {db_ok}, expected transaction {expect}; {}",
            sc.name,
            changes(sc, files)
        )
    };
    let rec = Arc::new(Recorder::default());
    let att = attach(&db, rec.clone()).expect("attach");
    // A failure reports its extended code, errno and SQLite's log.
    let conn = open_vfs(&db, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .map_err(|e| format!("{e:?}"))
        .and_then(|c| {
            match c.execute_batch("PRAGMA wal_autocheckpoint=0; PRAGMA synchronous=FULL;") {
                Ok(()) => Ok(c),
                Err(e) => Err(format!("{e:?}, errno {}", sqlite_log::system_errno(&c))),
            }
        });
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            assert!(
                !db_ok,
                "the primary did not open: {e}, capture poisoned: {:?}\n{}\n{}",
                att.poisoned(),
                ctx(),
                sqlite_log::recent()
            );
            trace(|| format!("refused: {e} | {}", ctx()));
            return;
        }
    };
    if !db_ok {
        // Media damage: anything but a panic goes; still try a write.
        let saw = seen(&conn);
        let wrote = conn.execute_batch(&txn_sql(TXNS + 1));
        trace(|| {
            format!(
                "opened on media damage, saw {saw:?}, wrote {wrote:?} | {}",
                ctx()
            )
        });
        return;
    }
    let state = seen(&conn);
    assert_eq!(
        state.as_ref().ok(),
        Some(&Seen::Whole(expect)),
        "state after recovery: {state:?}\n{}",
        ctx()
    );
    let check = integrity(&conn);
    assert!(
        check.as_ref().is_ok_and(|v| v == &["ok"]),
        "integrity_check after recovery: {check:?}\n{}",
        ctx()
    );
    // The next transaction commits and is captured as a page set that
    // turns the database before it into the database after it.
    // `sqlite_dbpage` lists the b-tree's pages; the pager's size (the page
    // set's) can be larger when the file holds pages past the b-tree's end
    // (a file grown by a torn write), so those count as zero pages here and
    // only the b-tree's pages are compared.
    let before = pages(&conn).unwrap_or_else(|e| panic!("pages: {e}\n{}", ctx()));
    conn.execute_batch(&txn_sql(expect + 1))
        .unwrap_or_else(|e| panic!("next commit after recovery: {e}\n{}", ctx()));
    let after = pages(&conn).unwrap_or_else(|e| panic!("pages: {e}\n{}", ctx()));
    assert!(att.poisoned().is_none(), "{:?}\n{}", att.poisoned(), ctx());
    let captured = std::mem::take(&mut *rec.0.lock().expect("recorder"));
    assert_eq!(captured.len(), 1, "one captured transaction\n{}", ctx());
    let ps = &captured[0].pages;
    let before_len = before.len();
    let mut image = before;
    image.resize((ps.db_size_pages() as usize).max(image.len()), vec![0; PS]);
    for (no, data) in ps.pages() {
        image[no.get() as usize - 1] = data.to_vec();
    }
    assert!(
        ps.db_size_pages() as usize >= after.len(),
        "the page set's database size {} is short of the {} pages SQLite has\n{}",
        ps.db_size_pages(),
        after.len(),
        ctx()
    );
    image.truncate(after.len());
    if image != after {
        let differ: Vec<usize> = (0..image.len().max(after.len()))
            .filter(|&i| image.get(i) != after.get(i))
            .map(|i| i + 1)
            .collect();
        let captured: Vec<u32> = ps.pages().iter().map(|(no, _)| no.get()).collect();
        panic!(
            "the captured page set does not reproduce the database: pages {differ:?} differ; \
             {} pages before, {} after, page set of {} pages holds {captured:?}\n{}",
            before_len,
            after.len(),
            ps.db_size_pages(),
            ctx()
        );
    }
    assert_eq!(seen(&conn).ok(), Some(Seen::Whole(expect + 1)), "{}", ctx());
    trace(|| format!("recovered {expect}, captured {} | {}", expect + 1, ctx()));
}
