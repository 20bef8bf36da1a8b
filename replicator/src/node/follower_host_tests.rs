//! The host's routing and group sync, driven through its handler directly
//! (connection ids no socket has: sends to them go nowhere), so what
//! arrives "in one drain" is exactly what the test says.

use super::*;
use crate::bookmark::Sequence;
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::NodeId;
use crate::record::{Encoded, Record};
use bytes::Bytes;

fn host(dir: &Path, storage: IoBackend) -> FollowerHost {
    host_with(dir, storage, false)
}

fn host_with(dir: &Path, storage: IoBackend, per_database_logs: bool) -> FollowerHost {
    let mut config = FollowerHostConfig::new("127.0.0.1:0".parse().expect("addr"), dir.into());
    config.storage = storage;
    config.backend = Backend::Std;
    config.per_database_logs = per_database_logs;
    FollowerHost::start(config).expect("host")
}

fn claim(id: DatabaseId) -> Message {
    Message::Handshake {
        database: id,
        epoch: Epoch(1),
        role: Role::Leader,
        node: NodeId(1),
        last_durable: Bookmark::ZERO,
        last_chain: ChainHash::GENESIS,
        confirmed: Bookmark::ZERO,
        history: History::new(),
    }
}

fn first_record(fill: u8) -> Encoded {
    Record {
        bookmark: Bookmark::new(Epoch(1), Sequence(1)),
        previous: Bookmark::ZERO,
        prev_chain: ChainHash::GENESIS,
        commit_us: 0,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![fill; 512]))],
    }
    .to_encoded()
    .expect("record")
}

fn group_commit(storage: IoBackend, per_database_logs: bool) {
    const N: u64 = 8;
    let dir = tempfile::tempdir().expect("dir");
    let host = host_with(dir.path(), storage, per_database_logs);
    let h = &host.shared;
    for i in 0..N {
        h.message(1000 + i, claim(DatabaseId(i + 1)));
    }
    assert_eq!(host.databases().len(), N as usize);
    let before = h.stats.sync_rounds.load(Ordering::Relaxed);
    let fsyncs = h.stats.fdatasyncs.load(Ordering::Relaxed);
    let submissions = h.stats.sync_submissions.load(Ordering::Relaxed);
    // One drain: a record for every database, then each connection
    // drained, then the drain is over.
    for i in 0..N {
        h.message(1000 + i, Message::Append(first_record(i as u8)));
        let db = host.database(DatabaseId(i + 1)).expect("held");
        assert_eq!(
            db.durable().expect("durable"),
            Bookmark::ZERO,
            "not before the sync"
        );
    }
    for i in 0..N {
        h.drained(1000 + i);
    }
    h.drains_done();
    assert_eq!(h.stats.sync_rounds.load(Ordering::Relaxed) - before, 1);
    let fdatasyncs = h.stats.fdatasyncs.load(Ordering::Relaxed) - fsyncs;
    let submitted = h.stats.sync_submissions.load(Ordering::Relaxed) - submissions;
    if !per_database_logs {
        assert_eq!(
            fdatasyncs, 1,
            "one fdatasync of the shared log for every database"
        );
        assert_eq!(submitted, 1);
    } else if host.storage_backend() == "io_uring" {
        assert_eq!(fdatasyncs, N);
        assert_eq!(submitted, 1, "every database's fdatasync in one submission");
    } else {
        assert_eq!(fdatasyncs, N);
        assert_eq!(submitted, N, "the std backend loops");
    }
    for i in 0..N {
        let db = host.database(DatabaseId(i + 1)).expect("held");
        assert_eq!(
            db.durable().expect("durable"),
            Bookmark::new(Epoch(1), Sequence(1))
        );
    }
}

#[test]
fn records_of_many_databases_in_one_drain_cost_one_fdatasync_of_the_shared_log() {
    group_commit(IoBackend::Auto, false);
}

#[test]
fn records_of_many_databases_in_one_drain_cost_one_fdatasync_of_the_shared_log_on_std_storage() {
    group_commit(IoBackend::Std, false);
}

#[test]
fn with_per_database_logs_records_of_many_databases_in_one_drain_cost_one_sync_round() {
    group_commit(IoBackend::Auto, true);
}

#[test]
fn with_per_database_logs_one_sync_round_on_std_storage() {
    group_commit(IoBackend::Std, true);
}

#[test]
fn a_replica_or_follower_handshake_for_an_unknown_database_creates_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let host = host(dir.path(), IoBackend::Std);
    let h = &host.shared;
    for (conn, role) in [(1, Role::Replica), (2, Role::Follower)] {
        let mut m = claim(DatabaseId(7));
        if let Message::Handshake { role: r, .. } = &mut m {
            *r = role;
        }
        h.message(conn, m);
        h.message(
            conn,
            Message::CatchUp {
                from: Bookmark::ZERO,
            },
        );
    }
    assert!(host.databases().is_empty());
    assert!(host.database(DatabaseId(7)).is_none());
    let entries = std::fs::read_dir(dir.path().join("db"))
        .expect("db dir")
        .count();
    assert_eq!(entries, 0, "no directory made");
    assert!(matches!(
        h.open(DatabaseId(7)),
        Err(HostError::Unknown { id: DatabaseId(7) })
    ));
}

