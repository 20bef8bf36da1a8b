//! End to end with real processes over HTTP, replaying the example of
//! Cloudflare's D1 read-replication post: a user places an order through
//! the replica nearest to them (the write is forwarded to the primary),
//! then a later request — a new session continuing from the first one's
//! bookmark — reads the orders through a replica in another region and
//! must see the order.
//!
//! The cluster is five `walrelay follower` processes, a `walrelay primary`
//! and two `walrelay replica` processes (region-a, region-b), each serving
//! HTTP; everything the test does goes through HTTP, built by hand so the
//! wire format is what is tested. Replication is authenticated with one
//! cluster key.

mod common;

use common::{Proc, free_port, join_addrs, wait_accepting};

use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use walrelay_engine::http::auth::{Permission, Scope};
use walrelay_engine::http::token_store;

const FOLLOWERS: usize = 5;

/// Orders placed and read back: bounded by default, more with
/// WALRELAY_SOAK=1.
fn iterations() -> usize {
    let soak = std::env::var("WALRELAY_SOAK").is_ok_and(|v| !v.is_empty() && v != "0");
    if soak { 10_000 } else { 1_000 }
}

/// The processes and their HTTP URLs.
struct Cluster {
    // Field order is drop order: the processes die before their
    // directories are removed.
    followers: Vec<Proc>,
    primary: Proc,
    replica_a: Proc,
    replica_b: Proc,
    primary_url: String,
    replica_a_url: String,
    replica_b_url: String,
    /// `Authorization` for every request.
    bearer: String,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let path = |p: &str| root.join(p).display().to_string();
        // Authentication on, as in production: every node checks the same
        // store; the test holds an all-databases read-write token.
        let tokens = root.join("tokens");
        let admin = token_store::create(&tokens, Scope::All, Permission::ReadWrite)
            .expect("mint the test's token");
        let (key_file, _) = common::cluster_key_file(root);
        let (followers, follower_addrs) = common::spawn_followers(root, FOLLOWERS, &key_file);
        let key_file = key_file.display().to_string();

        let (primary_listen, primary_http) = (free_port(), free_port());
        let primary_url = format!("http://{primary_http}");
        let mut primary = Proc::spawn(
            "primary",
            &[
                "primary".into(),
                "--dir".into(),
                path("primary"),
                "--followers".into(),
                join_addrs(&follower_addrs),
                "--listen".into(),
                primary_listen.to_string(),
                "--http".into(),
                primary_http.to_string(),
                "--region".into(),
                "primary-region".into(),
                "--tokens".into(),
                tokens.display().to_string(),
                "--cluster-key".into(),
                key_file.clone(),
            ],
        );
        // Printed once the HTTP server is bound and the replication
        // listener is up.
        primary.wait_line("primary epoch");
        wait_accepting(primary_http, "the primary's HTTP");

        let replica = |name: &str, region: &str| {
            let http = free_port();
            let mut p = Proc::spawn(
                name,
                &[
                    "replica".into(),
                    "--dir".into(),
                    path(name),
                    "--leader".into(),
                    primary_listen.to_string(),
                    "--followers".into(),
                    join_addrs(&follower_addrs),
                    "--http".into(),
                    http.to_string(),
                    "--primary-http".into(),
                    primary_url.clone(),
                    "--region".into(),
                    region.into(),
                    "--tokens".into(),
                    tokens.display().to_string(),
                    "--cluster-key".into(),
                    key_file.clone(),
                ],
            );
            p.wait_line("replica HTTP at");
            p.wait_line("following");
            wait_accepting(http, name);
            (p, format!("http://{http}"))
        };
        let (replica_a, replica_a_url) = replica("replica-a", "region-a");
        let (replica_b, replica_b_url) = replica("replica-b", "region-b");
        Cluster {
            followers,
            primary,
            replica_a,
            replica_b,
            primary_url,
            replica_a_url,
            replica_b_url,
            bearer: admin.bearer(),
            _dir: dir,
        }
    }

    fn assert_all_running(&mut self) {
        for p in self.followers.iter_mut().chain([
            &mut self.primary,
            &mut self.replica_a,
            &mut self.replica_b,
        ]) {
            p.assert_running();
        }
    }
}

/// An HTTP client that keeps connections alive, as a Worker's would be.
struct Http {
    agent: ureq::Agent,
    bearer: String,
}

/// One answer, as seen on the wire.
#[derive(Debug)]
struct Reply {
    status: u16,
    bookmark: Option<String>,
    json: Json,
}

