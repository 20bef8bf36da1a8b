//! Authentication on the HTTP API, over real HTTP against a local cluster
//! (a primary and a replica, authentication on); the command line's side
//! is `http_auth_cli.rs`.
//!
//! Missing or invalid credentials are 401, a valid token that does not
//! grant the request is 403, both in D1's error shape with code 10000;
//! every refusal changes nothing. A replica forwards the client's
//! credentials and the primary checks them again.
//!
//! Requests are built by hand so that what is tested is the wire format.

mod common;

use serde_json::{Value as Json, json};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_engine::http::auth::{ApiToken, Auth, Permission, Scope};
use walrelay_engine::http::client::{Client, ClientError};
use walrelay_engine::http::server::{HttpConfig, HttpServer, Node, Role, serve};
use walrelay_engine::http::token_store;
use walrelay_engine::local_cluster::{LocalCluster, LocalClusterConfig};
use walrelay_engine::{Bookmark, Constraint, Value};

/// Cloudflare's "Authentication error", for 401 and 403 alike (spelled
/// out so a renumbering shows up as a failing test).
const AUTH: u32 = 10000;

struct Fixture {
    // Field order is drop order: the cluster stops before its directory goes.
    c: LocalCluster,
    dir: tempfile::TempDir,
    agent: ureq::Agent,
    /// main, read-write.
    writer: ApiToken,
    /// main, read-only.
    reader: ApiToken,
    /// another database, read-write.
    other: ApiToken,
    /// all databases, read-only.
    all_reader: ApiToken,
}

/// A cluster whose store holds, besides its admin token, one token of each
/// kind the tests need (minted before it starts), and a table `t` with
/// three rows that the replica has applied.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tokens");
    let mint = |scope: Scope, p: Permission| token_store::create(&store, scope, p).expect("mint");
    let main = || Scope::Database("main".into());
    let writer = mint(main(), Permission::ReadWrite);
    let reader = mint(main(), Permission::Read);
    let other = mint(Scope::Database("other".into()), Permission::ReadWrite);
    let all_reader = mint(Scope::All, Permission::Read);
    let c = LocalCluster::start(
        dir.path(),
        LocalClusterConfig {
            replica_regions: vec!["region-a".into()],
            ..LocalClusterConfig::default()
        },
    )
    .expect("cluster");
    assert_eq!(c.tokens_path(), Some(store.as_path()));
    let s = c
        .primary
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .run()
        .expect("create");
    s.prepare("INSERT INTO t(v) VALUES ('a'), ('b'), ('c')")
        .run()
        .expect("insert");
    wait_replicas(&c, c.primary.database().latest_bookmark());
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .new_agent();
    Fixture {
        c,
        dir,
        agent,
        writer,
        reader,
        other,
        all_reader,
    }
}

fn wait_replicas(c: &LocalCluster, b: Bookmark) {
    for r in &c.replicas {
        assert!(
            r.node().wait_confirmed(b, Duration::from_secs(10)),
            "a replica never reached {b}"
        );
    }
}

/// What the test saw of one answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    www_authenticate: Option<String>,
    bookmark: Option<String>,
    json: Json,
    text: String,
}

fn bearer(t: &ApiToken) -> Vec<u8> {
    t.bearer().into_bytes()
}

const COUNT: &str = r#"{"sql": "SELECT count(*) AS n FROM t"}"#;
const INSERT: &str = r#"{"sql": "INSERT INTO t(v) VALUES ('x')"}"#;
const BATCH_WITH_WRITE: &str =
    r#"[{"sql": "SELECT count(*) FROM t"}, {"sql": "INSERT INTO t(v) VALUES ('x')"}]"#;
const BATCH_OF_READS: &str =
    r#"[{"sql": "SELECT count(*) AS n FROM t"}, {"sql": "SELECT max(id) AS m FROM t"}]"#;

impl Fixture {
    fn primary(&self) -> String {
        self.c.primary_http.url()
    }

    fn replica(&self) -> String {
        self.c.replica_http[0].url()
    }

