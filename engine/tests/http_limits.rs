//! Runtime limits over HTTP: each limit's refusal in D1's error shape with
//! its status and code, a client that hangs up cancels its query, a
//! stopping server cancels what runs and stops within its grace period
//! (answering what still runs then with its outcome unknown),
//! and the server's own bounds: connections open at once, and how long a
//! connection may wait without a request.

mod common;

use common::gate::Gate;
use common::raw_http::{closed_within, read_answer, send_query};
use common::{RUNAWAY, metric};
use serde_json::Value as Json;
use std::io::Write;
use std::net::SocketAddr;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_engine::http::server::{HttpConfig, HttpServer, Node, Role, serve};
use walrelay_engine::{CommitGate, Database, Limits, Options, TransactionSink};

/// The codes of `http::server::codes`, spelled out so a renumbering shows.
const TIMEOUT: u64 = 7408;
const RESPONSE_TOO_LARGE: u64 = 7414;
const UNAVAILABLE: u64 = 7503;

struct Fixture {
    server: Option<HttpServer>,
    db: Database,
    _dir: tempfile::TempDir,
}

fn fixture(readers: usize, f: impl FnOnce(&mut Limits)) -> Fixture {
    fixture_with(readers, f, HttpConfig::default())
}

fn fixture_with(readers: usize, f: impl FnOnce(&mut Limits), http: HttpConfig) -> Fixture {
    let mut limits = Limits::default();
    f(&mut limits);
    fixture_on(
        Options {
            readers,
            limits,
            ..Options::default()
        },
        http,
    )
}