impl Reply {
    /// The one statement's result of a successful answer.
    fn result(&self, what: &str) -> &Json {
        assert_eq!(self.status, 200, "{what}: {}", self.json);
        assert_eq!(self.json["success"], true, "{what}: {}", self.json);
        &self.json["result"][0]
    }
}

impl Http {
    fn new(bearer: &str) -> Http {
        Http {
            bearer: bearer.to_string(),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(20)))
                .http_status_as_error(false)
                .build()
                .new_agent(),
        }
    }

    fn query(&self, base: &str, bookmark: &str, body: &Json) -> Reply {
        let mut resp = self
            .agent
            .post(format!("{base}/v1/databases/main/query"))
            .header("content-type", "application/json")
            .header("x-d1-bookmark", bookmark)
            .header("authorization", &self.bearer)
            .send(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("POST {base}: {e}"));
        let bookmark = resp
            .headers()
            .get("x-d1-bookmark")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.body_mut().read_to_string().expect("body");
        Reply {
            status: resp.status().as_u16(),
            bookmark,
            json: serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}")),
        }
    }

    fn metrics(&self, base: &str) -> Metrics {
        let mut resp = self
            .agent
            .get(format!("{base}/metrics"))
            .header("authorization", &self.bearer)
            .call()
            .unwrap_or_else(|e| panic!("GET {base}/metrics: {e}"));
        assert_eq!(resp.status().as_u16(), 200);
        Metrics(resp.body_mut().read_to_string().expect("metrics text"))
    }
}

/// A `/metrics` scrape.
struct Metrics(String);

impl Metrics {
    /// Sums the samples of `name` whose labels include all of `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (n, rest) = series.split_once('{')?;
                if n != name {
                    return None;
                }
                let have: BTreeMap<&str, &str> = rest
                    .trim_end_matches('}')
                    .split(',')
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k, v.trim_matches('"')))
                    })
                    .collect();
                labels
                    .iter()
                    .all(|(k, v)| have.get(k) == Some(v))
                    .then(|| value.parse::<u64>().expect("a counter"))
            })
            .sum()
    }
}

