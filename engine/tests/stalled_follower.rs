//! The thrifty fan-out with real follower processes: a commit waits for
//! its W eager followers only, so an eager follower that stops answering
//! (frozen with SIGSTOP: its sockets stay open, nothing is refused) must
//! be swapped for a lazy one, and the quorum go on with the others. Once
//! thawed, it catches up as a lazy follower.

mod common;

use common::{Proc, spawn_followers, wait_until};
use std::time::Duration;
use walrelay_engine::replication::{PrimaryConfig, ReplicatedPrimary};
use walrelay_engine::{Bookmark, Constraint, Session, Value};

const N: usize = 5;
const W: usize = 3;

fn insert(s: &Session, n: i64) -> Bookmark {
    s.prepare("INSERT INTO t(n) VALUES (?1)")
        .bind([Value::Integer(n)])
        .run()
        .expect("insert");
    s.bookmark().expect("a write leaves a bookmark")
}

/// The followers holding `b` the moment it is confirmed: the eager ones
/// (a lazy follower holds it too only if its batch went out meanwhile, so
/// ask until exactly W do).
fn eager_followers(primary: &ReplicatedPrimary, s: &Session, n: &mut i64) -> Vec<usize> {
    for _ in 0..200 {
        *n += 1;
        let b = insert(s, *n);
        let holding: Vec<usize> = (0..N)
            .filter(|&i| primary.leader().follower_durable(i) >= Some(b))
            .collect();
        if holding.len() == W {
            return holding;
        }
    }
    panic!("never exactly {W} followers holding a record as it was confirmed");
}

#[test]
fn a_frozen_eager_follower_is_swapped_for_a_lazy_one_and_catches_up_once_thawed() {
    let root = tempfile::tempdir().expect("tempdir");
    let (key_file, key) = common::cluster_key_file(root.path());
    let (mut followers, addrs): (Vec<Proc>, _) = spawn_followers(root.path(), N, &key_file);
    let mut config = PrimaryConfig::new(root.path().join("primary.db"), addrs, Some(key));
    config.write_quorum = W;
    config.confirm_timeout_ms = 30_000;
    let primary = ReplicatedPrimary::start(config).expect("primary");
    wait_until("every follower streaming", Duration::from_secs(30), || {
        primary.status().streaming_followers == N
    });
    let s = primary
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER)")
        .run()
        .expect("create");
    let mut n = 0;
    let eager = eager_followers(&primary, &s, &mut n);
    let frozen = eager[0];
    let swaps_before = primary.status().eager_swaps;

    followers[frozen].freeze();
    let mut last = Bookmark::ZERO;
    for _ in 0..100 {
        n += 1;
        last = insert(&s, n);
    }
    assert!(
        primary.status().eager_swaps > swaps_before,
        "follower {frozen} froze while eager, yet no lazy follower took its place"
    );
    let now_eager = eager_followers(&primary, &s, &mut n);
    assert!(
        !now_eager.contains(&frozen),
        "the frozen follower {frozen} is still eager: {now_eager:?}"
    );
    assert!(
        primary.leader().follower_durable(frozen) < Some(last),
        "a frozen follower acknowledged what it was sent while frozen"
    );

    followers[frozen].thaw();
    n += 1;
    let after = insert(&s, n);
    wait_until(
        "the thawed follower to hold every record",
        Duration::from_secs(30),
        || primary.leader().follower_durable(frozen) >= Some(after),
    );
    let rows: i64 = s
        .prepare("SELECT count(*) AS c FROM t")
        .first()
        .expect("count")
        .and_then(|r| r.get("c").and_then(|v| v.as_i64()))
        .expect("a count");
    assert_eq!(rows, n);
    primary.stop(Duration::from_secs(10)).expect("stop");
}