fn fixture_on(options: Options, http: HttpConfig) -> Fixture {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::open(dir.path().join("h.db"), options).expect("open");
    let node = Node::new(
        Role::Primary(db.clone()),
        http,
        walrelay_engine::http::auth::Auth::Insecure,
    );
    let server = serve(Arc::new(node), SocketAddr::from(([127, 0, 0, 1], 0))).expect("serve");
    Fixture {
        server: Some(server),
        db,
        _dir: dir,
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    retry_after: Option<String>,
    json: Json,
}

impl Fixture {
    fn url(&self) -> String {
        self.server.as_ref().expect("serving").url()
    }
    fn addr(&self) -> SocketAddr {
        self.server.as_ref().expect("serving").addr()
    }

    fn query(&self, sql: &str) -> Reply {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let mut resp = agent
            .post(format!("{}/v1/databases/main/query", self.url()))
            .header("content-type", "application/json")
            .send(serde_json::json!({ "sql": sql }).to_string())
            .expect("an answer");
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.body_mut().read_to_string().expect("body");
        Reply {
            status: resp.status().as_u16(),
            retry_after,
            json: serde_json::from_str(&text).expect("json"),
        }
    }

    fn wait_until(&self, what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn error_code(r: &Reply) -> u64 {
    assert_eq!(r.json["success"], false, "{r:?}");
    r.json["errors"][0]["code"].as_u64().expect("a code")
}

#[test]
fn a_runaway_query_is_answered_400_with_the_timeout_code() {
    let f = fixture(4, |l| l.query_timeout_ms = 300);
    let r = f.query(RUNAWAY);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(error_code(&r), TIMEOUT);
    assert_eq!(
        metric(&f.url(), "walrelay_queries_timed_out_total"),
        Some(1)
    );
    assert_eq!(f.query("SELECT 1").status, 200);
}

#[test]
fn a_client_that_hangs_up_mid_query_cancels_it() {
    let f = fixture(4, |_| {});
    let socket = send_query(f.addr(), RUNAWAY, None);
    f.wait_until("the query runs", || f.db.readers_in_use().0 == 1);
    drop(socket);
    f.wait_until("the query is cancelled", || {
        metric(&f.url(), "walrelay_queries_cancelled_total") == Some(1)
    });
    f.wait_until("the reader is free", || f.db.readers_in_use().0 == 0);
}

#[test]
fn with_every_reader_busy_a_read_is_answered_503_with_retry_after() {
    let f = fixture(1, |l| l.pool_wait_ms = 200);
    let socket = send_query(f.addr(), RUNAWAY, None);
    f.wait_until("the only reader is busy", || {
        f.db.readers_in_use() == (1, 1)
    });
    let r = f.query("SELECT 1");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(error_code(&r), UNAVAILABLE);
    // A write needs no reader.
    assert_eq!(f.query("CREATE TABLE t(x)").status, 200);
    drop(socket);
    f.wait_until("the reader is free", || f.db.readers_in_use().0 == 0);
    assert_eq!(f.query("SELECT 1").status, 200);
}

#[test]
fn a_result_past_the_response_cap_is_answered_400_with_its_code() {
    let f = fixture(4, |l| l.max_response_bytes = 1_000);
    let r = f.query("SELECT zeroblob(2000)");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(error_code(&r), RESPONSE_TOO_LARGE);
    assert_eq!(f.query("SELECT zeroblob(500)").status, 200);
}

#[test]
fn a_stopping_server_cancels_its_running_queries_and_stops_within_its_grace_period() {
    let mut f = fixture(8, |_| {});
    let sockets: Vec<_> = (0..4)
        .map(|_| send_query(f.addr(), RUNAWAY, None))
        .collect();
    f.wait_until("four queries run", || f.db.readers_in_use().0 == 4);
    let started = Instant::now();
    drop(f.server.take());
    let took = started.elapsed();
    // Generous: proves it does not hang (the grace period is 2 s).
    assert!(took < Duration::from_secs(10), "stopping took {took:?}");
    f.wait_until("every query ended", || f.db.readers_in_use().0 == 0);
    drop(sockets);
    println!("stopped in {took:?}");
}

#[test]
fn a_write_still_waiting_for_its_quorum_as_the_server_stops_is_answered_503_with_its_outcome_unknown()
 {
    // A gate that confirms only what this test releases: the quorum that
    // never answers.
    let gate = Arc::new(Gate::default());
    let mut f = fixture_on(
        Options {
            sink: Some(Arc::clone(&gate) as Arc<dyn TransactionSink>),
            gate: Some(Arc::clone(&gate) as Arc<dyn CommitGate>),
            ..Options::default()
        },
        HttpConfig::default(),
    );
    let mut create = send_query(f.addr(), "CREATE TABLE t(x)", None);
    f.wait_until("the table committed", || gate.committed().len() == 1);
    gate.release(gate.committed()[0]);
    assert_eq!(read_answer(&mut create).status, 200);

    let mut write = send_query(f.addr(), "INSERT INTO t VALUES (7)", None);
    f.wait_until("the write committed", || gate.committed().len() == 2);
    let started = Instant::now();
    drop(f.server.take());
    let took = started.elapsed();
    write
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let r = read_answer(&mut write);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.json()["errors"][0]["code"], UNAVAILABLE, "{r:?}");
    let message = r.json()["errors"][0]["message"].to_string();
    assert!(message.contains("outcome is unknown"), "{message}");
    assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{r:?}");
    // Answered within the grace period, not after it.
    assert!(
        took < Duration::from_millis(walrelay_engine::http::server::SHUTDOWN_GRACE_MS + 1_000),
        "stopping took {took:?}"
    );
    // The write did commit here; its quorum decides the rest.
    gate.release(gate.committed()[1]);
    let rows =
        f.db.session(walrelay_engine::Constraint::FirstPrimary)
            .expect("session")
            .prepare("SELECT count(*) FROM t")
            .raw()
            .expect("count");
    assert_eq!(rows.rows, vec![vec![walrelay_engine::Value::Integer(1)]]);
}

#[test]
fn connections_past_the_limit_are_answered_503_and_closed_and_a_freed_slot_serves_again() {
    let f = fixture_with(
        4,
        |_| {},
        HttpConfig {
            max_connections: 3,
            ..HttpConfig::default()
        },
    );
    // Three connections that say nothing hold every slot.
    let mut idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(f.addr()).expect("connect"))
        .collect();
    for attempt in 0..2 {
        let mut extra = TcpStream::connect(f.addr()).expect("connect");
        extra
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let r = read_answer(&mut extra);
        assert_eq!(r.status, 503, "attempt {attempt}: {r:?}");
        assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{r:?}");
        assert_eq!(r.header("connection").as_deref(), Some("close"), "{r:?}");
        assert_eq!(r.json()["errors"][0]["code"], UNAVAILABLE, "{r:?}");
        assert!(closed_within(&mut extra, Duration::from_secs(30)));
    }
    // One hangs up: its slot serves the next client.
    drop(idle.pop());
    f.wait_until("a freed slot serves a query", || {
        let mut s = send_query(f.addr(), "SELECT 1", None);
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        read_answer(&mut s).status == 200
    });
    drop(idle);
    // Once the others have closed too (the server notices at its pace).
    f.wait_until("refusals past the connection limit are counted", || {
        ureq::get(format!("{}/metrics", f.url()))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .is_some_and(|text| {
                text.lines().any(|l| {
                    l.starts_with("walrelay_refused_total{") && l.contains("status=\"503\"")
                })
            })
    });
}

#[test]
fn a_connection_waiting_for_a_request_or_its_body_is_closed_after_the_idle_timeout_but_a_long_query_is_answered()
 {
    let f = fixture_with(
        4,
        |l| l.query_timeout_ms = 1_500,
        HttpConfig {
            idle_timeout_ms: 300,
            ..HttpConfig::default()
        },
    );
    let generous = Duration::from_secs(20);
    // Connected, never a byte.
    let mut silent = TcpStream::connect(f.addr()).expect("connect");
    assert!(closed_within(&mut silent, generous), "a silent connection");
    // A head sent a byte every 100 ms never completes in time.
    let mut slow = TcpStream::connect(f.addr()).expect("connect");
    let head = b"POST /v1/databases/main/query HTTP/1.1\r\nhost: x\r\nx-padding: ";
    let started = Instant::now();
    let mut cut = false;
    for b in head.iter().chain(std::iter::repeat(&b'a')) {
        if slow.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        assert!(started.elapsed() < generous, "a slow head was never cut");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cut);
    // A body that stops arriving is refused, and its connection closed.
    let mut stalled = TcpStream::connect(f.addr()).expect("connect");
    stalled
        .write_all(
            b"POST /v1/databases/main/query HTTP/1.1\r\nhost: x\r\n\
              content-length: 100\r\n\r\n{\"sql\"",
        )
        .expect("send");
    stalled.set_read_timeout(Some(generous)).expect("timeout");
    let r = read_answer(&mut stalled);
    assert_eq!(r.status, 408, "{r:?}");
    assert_eq!(r.json()["errors"][0]["code"], TIMEOUT, "{r:?}");
    assert_eq!(r.header("connection").as_deref(), Some("close"), "{r:?}");
    assert!(closed_within(&mut stalled, generous));
    // A query that runs five times the idle timeout is answered on its
    // connection, which is then closed once it has idled that long.
    let mut busy = send_query(f.addr(), RUNAWAY, None);
    busy.set_read_timeout(Some(generous)).expect("timeout");
    let r = read_answer(&mut busy);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.json()["errors"][0]["code"], TIMEOUT, "{r:?}");
    assert!(closed_within(&mut busy, generous), "idle after its answer");
}

