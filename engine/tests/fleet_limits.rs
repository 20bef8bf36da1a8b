//! The account limits act, late by design, and how late is measured:
//! storage (queue, consumers, fold, cached heartbeat, frozen growth) and
//! daily rows (usage events, the limiter, the nodes' keys).

mod common;

use common::fleet::{HttpFleet, Tuning};
use std::time::{Duration, Instant};
use walrelay_engine::fleet::catalog::{AccountLimits, Catalog, Plan};
use walrelay_engine::fleet::names::AccountId;

fn fleet() -> HttpFleet {
    HttpFleet::start(Tuning {
        max_open: 16,
        idle_close_ms: 60_000,
        heartbeat_ms: 100,
        limits: true,
    })
}

fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !f() {
        assert!(
            started.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

#[test]
fn an_account_over_its_storage_limit_may_shrink_but_not_grow_its_databases() {
    let fx = fleet();
    let account = AccountId::default_account();
    fx.node
        .catalog
        .set_account(&AccountLimits {
            max_storage_bytes: 200_000,
            ..AccountLimits::free(account.clone())
        })
        .unwrap();
    assert_eq!(
        fx.admin(
            "POST",
            "/v1/databases",
            Some(serde_json::json!({"name": "big"}))
        )
        .status,
        200
    );
    assert_eq!(fx.query("big", "CREATE TABLE t(x BLOB)").status, 200);
    // Past the limit: 300 KB of rows.
    for _ in 0..3 {
        let r = fx.query(
            "big",
            "INSERT INTO t SELECT randomblob(1000) FROM generate_series(1, 100)",
        );
        if r.status != 200 {
            // generate_series is not built in: a recursive CTE instead.
            let r = fx.query(
                "big",
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) \
                 INSERT INTO t SELECT randomblob(1000) FROM n",
            );
            assert_eq!(r.status, 200, "{}", r.json);
        }
    }
    let crossed = Instant::now();
    // Every later write that grows the database is refused, once the
    // pipeline has carried the size to a heartbeat.
    let mut refused = None;
    let late = wait_until("the storage limit", Duration::from_secs(20), || {
        let r = fx.query("big", "INSERT INTO t VALUES (randomblob(20000))");
        if r.status == 429 {
            refused = Some(r);
            true
        } else {
            false
        }
    });
    let r = refused.unwrap();
    assert_eq!(r.json["errors"][0]["code"], 7429, "{}", r.json);
    println!(
        "storage limit acted {:.2} s after the account went over (tick 20 ms, fold 50 ms, bucket 100 ms, heartbeat 100 ms)",
        late.as_secs_f64()
    );
    assert!(crossed.elapsed() >= late);
    // Freeing space is allowed, and so is reusing it.
    assert_eq!(
        fx.query("big", "DELETE FROM t WHERE rowid % 2 = 0").status,
        200
    );
    assert_eq!(
        fx.query("big", "INSERT INTO t VALUES (randomblob(500))")
            .status,
        200
    );
    // Reads always work.
    assert_eq!(fx.query("big", "SELECT count(*) AS n FROM t").status, 200);
    // Raising the limit lets it grow again within a bucket and a heartbeat.
    fx.node
        .catalog
        .set_account(&AccountLimits {
            max_storage_bytes: 100_000_000,
            ..AccountLimits::free(account.clone())
        })
        .unwrap();
    wait_until("the raised limit", Duration::from_secs(20), || {
        fx.query("big", "INSERT INTO t VALUES (randomblob(20000))")
            .status
            == 200
    });
    assert_eq!(fx.node.reads.on_query_path(), 0);
}

#[test]
fn a_free_account_over_its_daily_rows_is_refused_until_the_end_of_the_day_and_a_paid_one_is_not() {
    let fx = fleet();
    for (account, plan) in [("free-acct", Plan::Free), ("paid-acct", Plan::Paid)] {
        fx.node
            .catalog
            .set_account(&AccountLimits {
                plan,
                max_rows_read_per_day: 50,
                ..AccountLimits::free(AccountId::new(account).unwrap())
            })
            .unwrap();
        let path = format!("/client/v4/accounts/{account}/d1/database");
        let r = fx.admin("POST", &path, Some(serde_json::json!({"name": "rows"})));
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let uuid_of = |account: &str| {
        let r = fx.admin(
            "GET",
            &format!("/client/v4/accounts/{account}/d1/database"),
            None,
        );
        r.json["result"][0]["uuid"].as_str().unwrap().to_string()
    };
    let (free, paid) = (uuid_of("free-acct"), uuid_of("paid-acct"));
    for db in [&free, &paid] {
        assert_eq!(fx.query(db, "CREATE TABLE t(x)").status, 200);
        let r = fx.query(
            db,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40) \
             INSERT INTO t SELECT i FROM n",
        );
        assert_eq!(r.status, 200, "{}", r.json);
    }
    // 40 rows per scan: the free account passes 50 rows read on its second.
    let mut over_at = None;
    let mut refused = None;
    wait_until("the rows limit", Duration::from_secs(20), || {
        let r = fx.query(&free, "SELECT count(*) AS n FROM t WHERE x > 0");
        if r.status == 429 {
            refused = Some(r);
            return true;
        }
        assert_eq!(r.status, 200, "{}", r.json);
        let read = r.json["result"][0]["meta"]["rows_read"].as_u64().unwrap();
        if over_at.is_none() && read > 0 {
            over_at = Some(Instant::now());
        }
        false
    });
    let late = over_at.map_or(Duration::ZERO, |t| t.elapsed());
    let r = refused.unwrap();
    assert_eq!(r.json["errors"][0]["code"], 7429, "{}", r.json);
    println!(
        "rows limit acted within {:.2} s of the first over-limit query (tick 20 ms, limiter 100 ms)",
        late.as_secs_f64()
    );
    // The paid account is not limited.
    for _ in 0..5 {
        assert_eq!(
            fx.query(&paid, "SELECT count(*) FROM t WHERE x > 0").status,
            200
        );
    }
    assert_eq!(fx.node.reads.on_query_path(), 0);
}

/// What every size queue does: oldest first, bounded batches, nothing
/// handed out twice once acknowledged.
fn queue_contract(q: &dyn walrelay_engine::fleet::size_queue::SizeQueue) {
    use walrelay_engine::fleet::limits::SizeReport;
    let r = |i: u64| SizeReport {
        uuid: format!("00000000-0000-4000-8000-{i:012}"),
        account: "acct".into(),
        size_bytes: i * 4096,
    };
    assert!(q.is_empty().unwrap());
    assert_eq!(q.push(&(1..=5).map(r).collect::<Vec<_>>()).unwrap(), 5);
    assert_eq!(q.len().unwrap(), 5);
    let first = q.take(2).unwrap();
    assert_eq!(first.reports, vec![r(1), r(2)], "oldest first");
    q.ack(&first).unwrap();
    let rest = q.take(10).unwrap();
    assert_eq!(rest.reports, vec![r(3), r(4), r(5)]);
    q.ack(&rest).unwrap();
    assert!(q.take(10).unwrap().reports.is_empty(), "nothing twice");
    assert!(q.is_empty().unwrap());
}

#[test]
fn the_local_size_queue_keeps_the_queue_contract() {
    let dir = tempfile::tempdir().unwrap();
    let q =
        walrelay_engine::fleet::size_queue::LocalSizeQueue::open(&dir.path().join("q.db")).unwrap();
    queue_contract(&q);
}

#[test]
fn a_redis_broker_size_queue_keeps_the_contract_and_redelivers_what_a_crash_left_unacknowledged() {
    use walrelay_engine::fleet::size_queue::{RedisSizeQueue, SizeQueue};
    let Some(redis) = common::redis::RedisServer::start() else {
        return;
    };
    let q = RedisSizeQueue::open(&redis.url, "test:sizes").unwrap();
    queue_contract(&q);
    // Taken, then the control plane dies before the catalog has them: the
    // next one (same stream, same group) takes them again.
    let report = walrelay_engine::fleet::limits::SizeReport {
        uuid: "00000000-0000-4000-8000-000000000009".into(),
        account: "acct".into(),
        size_bytes: 9,
    };
    q.push(std::slice::from_ref(&report)).unwrap();
    assert_eq!(q.take(10).unwrap().reports, vec![report.clone()]);
    drop(q);
    let again = RedisSizeQueue::open(&redis.url, "test:sizes").unwrap();
    let taken = again.take(10).unwrap();
    assert_eq!(taken.reports, vec![report], "redelivered after the crash");
    again.ack(&taken).unwrap();
    assert!(again.take(10).unwrap().reports.is_empty());
    // A foreign entry that does not parse is dropped, not wedged on.
    let mut c = redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("test:sizes")
        .arg("*")
        .arg("garbage")
        .arg("1")
        .query(&mut c)
        .unwrap();
    assert!(again.take(10).unwrap().reports.is_empty());
    assert!(again.is_empty().unwrap());
    // The broker gone: a typed error, not a hang.
    drop(redis);
    assert!(again.push(&[]).is_ok(), "nothing to send");
    assert!(again.len().is_err());
}

#[test]
fn a_size_queue_spec_other_than_local_or_redis_is_a_typed_error_and_opens_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    for spec in ["kafka://x", "", "redis", "file:///tmp/q"] {
        let opened = walrelay_engine::fleet::size_queue::open(spec, &path);
        assert!(
            matches!(
                opened,
                Err(walrelay_engine::fleet::limits::LimitsError::QueueSpec(_))
            ),
            "{spec:?}"
        );
    }
    assert!(!path.exists(), "nothing was created");
}