    fn nodes(&self) -> [(&'static str, String); 2] {
        [("primary", self.primary()), ("replica", self.replica())]
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("tokens")
    }

    /// POSTs `body` to `{base}/v1/databases/{database}/query` with the
    /// raw `Authorization` header given (none if None). Written to the
    /// socket by hand: HTTP clients refuse to send some of the malformed
    /// headers tested here.
    fn post(
        &self,
        base: &str,
        database: &str,
        authorization: Option<&[u8]>,
        bookmark: &str,
        body: &str,
    ) -> Reply {
        let addr = base.strip_prefix("http://").expect("an http URL");
        let mut request = format!(
            "POST /v1/databases/{database}/query HTTP/1.1\r\nhost: {addr}\r\n\
             content-type: application/json\r\nx-d1-bookmark: {bookmark}\r\n\
             content-length: {}\r\nconnection: close\r\n",
            body.len()
        )
        .into_bytes();
        if let Some(a) = authorization {
            request.extend_from_slice(b"authorization: ");
            request.extend_from_slice(a);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(body.as_bytes());
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream.write_all(&request).expect("send");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("receive");
        parse_answer(&answer)
    }

    fn metrics(&self, base: &str, authorization: Option<&[u8]>) -> Reply {
        let mut req = self.agent.get(format!("{base}/metrics"));
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        reply(req.call().expect("the node answers"))
    }

    /// Everything a refused request must leave as it was.
    fn state(&self) -> (Bookmark, Vec<Vec<u8>>, Vec<Bookmark>) {
        let db = self.c.primary.database();
        let s = db.session(Constraint::FirstPrimary).expect("session");
        (
            db.latest_bookmark(),
            common::logical_pages(&s),
            self.c
                .replicas
                .iter()
                .map(|r| r.replica().confirmed())
                .collect(),
        )
    }

    /// Sends the request to every node and checks it is refused with
    /// `status` and code 10000, with nothing changed.
    fn refuse(
        &self,
        what: &str,
        status: u16,
        authorization: Option<&[u8]>,
        bookmark: &str,
        body: &str,
    ) -> Vec<Reply> {
        let mut replies = Vec::new();
        for (node, url) in self.nodes() {
            let what = format!("{what} (sent to the {node})");
            let before = self.state();
            let r = self.post(&url, "main", authorization, bookmark, body);
            assert_d1_auth_error(&r, status, &what);
            assert!(r.bookmark.is_none(), "{what}: a bookmark {:?}", r.bookmark);
            assert!(self.state() == before, "{what}: something changed");
            replies.push(r);
        }
        replies
    }

    /// Waits until `token` is accepted for a read (a token minted into the
    /// store while the nodes run), on every node.
    fn wait_accepted(&self, token: &ApiToken) -> Duration {
        let started = Instant::now();
        for (node, url) in self.nodes() {
            loop {
                let r = self.post(
                    &url,
                    "main",
                    Some(&bearer(token)),
                    "first-unconstrained",
                    COUNT,
                );
                if r.status == 200 {
                    break;
                }
                assert_eq!(r.status, 401, "{node}: {}", r.text);
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the {node} never picked up the new token"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        started.elapsed()
    }
}

fn reply(mut resp: ureq::http::Response<ureq::Body>) -> Reply {
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (www_authenticate, bookmark) = (header("www-authenticate"), header("x-d1-bookmark"));
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("a body");
    let json = serde_json::from_str(&text).unwrap_or(Json::Null);
    Reply {
        status,
        www_authenticate,
        bookmark,
        json,
        text,
    }
}

/// An HTTP/1.1 answer read to the end of the connection (the server sends
/// a content-length, and closes as asked).
fn parse_answer(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head}"));
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    Reply {
        status,
        www_authenticate: header("www-authenticate"),
        bookmark: header("x-d1-bookmark"),
        json: serde_json::from_str(body).unwrap_or(Json::Null),
        text: body.to_string(),
    }
}

/// D1's error shape with the authentication code; a 401 names the scheme.
fn assert_d1_auth_error(r: &Reply, status: u16, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", r.text);
    assert_eq!(r.json["success"], false, "{what}: {}", r.text);
    assert_eq!(r.json["result"], json!([]), "{what}: {}", r.text);
    assert_eq!(r.json["errors"][0]["code"], AUTH, "{what}: {}", r.text);
    assert!(r.json["errors"][0]["message"].is_string(), "{what}");
    if status == 401 {
        assert_eq!(
            r.www_authenticate.as_deref(),
            Some("Bearer realm=\"walrelay\""),
            "{what}"
        );
    }
}

fn ok_count(r: &Reply, what: &str) -> i64 {
    assert_eq!(r.status, 200, "{what}: {}", r.text);
    r.json["result"][0]["results"][0]["n"]
        .as_i64()
        .unwrap_or_else(|| panic!("{what}: {}", r.text))
}

#[test]
fn missing_malformed_unknown_or_wrong_secret_credentials_are_401_and_change_nothing() {
    let fx = fixture();
    let admin = fx.c.admin_token().expect("admin").expose();
    let (admin_id, admin_secret) = admin["wrt_".len()..].split_once('_').expect("shape");
    let mut wrong_secret = admin_secret.as_bytes().to_vec();
    wrong_secret[0] = if wrong_secret[0] == b'0' { b'1' } else { b'0' };
    let wrong_secret = format!(
        "Bearer wrt_{admin_id}_{}",
        String::from_utf8(wrong_secret).expect("hex")
    );
    let unknown = format!("Bearer {}", ApiToken::generate().expect("rng").expose());
    let cases: [(&str, Option<Vec<u8>>); 9] = [
        ("no Authorization header", None),
        ("another scheme", Some(b"Basic dXNlcjpwYXNz".to_vec())),
        ("Bearer without a token", Some(b"Bearer".to_vec())),
        ("not a token", Some(b"Bearer hunter2".to_vec())),
        (
            "the token without its scheme",
            Some(admin.clone().into_bytes()),
        ),
        (
            "a token cut short",
            Some(format!("Bearer {}", &admin[..40]).into_bytes()),
        ),
        (
            "a header that is not text",
            Some(b"Bearer wrt_\xff\xfe".to_vec()),
        ),
        ("an unknown token", Some(unknown.into_bytes())),
        (
            "a known id with a wrong secret",
            Some(wrong_secret.into_bytes()),
        ),
    ];
    for (what, header) in &cases {
        // A write, and the primary's own route: had it run, it would show.
        fx.refuse(what, 401, header.as_deref(), "first-primary", INSERT);
        fx.refuse(what, 401, header.as_deref(), "first-unconstrained", COUNT);
    }
    // An unknown id and a wrong secret read the same to the client.
    let message = |header: &[u8]| {
        let r = fx.post(
            &fx.primary(),
            "main",
            Some(header),
            "first-unconstrained",
            COUNT,
        );
        r.json["errors"][0]["message"].clone()
    };
    assert_eq!(
        message(cases[7].1.as_deref().expect("header")),
        message(cases[8].1.as_deref().expect("header"))
    );
    // Refusals are counted by status.
    let metrics = fx.metrics(&fx.primary(), Some(&bearer(&fx.all_reader)));
    assert!(
        metrics
            .text
            .lines()
            .any(|l| l.starts_with("walrelay_refused_total{") && l.contains("status=\"401\"")),
        "{}",
        metrics.text
    );
}

/// Sends a request head on `stream` (keep-alive) and, when `body` is
/// given, its body in a second write; reads one answer: its status and
/// its `Connection` header.
fn exchange(
    stream: &mut std::net::TcpStream,
    authorization: &str,
    body: Option<&str>,
) -> (u16, Option<String>) {
    let head = format!(
        "POST /v1/databases/main/query HTTP/1.1\r\nhost: walrelay\r\n\
         content-type: application/json\r\nauthorization: {authorization}\r\n\
         content-length: {}\r\n\r\n",
        COUNT.len()
    );
    stream.write_all(head.as_bytes()).expect("send the head");
    if let Some(b) = body {
        stream.write_all(b.as_bytes()).expect("send the body");
    }
    let answer = common::raw_http::read_answer(stream);
    (answer.status, answer.header("connection"))
}

#[test]
fn a_request_refused_before_its_body_arrives_is_answered_with_connection_close() {
    let fx = fixture();
    let admin = fx.c.admin_token().expect("admin").expose();
    for (node, url) in fx.nodes() {
        let addr = url.strip_prefix("http://").expect("an http URL");
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        // Answered, body read: the connection stays open for the next.
        let (status, connection) = exchange(&mut stream, &format!("Bearer {admin}"), Some(COUNT));
        assert_eq!((status, connection), (200, None), "{node}: a good request");
        // Refused from its head alone, the body held back: the answer says
        // the connection closes (a pooling client must not reuse it) ...
        let (status, connection) = exchange(&mut stream, "Bearer hunter2", None);
        assert_eq!(status, 401, "{node}");
        assert_eq!(connection.as_deref(), Some("close"), "{node}");
        // ... and it does, once the body the client still sends is in.
        stream.write_all(COUNT.as_bytes()).expect("the late body");
        assert!(
            common::raw_http::closed_within(&mut stream, Duration::from_secs(30)),
            "{node}: closed, nothing more answered"
        );
    }
}

#[test]
fn a_token_for_another_database_is_403_and_changes_nothing() {
    let fx = fixture();
    let other = bearer(&fx.other);
    fx.refuse(
        "another database's token, a write",
        403,
        Some(&other),
        "first-primary",
        INSERT,
    );
    fx.refuse(
        "another database's token, a read",
        403,
        Some(&other),
        "first-unconstrained",
        COUNT,
    );
    for (node, url) in fx.nodes() {
        // Its own database passes the check; this node does not serve it.
        let r = fx.post(&url, "other", Some(&other), "first-unconstrained", COUNT);
        assert_eq!(r.status, 404, "{node}: {}", r.text);
        // A token for main does not reach another database.
        let r = fx.post(
            &url,
            "other",
            Some(&bearer(&fx.writer)),
            "first-unconstrained",
            COUNT,
        );
        assert_d1_auth_error(&r, 403, node);
    }
}

#[test]
fn a_read_only_token_reads_but_writes_and_batches_with_a_write_are_403_and_change_nothing() {
    let fx = fixture();
    let reader = bearer(&fx.reader);
    for (node, url) in fx.nodes() {
        let r = fx.post(&url, "main", Some(&reader), "first-unconstrained", COUNT);
        assert_eq!(ok_count(&r, node), 3);
        // A batch of reads runs where batches run: on the primary.
        let r = fx.post(
            &url,
            "main",
            Some(&reader),
            "first-unconstrained",
            BATCH_OF_READS,
        );
        assert_eq!(r.status, 200, "{node}: {}", r.text);
        assert_eq!(r.json["result"][1]["results"][0]["m"], 3, "{node}");
    }
    for bookmark in ["first-unconstrained", "first-primary"] {
        for (what, body) in [
            ("an insert", INSERT),
            ("an update", r#"{"sql": "UPDATE t SET v = 'y'"}"#),
            ("a delete", r#"{"sql": "DELETE FROM t"}"#),
            ("a create table", r#"{"sql": "CREATE TABLE u(x)"}"#),
            ("an index", r#"{"sql": "CREATE INDEX t_v ON t(v)"}"#),
            ("a batch with a write", BATCH_WITH_WRITE),
        ] {
            let what = format!("read-only token, {what}, {bookmark}");
            let replies = fx.refuse(&what, 403, Some(&reader), bookmark, body);
            for r in replies {
                let message = r.json["errors"][0]["message"].as_str().unwrap_or("");
                assert!(message.contains("read-only"), "{what}: {message}");
            }
        }
    }
    // The same write with a read-write token goes through, from either node.
    for (node, url) in fx.nodes() {
        let r = fx.post(
            &url,
            "main",
            Some(&bearer(&fx.writer)),
            "first-unconstrained",
            INSERT,
        );
        assert_eq!(r.status, 200, "{node}: {}", r.text);
    }
}

#[test]
fn a_write_through_a_replica_is_forwarded_with_the_clients_token_and_checked_again_by_the_primary()
{
    let fx = fixture();
    let r = fx.post(
        &fx.replica(),
        "main",
        Some(&bearer(&fx.writer)),
        "first-unconstrained",
        INSERT,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["result"][0]["meta"]["served_by_primary"], true);

    // The crate's client carries its token the same way; without one it
    // gets D1's authentication error.
    let nodes = fx.c.nodes();
    let with = Client::new(nodes.clone(), "region-a", "main").with_token(&fx.writer);
    let s = with.session("first-unconstrained");
    let w = s
        .query(
            "INSERT INTO t(v) VALUES (?1)",
            vec![Value::Text("y".into())],
        )
        .expect("a forwarded write");
    assert!(w.response.result[0].meta.served_by_primary);
    assert_eq!(
        w.sent_to,
        fx.replica(),
        "sent to the replica, which forwarded it"
    );
    let without = Client::new(nodes, "region-a", "main");
    match without
        .session("first-unconstrained")
        .query("SELECT 1", vec![])
    {
        Err(ClientError::Refused {
            status: 401,
            code: AUTH,
            ..
        }) => {}
        other => panic!("no token: {other:?}"),
    }

    // A replica that checks nothing itself (--insecure) is no way around
    // the primary: what it forwards is judged by the primary's store.
    let open_replica = open_replica(&fx);
    let url = open_replica.url();
    let before = fx.state();
    let r = fx.post(&url, "main", None, "first-unconstrained", INSERT);
    assert_d1_auth_error(&r, 401, "no token, through an unchecking replica");
    let r = fx.post(
        &url,
        "main",
        Some(&bearer(&fx.reader)),
        "first-unconstrained",
        INSERT,
    );
    assert_d1_auth_error(&r, 403, "read-only token, forwarded write");
    let r = fx.post(
        &url,
        "main",
        Some(&bearer(&fx.reader)),
        "first-unconstrained",
        BATCH_WITH_WRITE,
    );
    assert_d1_auth_error(&r, 403, "read-only token, forwarded batch");
    let r = fx.post(
        &url,
        "main",
        Some(&bearer(&fx.other)),
        "first-primary",
        COUNT,
    );
    assert_d1_auth_error(&r, 403, "another database's token, forwarded read");
    assert!(fx.state() == before, "a refused forward changed something");
    let r = fx.post(
        &url,
        "main",
        Some(&bearer(&fx.writer)),
        "first-unconstrained",
        INSERT,
    );
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A second HTTP face for the cluster's replica that authenticates
/// nothing, in front of the checking primary.
fn open_replica(fx: &Fixture) -> HttpServer {
    let node = Node::new(
        Role::Replica {
            replica: Arc::clone(&fx.c.replicas[0]),
            primary_url: fx.primary(),
        },
        HttpConfig {
            region: "region-open".into(),
            ..HttpConfig::default()
        },
        Auth::Insecure,
    );
    serve(Arc::new(node), SocketAddr::from(([127, 0, 0, 1], 0))).expect("serve")
}

#[test]
fn metrics_need_an_all_databases_token() {
    let fx = fixture();
    for (node, url) in fx.nodes() {
        assert_d1_auth_error(&fx.metrics(&url, None), 401, node);
        assert_d1_auth_error(&fx.metrics(&url, Some(b"Bearer nope")), 401, node);
        assert_d1_auth_error(&fx.metrics(&url, Some(&bearer(&fx.writer))), 403, node);
        assert_d1_auth_error(&fx.metrics(&url, Some(&bearer(&fx.other))), 403, node);
        let r = fx.metrics(&url, Some(&bearer(&fx.all_reader)));
        assert_eq!(r.status, 200, "{node}: {}", r.text);
        assert!(r.text.contains("walrelay_"), "{node}: {}", r.text);
    }
}

#[test]
fn a_token_minted_while_the_nodes_run_works_and_a_malformed_store_keeps_the_tokens_loaded() {
    let fx = fixture();
    let store = fx.store();
    let fresh = token_store::create(&store, Scope::Database("main".into()), Permission::Read)
        .expect("mint");
    let took = fx.wait_accepted(&fresh);
    println!("a minted token was accepted everywhere after {took:?}");

    // A store that stops parsing keeps what was loaded...
    let good = std::fs::read(&store).expect("read");
    std::fs::write(&store, b"{\"format\": \"walrelay-tokens\", \"tokens\": [").expect("break");
    std::thread::sleep(Duration::from_millis(2 * token_store::RELOAD_CHECK_MS));
    for (node, url) in fx.nodes() {
        let r = fx.post(
            &url,
            "main",
            Some(&bearer(&fresh)),
            "first-unconstrained",
            COUNT,
        );
        assert_eq!(ok_count(&r, node), 3, "{node} dropped its tokens");
    }
    // ...minting into it is refused rather than overwriting it...
    assert!(matches!(
        token_store::create(&store, Scope::All, Permission::Read),
        Err(token_store::StoreError::Invalid { .. })
    ));
    // ...and once it is repaired, a revoked token stops working.
    std::fs::write(&store, &good).expect("repair");
    assert!(token_store::revoke(&store, fresh.id()).expect("revoke"));
    let started = Instant::now();
    for (node, url) in fx.nodes() {
        loop {
            let r = fx.post(
                &url,
                "main",
                Some(&bearer(&fresh)),
                "first-unconstrained",
                COUNT,
            );
            if r.status == 401 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the {node} still accepts a revoked token"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let r = fx.post(
        &fx.primary(),
        "main",
        Some(&bearer(&fx.writer)),
        "first-unconstrained",
        COUNT,
    );
    assert_eq!(ok_count(&r, "primary"), 3, "the other tokens stay");
}