#[test]
fn known_confirmed_never_opens_a_database_and_is_none_until_the_host_has_opened_it() {
    let dir = tempfile::tempdir().expect("dir");
    let id = DatabaseId(5);
    // A database held from an earlier run: found at start, not opened.
    std::fs::create_dir_all(dir.path().join("db").join(id.to_string())).expect("mkdir");
    let host = host(dir.path(), IoBackend::Std);
    let db = host.database(id).expect("held");
    assert_eq!(db.known_confirmed().expect("known"), None);
    assert_eq!(host.known_confirmed(), vec![(id, None)]);
    assert!(host.open_databases().is_empty(), "asking opened nothing");
    // `confirmed` opens it; once closed, its summary answers.
    assert_eq!(db.confirmed().expect("confirmed"), Bookmark::ZERO);
    assert_eq!(host.open_databases(), vec![id]);
    assert_eq!(host.close_idle(Duration::ZERO), 1);
    assert_eq!(db.known_confirmed().expect("known"), Some(Bookmark::ZERO));
    assert_eq!(host.known_confirmed(), vec![(id, Some(Bookmark::ZERO))]);
    assert!(host.open_databases().is_empty(), "the summary answered");
}

fn record_after(prev: &Encoded, fill: u8) -> Encoded {
    Record {
        bookmark: Bookmark::new(prev.bookmark.epoch, Sequence(prev.bookmark.sequence.0 + 1)),
        previous: prev.bookmark,
        prev_chain: prev.chain,
        commit_us: 0,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![fill; 512]))],
    }
    .to_encoded()
    .expect("record")
}

/// Bytes allocated on disk under `path` (files and directories).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).expect("meta");
    let mut n = meta.blocks() * 512;
    if meta.is_dir() {
        for e in std::fs::read_dir(path).expect("list").flatten() {
            n += allocated(&e.path());
        }
    }
    n
}

/// Descriptors this process holds on files under `dir`.
fn open_files_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("fds")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|p| p.starts_with(dir))
        .count()
}

#[test]
fn a_thousand_archived_and_closed_databases_cost_a_few_kb_of_disk_each_and_no_descriptors() {
    const N: u64 = 1000;
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().canonicalize().expect("canonical");
    let mut config = FollowerHostConfig::new("127.0.0.1:0".parse().expect("addr"), root.clone());
    config.storage = IoBackend::Std;
    config.backend = Backend::Std;
    config.shared_segment_bytes = 256 << 10;
    config.shared_max_segments = 4;
    let host = FollowerHost::start(config).expect("host");
    let h = &host.shared;
    let conn = |i: u64| 10_000 + i;
    let mut lasts = Vec::new();
    for i in 0..N {
        h.message(conn(i), claim(DatabaseId(i + 1)));
        let mut r = first_record(i as u8);
        h.message(conn(i), Message::Append(r.clone()));
        for k in 0..2 {
            r = record_after(&r, k);
            h.message(conn(i), Message::Append(r.clone()));
        }
        lasts.push(r.bookmark);
        h.drained(conn(i));
    }
    h.drains_done();
    for i in 0..N {
        h.message(
            conn(i),
            Message::Confirm {
                confirmed: lasts[i as usize],
                confirmed_us: 0,
            },
        );
        h.closed(conn(i), None);
    }
    let busy = allocated(&root);
    // Archived (say): every database releases everything it confirmed.
    for i in 0..N {
        let db = host.database(DatabaseId(i + 1)).expect("held");
        assert_eq!(db.confirmed().expect("confirmed"), lasts[i as usize]);
        let released = db.release_through(lasts[i as usize]).expect("release");
        assert_eq!(released.start, lasts[i as usize]);
        assert!(
            db.disk_bytes().expect("bytes") < 128,
            "only its base entry is live"
        );
    }
    assert_eq!(host.close_idle(Duration::ZERO), N as usize);
    assert!(host.open_databases().is_empty());
    let log = host.shared_log().expect("a shared log");
    log.maintain().expect("maintain");
    assert!(log.segments() <= 4, "{} shared segments", log.segments());
    let at_rest = allocated(&root);
    let per_db = at_rest / N;
    eprintln!(
        "{N} databases with 3 records each: {busy} bytes on disk before the release, {at_rest} after ({per_db} per database; shared log {} bytes, {} live)",
        log.disk_bytes(),
        log.live_bytes()
    );
    // A directory and a promise file (a block each), and a share of at
    // most four 256 KiB shared segments.
    assert!(per_db <= 12 << 10, "{per_db} bytes per idle database");
    // The shared log's active segment (its page-cache and direct
    // descriptors), nothing per database.
    assert!(
        open_files_under(&root) <= 2,
        "{} descriptors under the host's directory",
        open_files_under(&root)
    );
    // Reopened on demand, each still knows where it stands.
    let db = host.database(DatabaseId(7)).expect("held");
    assert_eq!(db.log_start().expect("start"), lasts[6]);
    assert_eq!(db.durable().expect("durable"), lasts[6]);
}

#[test]
fn a_host_whose_databases_are_in_a_shared_log_refuses_to_start_with_per_database_logs() {
    let dir = tempfile::tempdir().expect("dir");
    let host = host(dir.path(), IoBackend::Std);
    host.shared.message(1, claim(DatabaseId(1)));
    host.shared.message(1, Message::Append(first_record(1)));
    host.shared.drained(1);
    host.shared.drains_done();
    let mut config =
        FollowerHostConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().into());
    config.backend = Backend::Std;
    config.per_database_logs = true;
    let refused = FollowerHost::start(config).expect_err("refused");
    assert!(refused.to_string().contains("shared log"), "{refused}");
}
