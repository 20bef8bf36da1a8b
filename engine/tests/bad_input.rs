//! Bad input gets a clear, typed error and changes nothing.

mod common;

use common::{Recorder, logical_pages};
use std::path::Path;
use std::sync::Arc;
use walrelay_engine::{
    Bookmark, BookmarkParseError, Constraint, Database, Epoch, OpenError, Options, QueryError,
    Refusal, Sequence, Session, SessionError, Value,
};

struct Fixture {
    _dir: tempfile::TempDir,
    db: Database,
    rec: Arc<Recorder>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = Arc::new(Recorder::default());
    let db = Database::open(
        dir.path().join("db.sqlite"),
        Options {
            sink: Some(rec.clone()),
            ..Options::default()
        },
    )
    .expect("open");
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER) STRICT")
        .run()
        .expect("create");
    s.prepare("INSERT INTO t(name, n) VALUES ('a', 1), ('b', 2)")
        .run()
        .expect("insert");
    Fixture { _dir: dir, db, rec }
}

/// Runs `f` and asserts it left the database exactly as it was.
fn unchanged<T>(fx: &Fixture, f: impl FnOnce(&Session) -> T) -> T {
    let s = fx.db.session(Constraint::FirstPrimary).expect("session");
    let pages = logical_pages(&s);
    let bookmark = fx.db.latest_bookmark();
    let captured = fx.rec.len();
    let out = f(&s);
    assert_eq!(fx.db.latest_bookmark(), bookmark, "no bookmark was issued");
    assert_eq!(fx.rec.len(), captured, "no transaction was captured");
    assert!(logical_pages(&s) == pages, "no page changed");
    out
}