#[test]
fn a_client_that_takes_none_of_its_answer_is_disconnected_after_the_idle_timeout_freeing_its_slot()
{
    use std::io::Read;
    let f = fixture_with(
        4,
        |_| {},
        HttpConfig {
            idle_timeout_ms: 300,
            max_connections: 1,
            ..HttpConfig::default()
        },
    );
    // A 24 MB answer (12,000 rows of 2 KB), far more than the sockets'
    // buffers hold, never read.
    let mut greedy = send_query(
        f.addr(),
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 12000) \
         SELECT x, hex(zeroblob(1000)) AS h FROM c",
        None,
    );
    // Once the answer has started to arrive (building 24 MB of JSON can
    // take seconds on a loaded machine), take nothing for many idle
    // timeouts. A peek leaves the bytes in the socket: its window stays
    // shut.
    greedy
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut first = [0u8; 1];
    assert_eq!(greedy.peek(&mut first).expect("the answer starts"), 1);
    std::thread::sleep(Duration::from_secs(2));
    // What the server wrote before it gave up, then the end.
    greedy
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let (mut got, mut buf) = (Vec::new(), vec![0u8; 1 << 16]);
    let ended = loop {
        match greedy.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    assert!(
        got.starts_with(b"HTTP/1.1 200 OK"),
        "{}",
        String::from_utf8_lossy(&got[..got.len().min(300)])
    );
    assert!(ended, "the server closed the connection");
    let got = got.len();
    assert!(
        got < 24_000_000,
        "only part of the answer left: {got} bytes"
    );
    // Its only slot is free again.
    f.wait_until("the next client is served", || {
        let mut s = send_query(f.addr(), "SELECT 1", None);
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        read_answer(&mut s).status == 200
    });
}