/// Reads through `url` with `bookmark` until the replica itself serves
/// it: the replica is streaming and has applied at least `bookmark`.
fn wait_replica_serving(http: &Http, url: &str, region: &str, bookmark: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = http.query(
            url,
            bookmark,
            &json!({"sql": "SELECT count(*) AS n FROM orders"}),
        );
        let meta = &r.result(&format!("readiness read on {region}"))["meta"];
        if meta["served_by_primary"] == false {
            assert_eq!(meta["served_by_region"], region);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the {region} replica never served a read itself"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_order_written_through_one_regions_replica_is_read_back_through_another_with_its_bookmark() {
    let started = Instant::now();
    let mut cluster = Cluster::start();
    let startup = started.elapsed();
    let http = Http::new(&cluster.bearer);
    let (replica_a, replica_b) = (cluster.replica_a_url.clone(), cluster.replica_b_url.clone());

    let created = http.query(
        &cluster.primary_url,
        "first-primary",
        &json!({"sql": "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer TEXT NOT NULL, \
                        amount_cents INTEGER NOT NULL)"}),
    );
    created.result("create orders");
    let schema = created.bookmark.clone().expect("a bookmark");
    // Until both replicas stream, a read could fall back for reasons that
    // have nothing to do with the loop below.
    wait_replica_serving(&http, &replica_a, "region-a", &schema);
    wait_replica_serving(&http, &replica_b, "region-b", &schema);

    let a_before = http.metrics(&replica_a);
    let b_before = http.metrics(&replica_b);
    let n = iterations();
    let (mut misses, mut fallbacks) = (Vec::new(), 0usize);
    let (mut write_time, mut read_time) = (Duration::ZERO, Duration::ZERO);
    let looped = Instant::now();
    for i in 0..n {
        let customer = format!("customer-{i}");
        let amount = (i * 37 % 10_000) as i64;
        // A Worker handling "place an order" in region A: a new session,
        // unconstrained; replica A sees a write and forwards it.
        let t = Instant::now();
        let w = http.query(
            &replica_a,
            "first-unconstrained",
            &json!({
                "sql": "INSERT INTO orders(customer, amount_cents) VALUES (?1, ?2)",
                "params": [customer, amount],
            }),
        );
        write_time += t.elapsed();
        let result = w.result(&format!("order {i}"));
        let meta = &result["meta"];
        assert_eq!(
            meta["served_by_primary"], true,
            "order {i}: the write ran on the primary"
        );
        assert_eq!(meta["served_by_region"], "primary-region");
        assert_eq!(meta["changes"], 1, "order {i}");
        let id = meta["last_row_id"].as_i64().expect("last_row_id");
        let bookmark = w.bookmark.clone().expect("the write's bookmark header");
        assert_eq!(meta["bookmark"], bookmark.as_str(), "header and meta agree");

        // The next request, in region B, continues from that bookmark.
        let t = Instant::now();
        let r = http.query(
            &replica_b,
            &bookmark,
            &json!({
                "sql": "SELECT (SELECT count(*) FROM orders) AS total, customer, amount_cents \
                        FROM orders WHERE id = ?1",
                "params": [id],
            }),
        );
        read_time += t.elapsed();
        let result = r.result(&format!("read of order {i}"));
        let rows = result["results"].as_array().expect("rows");
        // Sequential consistency: the order, and every order before it.
        let seen = rows.len() == 1
            && rows[0]["customer"] == customer.as_str()
            && rows[0]["amount_cents"] == amount
            && rows[0]["total"] == i + 1;
        if !seen {
            misses.push(format!(
                "order {i} (id {id}, written at {bookmark}): {}",
                r.json
            ));
        }
        let read_bookmark = r.bookmark.clone().expect("the read's bookmark header");
        // Fixed-width bookmarks sort as strings.
        assert!(
            read_bookmark >= bookmark,
            "order {i}: the session went back from {bookmark} to {read_bookmark}"
        );
        let meta = &result["meta"];
        if meta["served_by_primary"] == true {
            // Replica B could not catch up in time; the primary answered
            // and meta says so.
            assert_eq!(meta["served_by_region"], "primary-region");
            fallbacks += 1;
        } else {
            assert_eq!(meta["served_by_region"], "region-b", "order {i}");
        }
    }
    let looped = looped.elapsed();
    cluster.assert_all_running();

    assert!(
        misses.is_empty(),
        "{} of {n} orders were not read back; the first:\n{}",
        misses.len(),
        misses[..misses.len().min(3)].join("\n")
    );
    let by_replica = n - fallbacks;
    eprintln!(
        "http_e2e: {n} orders in {looped:.2?} (cluster start {startup:.2?}); \
         writes via region-a avg {:.2?}, reads via region-b avg {:.2?}; \
         {by_replica} reads served by region-b, {fallbacks} fell back to the primary",
        write_time / n as u32,
        read_time / n as u32,
    );
    // The point is replica reads: a test passing on fallbacks alone would
    // prove nothing about replication. A few are tolerated (a 2-core
    // machine under load can stall the replica past its 1 s wait).
    assert!(
        fallbacks * 100 <= n,
        "{fallbacks} of {n} reads fell back to the primary (more than 1%)"
    );

    // The nodes' own counts agree with what the test saw.
    let a_after = http.metrics(&replica_a);
    let b_after = http.metrics(&replica_b);
    let delta = |before: &Metrics, after: &Metrics, name: &str, labels: &[(&str, &str)]| {
        after.get(name, labels) - before.get(name, labels)
    };
    assert_eq!(
        delta(
            &a_before,
            &a_after,
            "walrelay_forwarded_total",
            &[("reason", "write")]
        ),
        n as u64,
        "replica A forwarded every write\n{}",
        a_after.0
    );
    assert_eq!(
        delta(
            &a_before,
            &a_after,
            "walrelay_queries_total",
            &[
                ("served_by", "primary"),
                ("served_by_region", "primary-region")
            ]
        ),
        n as u64,
        "replica A relayed every write's answer as the primary's\n{}",
        a_after.0
    );
    assert_eq!(
        delta(
            &b_before,
            &b_after,
            "walrelay_queries_total",
            &[("served_by", "replica"), ("served_by_region", "region-b")]
        ),
        by_replica as u64,
        "replica B counted the reads it served\n{}",
        b_after.0
    );
    assert_eq!(
        delta(&b_before, &b_after, "walrelay_forwarded_total", &[]),
        fallbacks as u64,
        "replica B forwarded only the reads that fell back\n{}",
        b_after.0
    );
    assert_eq!(
        delta(&b_before, &b_after, "walrelay_refused_total", &[]),
        0,
        "nothing was refused\n{}",
        b_after.0
    );
}