#[test]
fn invalid_sql_is_a_typed_sql_error() {
    let fx = fixture();
    for sql in [
        "SELEC 1",
        "INSERT INTO missing VALUES (1)",
        "UPDATE t SET nope = 1",
        "",
    ] {
        let e = unchanged(&fx, |s| s.prepare(sql).run().expect_err("invalid"));
        assert!(matches!(e, QueryError::Sql { .. }), "{sql:?}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn sql_text_holding_a_nul_character_is_refused_not_cut_short_at_it() {
    let fx = fixture();
    for sql in [
        "SELECT 1\0; DELETE FROM t",
        "DELETE FROM t WHERE id = 1\0 OR 1",
        "INSERT INTO t(name) VALUES ('x')\0",
    ] {
        let e = unchanged(&fx, |s| s.prepare(sql).run().expect_err("a NUL"));
        assert!(
            matches!(&e, QueryError::Sql { message, .. } if message.contains("NUL")),
            "{sql:?}: {e:?}"
        );
    }
}

#[test]
fn more_than_one_statement_in_a_query_is_refused() {
    let fx = fixture();
    let e = unchanged(&fx, |s| {
        s.prepare("INSERT INTO t(name) VALUES ('x'); DELETE FROM t")
            .run()
            .expect_err("multi")
    });
    assert!(matches!(e, QueryError::Sql { .. }), "{e:?}");
}

#[test]
fn wrong_parameter_counts_are_refused_before_running() {
    let fx = fixture();
    let e = unchanged(&fx, |s| {
        s.prepare("INSERT INTO t(name, n) VALUES (?1, ?2)")
            .bind(["only one"])
            .run()
            .expect_err("few")
    });
    assert!(
        matches!(
            e,
            QueryError::ParameterCount {
                expected: 2,
                given: 1
            }
        ),
        "{e:?}"
    );
    let e = unchanged(&fx, |s| {
        s.prepare("SELECT * FROM t WHERE id = ?")
            .bind([1, 2, 3])
            .all()
            .expect_err("many")
    });
    assert!(
        matches!(
            e,
            QueryError::ParameterCount {
                expected: 1,
                given: 3
            }
        ),
        "{e:?}"
    );
}

#[test]
fn wrong_parameter_types_are_refused_by_strict_tables() {
    let fx = fixture();
    let e = unchanged(&fx, |s| {
        s.prepare("INSERT INTO t(name, n) VALUES (?1, ?2)")
            .bind([Value::from("x"), Value::from("not a number")])
            .run()
            .expect_err("type")
    });
    assert!(
        e.to_string()
            .contains("cannot store TEXT value in INTEGER column"),
        "{e}"
    );
    let e = unchanged(&fx, |s| {
        s.prepare("INSERT INTO t(name, n) VALUES (?1, ?2)")
            .bind([Value::Null, Value::from(1)])
            .run()
            .expect_err("null")
    });
    assert!(e.to_string().contains("NOT NULL"), "{e}");
}

#[test]
fn a_batch_that_fails_part_way_changes_nothing_and_names_the_statement() {
    let fx = fixture();
    let e = unchanged(&fx, |s| {
        s.batch([
            s.prepare("INSERT INTO t(name, n) VALUES ('c', 3)"),
            s.prepare("UPDATE t SET n = n + 1"),
            s.prepare("INSERT INTO t(id, name) VALUES (1, 'duplicate key')"),
        ])
        .expect_err("batch fails")
    });
    assert!(matches!(e, QueryError::Batch { index: 2, .. }), "{e:?}");
}

#[test]
fn transaction_control_and_attach_are_refused() {
    let fx = fixture();
    for sql in ["BEGIN", "SAVEPOINT x", "BEGIN IMMEDIATE"] {
        let e = unchanged(&fx, |s| s.prepare(sql).run().expect_err("tx control"));
        assert!(matches!(e, QueryError::NotSupported(_)), "{sql}: {e:?}");
    }
    let e = unchanged(&fx, |s| {
        s.batch([
            s.prepare("INSERT INTO t(name) VALUES ('x')"),
            s.prepare("COMMIT"),
        ])
        .expect_err("commit inside batch")
    });
    assert!(matches!(e, QueryError::Batch { index: 1, .. }), "{e:?}");
    let e = unchanged(&fx, |s| {
        s.prepare("ATTACH '/tmp/walrelay-attached.db' AS other")
            .run()
            .expect_err("attach")
    });
    assert!(
        matches!(e, QueryError::NotAuthorized(Refusal::Attach)),
        "{e:?}"
    );
    let e = unchanged(&fx, |s| {
        s.prepare("VACUUM INTO '/tmp/walrelay-copy.db'")
            .run()
            .expect_err("into")
    });
    assert!(
        matches!(e, QueryError::NotAuthorized(Refusal::Attach)),
        "{e:?}"
    );
    // The connections are still usable afterwards.
    let s = fx.db.session(Constraint::FirstPrimary).expect("session");
    let r = s
        .prepare("SELECT count(*) AS c FROM t")
        .first()
        .expect("count")
        .expect("row");
    assert_eq!(r.get("c"), Some(&Value::Integer(2)));
}

#[test]
fn pragmas_that_would_bypass_capture_are_refused_with_a_clear_error() {
    let fx = fixture();
    for (sql, needle) in [
        (
            "PRAGMA locking_mode=EXCLUSIVE",
            "PRAGMA locking_mode is not allowed to be set",
        ),
        (
            "PRAGMA journal_mode=DELETE",
            "PRAGMA journal_mode is not allowed to be set",
        ),
        (
            "PRAGMA journal_mode=MEMORY",
            "PRAGMA journal_mode is not allowed to be set",
        ),
        (
            "PRAGMA wal_autocheckpoint=100",
            "PRAGMA wal_autocheckpoint is not allowed to be set",
        ),
        (
            "PRAGMA wal_checkpoint(TRUNCATE)",
            "PRAGMA wal_checkpoint is not allowed to be set",
        ),
    ] {
        let e = unchanged(&fx, |s| s.prepare(sql).run().expect_err("refused"));
        assert!(
            matches!(e, QueryError::NotAuthorized(Refusal::Pragma { .. })),
            "{sql}: {e:?}"
        );
        assert!(e.to_string().contains(needle), "{sql}: {e}");
    }
}

#[test]
fn malformed_bookmarks_are_typed_errors() {
    for text in [
        "",
        "garbage",
        "00000001-000000000000000",
        "00000001_0000000000000001",
        "0000000G-0000000000000001",
        "00000001-000000000000000A",
        "ééééééééééééé-ééééééé",
    ] {
        let e = text.parse::<Constraint>().expect_err("malformed");
        assert!(
            matches!(e, SessionError::MalformedBookmark(_)),
            "{text:?}: {e:?}"
        );
    }
    assert!(matches!(
        "x".parse::<Bookmark>(),
        Err(BookmarkParseError::WrongLength { .. })
    ));
    assert_eq!(
        "first-primary".parse::<Constraint>(),
        Ok(Constraint::FirstPrimary)
    );
}

#[test]
fn a_bookmark_beyond_the_latest_issued_is_an_error_not_a_wait() {
    let fx = fixture();
    let latest = fx.db.latest_bookmark();
    let ahead = latest.next().expect("next");
    let e = fx
        .db
        .session(Constraint::Bookmark(ahead))
        .expect_err("future");
    assert_eq!(
        e,
        SessionError::FutureBookmark {
            requested: ahead,
            latest
        }
    );
    let next_epoch = Bookmark::new(Epoch(latest.epoch.0 + 1), Sequence(0));
    assert!(fx.db.session(Constraint::Bookmark(next_epoch)).is_err());
    // The latest and anything before it are fine.
    fx.db
        .session(Constraint::Bookmark(latest))
        .expect("latest is servable");
    fx.db
        .session(Constraint::Bookmark(Bookmark::ZERO))
        .expect("the past is servable");
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_file_that_is_not_a_sqlite_database_is_refused_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, Vec<u8>); 3] = [
        (
            "text.db",
            b"this is not a database, just some text that is long enough ".repeat(40),
        ),
        ("short.db", b"SQLite format 3\0".to_vec()),
        (
            "binary.db",
            (0..10_000u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
    ];
    for (name, bytes) in &cases {
        std::fs::write(dir.path().join(name), bytes).expect("write");
    }
    let before = snapshot(dir.path());
    for (name, _) in &cases {
        let e = Database::open(dir.path().join(name), Options::default()).expect_err("not a db");
        assert!(matches!(e, OpenError::NotADatabase { .. }), "{name}: {e:?}");
        assert!(e.to_string().contains("is not a SQLite database"), "{e}");
    }
    assert_eq!(snapshot(dir.path()), before, "no file changed or appeared");
}

/// Makes a directory refuse new files, even for root (chattr +i), and
/// undoes it on drop.
struct ReadOnlyDir<'a>(&'a Path);

impl<'a> ReadOnlyDir<'a> {
    fn new(dir: &'a Path) -> ReadOnlyDir<'a> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        let g = ReadOnlyDir(dir);
        if g.writable() {
            // Root ignores permission bits; the immutable attribute binds it.
            let ok = std::process::Command::new("chattr")
                .arg("+i")
                .arg(dir)
                .status();
            assert!(
                ok.is_ok_and(|s| s.success()),
                "chattr +i failed: cannot make a read-only dir"
            );
        }
        assert!(!g.writable(), "the directory still accepts new files");
        g
    }
    fn writable(&self) -> bool {
        let probe = self.0.join("probe");
        let ok = std::fs::write(&probe, b"x").is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    }
}

impl Drop for ReadOnlyDir<'_> {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(self.0)
            .status();
        let _ = std::fs::set_permissions(self.0, std::fs::Permissions::from_mode(0o755));
    }
}

