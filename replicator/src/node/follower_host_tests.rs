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