#[test]
fn a_read_only_directory_is_a_typed_error_and_nothing_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let existing = dir.path().join("existing.db");
    {
        let db = Database::open(&existing, Options::default()).expect("open");
        let s = db.session(Constraint::FirstPrimary).expect("session");
        s.prepare("CREATE TABLE t(x)").run().expect("create");
        s.prepare("INSERT INTO t VALUES (1)").run().expect("insert");
    }
    let before = snapshot(dir.path());
    {
        let _ro = ReadOnlyDir::new(dir.path());
        let e = Database::open(dir.path().join("new.db"), Options::default()).expect_err("new");
        assert!(
            matches!(e, OpenError::ReadOnly { .. }),
            "new database: {e:?}"
        );
        let e = Database::open(&existing, Options::default()).expect_err("existing");
        assert!(
            matches!(e, OpenError::ReadOnly { .. }),
            "existing database: {e:?}"
        );
        assert!(e.to_string().contains("is not writable"), "{e}");
    }
    assert_eq!(snapshot(dir.path()), before, "no file changed or appeared");
}

#[test]
fn opening_a_database_twice_in_one_process_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.sqlite");
    let db = Database::open(&path, Options::default()).expect("open");
    let before = snapshot(dir.path());
    let e = Database::open(&path, Options::default()).expect_err("second open");
    assert!(matches!(e, OpenError::Attach(_)), "{e:?}");
    assert!(e.to_string().contains("already attached"), "{e}");
    assert_eq!(snapshot(dir.path()), before, "the epoch file did not move");
    drop(db);
    Database::open(&path, Options::default()).expect("reopen after close");
}

#[test]
fn a_transaction_size_limit_below_the_minimum_is_refused_at_open_and_the_minimum_works() {
    use walrelay_engine::{Limits, MIN_TRANSACTION_BYTES};
    let dir = tempfile::tempdir().expect("tempdir");
    let open = |bytes: u64| {
        Database::open(
            dir.path().join("db.sqlite"),
            Options {
                limits: Limits {
                    max_transaction_bytes: bytes,
                    ..Limits::default()
                },
                ..Options::default()
            },
        )
    };
    for bytes in [0, 1, MIN_TRANSACTION_BYTES - 1] {
        match open(bytes) {
            Err(OpenError::Options(m)) => assert!(m.contains("max_transaction_bytes"), "{m}"),
            Err(e) => panic!("{bytes}: {e}"),
            Ok(_) => panic!("{bytes}: opened"),
        }
    }
    assert!(
        !dir.path().join("db.sqlite").exists(),
        "a refused open creates nothing"
    );
    let db = open(MIN_TRANSACTION_BYTES).expect("the minimum opens");
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(x)").run().expect("create");
    s.prepare("INSERT INTO t VALUES ('one row')")
        .run()
        .expect("insert");
}
