//! A node's HTTP server: the D1-shaped query endpoint and `/metrics`.
//!
//! On the primary every request runs locally (behind the output gate when
//! the primary replicates). On a replica:
//! - `first-primary` (the session's first query) and batches go to the
//!   primary;
//! - a statement SQLite calls a write (`sqlite3_stmt_readonly`) is refused
//!   by the replica's engine and forwarded to the primary;
//! - a read waits, boundedly, until the replica has applied the session's
//!   bookmark; past that it is forwarded and served by the primary, and its
//!   meta says so.
//!
//! A forwarded request carries the session's bookmark and the client's
//! `Authorization` header; the primary's answer (status, body and
//! bookmark) is relayed as it is.
//!
//! Every request is authenticated first ([`Auth`]), before its body is
//! read: a query needs a token for its database (a read-only token runs
//! only statements SQLite calls read-only), `/metrics` an all-databases
//! token. A replica checks the token itself and the primary checks it
//! again on a forwarded request, so a replica is no way around the
//! primary's check.

pub use super::answer::{Answer, codes};
use super::answer::{log_refusal, query_error, respond, retry_after_s, too_large};
use super::api::{self, BOOKMARK_HEADER, Body, Response};
use super::auth::{Auth, AuthError, Target};
use super::metrics::{Metrics, ReplicaLag};
use crate::database::Database;
use crate::error::{QueryError, SessionError};
use crate::execution::CancelToken;
use crate::replication::ReplicatedReplica;
use crate::session::{Access, Constraint, QueryResult, Session};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What a node serves.
#[derive(Debug)]
pub enum Role {
    Primary(Database),
    Replica {
        replica: Arc<ReplicatedReplica>,
        /// The nodes that may be the primary, e.g.
        /// `http://127.0.0.1:8100,http://127.0.0.1:8101` ([`super::forward`]).
        primary_url: String,
    },
    /// A fleet node: it serves only the fleet's databases (set with
    /// [`Node::with_fleet`]), every name goes to the fleet.
    Fleet,
}

/// How a node serves HTTP.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The database name in `/v1/databases/{name}/query`.
    pub database: String,
    /// This node's region label.
    pub region: String,
    /// Larger request bodies are refused with 413 before they are parsed.
    pub max_body_bytes: usize,
    /// How long a forwarded request may take. It must cover what the
    /// primary may legitimately spend: the query time limit, the wait at
    /// the output gate and a large transaction's shipping; a shorter one
    /// turns a slow write into an ambiguous 503 ("may or may not have
    /// committed").
    pub forward_timeout_ms: u64,
    /// How long a replica keeps looking for a primary to forward to while
    /// none answers (a failover in progress); nothing has run meanwhile.
    pub failover_wait_ms: u64,
    /// Cold storage, for time travel on a primary (None: its endpoints
    /// answer 501).
    pub time_travel: Option<super::time_travel::TimeTravelConfig>,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            database: "main".into(),
            region: "local".into(),
            max_body_bytes: 1 << 20,
            // Twice the default query time limit: room for the gate and
            // for shipping a large transaction after the statement ran.
            forward_timeout_ms: 2 * crate::Limits::default().query_timeout_ms,
            failover_wait_ms: 5_000,
            time_travel: None,
        }
    }
}

/// One node's request handling, independent of the HTTP framework.
#[derive(Debug)]
pub struct Node {
    role: Role,
    config: HttpConfig,
    auth: Auth,
    metrics: Metrics,
    agent: ureq::Agent,
    /// Where a replica forwards (None on a primary).
    primaries: Option<super::forward::Primaries>,
    /// The last confirm lag seen, for the lag gauge between confirms.
    last_lag_us: std::sync::atomic::AtomicU64,
    /// Every request's cancel token is a child of this one.
    requests: CancelToken,
    /// Cold storage, for time travel (None without a store).
    time_travel: Option<super::time_travel::TimeTravel>,
    /// The fleet's databases and control plane (None: this node serves
    /// only its own database).
    fleet: Option<Arc<crate::fleet::Fleet>>,
}

/// An authenticated caller: what its statements may do, and the
/// credentials a forwarded request carries on. Only [`Node::authorize`]
/// makes one.
#[derive(Clone)]
pub struct Caller {
    access: Access,
    authorization: Option<String>,
    /// The request came from a replica forwarding it.
    forwarded: bool,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credentials stay out of logs.
        f.debug_struct("Caller")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl Caller {
    pub fn access(&self) -> Access {
        self.access
    }

    pub fn may_write(&self) -> bool {
        self.access == Access::ReadWrite
    }

    pub(super) fn is_forwarded(&self) -> bool {
        self.forwarded
    }

    pub(super) fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    pub(super) fn set_forwarded(&mut self, forwarded: bool) {
        self.forwarded = forwarded;
    }
}

fn auth_answer(e: &AuthError) -> Answer {
    Answer::error(e.status(), codes::AUTH, e.to_string())
}

impl Node {
    /// A node answering as `role`, checking requests with `auth`.
    pub fn new(role: Role, config: HttpConfig, auth: Auth) -> Node {
        let agent = super::client::agent(Duration::from_millis(config.forward_timeout_ms));
        let primaries = match &role {
            Role::Primary(_) | Role::Fleet => None,
            Role::Replica { primary_url, .. } => Some(super::forward::Primaries::new(
                primary_url,
                config.failover_wait_ms,
            )),
        };
        Node {
            primaries,
            role,
            auth,
            metrics: Metrics::default(),
            agent,
            last_lag_us: std::sync::atomic::AtomicU64::new(0),
            requests: CancelToken::new(),
            time_travel: config
                .time_travel
                .clone()
                .map(super::time_travel::TimeTravel::new),
            config,
            fleet: None,
        }
    }

    /// This node also serves the fleet's databases and control-plane API.
    pub fn with_fleet(mut self, fleet: Arc<crate::fleet::Fleet>) -> Node {
        self.fleet = Some(fleet);
        self
    }

    pub fn fleet(&self) -> Option<&Arc<crate::fleet::Fleet>> {
        self.fleet.as_ref()
    }

    pub(super) fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    pub(super) fn config(&self) -> &HttpConfig {
        &self.config
    }

    pub(super) fn time_travel_state(&self) -> Option<&super::time_travel::TimeTravel> {
        self.time_travel.as_ref()
    }

    pub(super) fn primary_database(&self) -> Option<&Database> {
        match &self.role {
            Role::Primary(db) => Some(db),
            Role::Replica { .. } | Role::Fleet => None,
        }
    }

    /// Forwards a request to another endpoint of the primary (`path` with
    /// its query), with the caller's credentials.
    pub(super) fn forward_path(
        &self,
        caller: &Caller,
        name: &str,
        path: &str,
        write: bool,
    ) -> Answer {
        let Some(primaries) = &self.primaries else {
            return Answer::error(503, codes::UNAVAILABLE, "no primary is known");
        };
        self.metrics
            .forwarded(if write { "write" } else { "time_travel" });
        let request = super::client::Request {
            database: name,
            bookmark: None,
            authorization: caller.authorization.as_deref(),
            payload: b"",
            forwarded: true,
            path: Some(path),
        };
        super::forward::answer(primaries.post(&self.agent, &request, 1 << 20))
    }

    /// A cancel token for one request: cancelled by the caller (its client
    /// went away) or by [`Node::cancel_all`].
    pub fn request_token(&self) -> CancelToken {
        self.requests.child()
    }

    /// Cancels every running request of this node and refuses later ones
    /// (503): for a server that is stopping.
    pub fn cancel_all(&self) {
        self.requests.cancel();
    }

    fn role_name(&self) -> &'static str {
        match self.role {
            Role::Primary(_) => "primary",
            Role::Replica { .. } => "replica",
            Role::Fleet => "fleet",
        }
    }

    /// Checks a request's `Authorization` header (raw bytes) for
    /// `target`; a refusal (401/403) is counted and returned as the answer.
    pub fn authorize(
        &self,
        authorization: Option<&[u8]>,
        target: Target<'_>,
    ) -> Result<Caller, Answer> {
        match self.auth.check(authorization, target) {
            Ok(access) => Ok(Caller {
                access,
                // Passed on as received (a node without authentication
                // passes on whatever came, for the primary to judge).
                authorization: authorization
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .map(str::to_string),
                forwarded: false,
            }),
            Err(e) => Err(self.refuse(auth_answer(&e))),
        }
    }

    /// Handles `POST /v1/databases/{name}/query` for an authorized caller.
    pub fn query(
        &self,
        caller: &Caller,
        name: &str,
        bookmark_header: Option<&str>,
        body: &[u8],
    ) -> Answer {
        self.query_cancellable(caller, name, bookmark_header, body, &self.request_token())
    }

    /// [`Node::query`], stopped early once `cancel` is cancelled.
    pub fn query_cancellable(
        &self,
        caller: &Caller,
        name: &str,
        bookmark_header: Option<&str>,
        body: &[u8],
        cancel: &CancelToken,
    ) -> Answer {
        let answer = self.query_inner(caller, name, bookmark_header, body, cancel);
        if answer.status >= 400 {
            log_refusal(&answer);
            self.metrics.refused(answer.status);
        } else if let Some(served) = &answer.served {
            for (by_primary, region) in served {
                self.metrics.served(*by_primary, region);
            }
        } else if let Ok(r) = serde_json::from_slice::<Response>(&answer.body) {
            for res in &r.result {
                self.metrics
                    .served(res.meta.served_by_primary, &res.meta.served_by_region);
            }
        }
        answer
    }

    fn query_inner(
        &self,
        caller: &Caller,
        name: &str,
        header: Option<&str>,
        body: &[u8],
        cancel: &CancelToken,
    ) -> Answer {
        let fleet_database = name != self.config.database || matches!(self.role, Role::Fleet);
        if fleet_database && self.fleet.is_none() {
            return Answer::error(
                404,
                codes::UNKNOWN_DATABASE,
                format!("unknown database {name:?}"),
            );
        }
        if body.len() > self.config.max_body_bytes {
            return Answer::error(413, codes::TOO_LARGE, too_large(self.config.max_body_bytes));
        }
        let constraint = match header.map(str::parse::<Constraint>).transpose() {
            Ok(c) => c.unwrap_or(Constraint::FirstUnconstrained),
            Err(e) => return Answer::error(400, codes::BOOKMARK, e.to_string()),
        };
        let parsed = match api::parse_body(body) {
            Ok(b) => b,
            Err(e) => return Answer::error(400, codes::BAD_REQUEST, e.to_string()),
        };
        if fleet_database {
            return self.fleet_query(caller, name, header, body, constraint, &parsed, cancel);
        }
        match &self.role {
            // Every name is the fleet's on a fleet node (handled above).
            Role::Fleet => Answer::error(404, codes::UNKNOWN_DATABASE, "unknown database"),
            Role::Primary(db) => self
                .run(db, caller, constraint, &parsed, cancel)
                .into_answer(),
            Role::Replica { replica, .. } => {
                if caller.forwarded {
                    // Sent here as the primary by a replica that believes
                    // this node leads (a failover moved it): whatever the
                    // request, it was meant for the primary, so say this
                    // is not it and the sender tries the next node.
                    return super::forward::not_primary();
                }
                let forward = |reason| self.forward(caller, name, header, body, reason);
                if constraint == Constraint::FirstPrimary {
                    return forward("first-primary");
                }
                if matches!(parsed, Body::Batch(_)) {
                    // An atomic batch runs where writes run.
                    return forward("batch");
                }
                match self.run(
                    replica.replica().database(),
                    caller,
                    constraint,
                    &parsed,
                    cancel,
                ) {
                    Routed::Done(a) => a,
                    // The engine called it a write: a read-only caller
                    // is refused here (the primary would refuse it too).
                    Routed::Forward(Forward::Write) if caller.access == Access::ReadOnly => {
                        let e = QueryError::ReadOnlyAccess;
                        let (status, code) = query_error(&e);
                        Answer::error(status, code, e.to_string())
                    }
                    Routed::Forward(Forward::Write) => forward("write"),
                    Routed::Forward(Forward::Behind) => forward("behind"),
                }
            }
        }
    }

    fn run(
        &self,
        db: &Database,
        caller: &Caller,
        constraint: Constraint,
        body: &Body,
        cancel: &CancelToken,
    ) -> Routed {
        let session = match db.session(constraint) {
            Ok(s) => s.with_access(caller.access).cancel_with(cancel.clone()),
            Err(e @ SessionError::FutureBookmark { .. })
            | Err(e @ SessionError::MalformedBookmark(_)) => {
                return Routed::Done(Answer::error(400, codes::BOOKMARK, e.to_string()));
            }
        };
        let result = run_body(&session, body);
        let bookmark = session.bookmark().map(|b| b.to_string());
        match result {
            Ok(results) => {
                let mut a = Answer::json(200, bookmark, &Response::ok(&results));
                a.usage = Some(results.iter().fold((0, 0), |(r, w), q| {
                    (r + q.meta.rows_read, w + q.meta.rows_written)
                }));
                Routed::Done(a)
            }
            Err(QueryError::ReadOnlyReplica) => Routed::Forward(Forward::Write),
            Err(QueryError::ReplicaBehind { .. }) => Routed::Forward(Forward::Behind),
            Err(e) => {
                self.metrics.query_failed(&e);
                let (status, code) = query_error(&e);
                let mut a = Answer::error(status, code, e.to_string());
                a.retry_after_s = retry_after_s(&e);
                Routed::Done(a)
            }
        }
    }

    /// Runs a body on a database of this node's (a primary's answer).
    pub(super) fn run_on(
        &self,
        db: &Database,
        caller: &Caller,
        constraint: Constraint,
        body: &Body,
        cancel: &CancelToken,
    ) -> Answer {
        self.run(db, caller, constraint, body, cancel).into_answer()
    }

    fn forward(
        &self,
        caller: &Caller,
        name: &str,
        header: Option<&str>,
        body: &[u8],
        reason: &'static str,
    ) -> Answer {
        let Some(primaries) = &self.primaries else {
            return Answer::error(503, codes::UNAVAILABLE, "no primary is known");
        };
        self.metrics.forwarded(reason);
        let request = super::client::Request {
            database: name,
            bookmark: header,
            authorization: caller.authorization.as_deref(),
            payload: body,
            forwarded: true,
            path: None,
        };
        super::forward::answer(primaries.post(&self.agent, &request, 64 << 20))
    }

    /// Counts a refusal made before the request reached [`Node::query`]
    /// (the framework layer), and passes it through.
    pub(super) fn refuse(&self, answer: Answer) -> Answer {
        log_refusal(&answer);
        self.metrics.refused(answer.status);
        answer
    }

    /// Records confirm-lag samples taken from the replica elsewhere (a
    /// process that also prints them): each sample is counted once, by
    /// whoever drains it.
    pub fn observe_confirm_lags(&self, samples_us: &[u64]) {
        self.metrics.confirm_lags(samples_us);
        if let Some(&last) = samples_us.last() {
            self.last_lag_us
                .store(last, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The Prometheus exposition for `GET /metrics`.
    pub fn metrics_text(&self) -> String {
        let lag = match &self.role {
            Role::Primary(_) | Role::Fleet => None,
            Role::Replica { replica, .. } => {
                let node = replica.node();
                let samples = node.take_confirm_lags_us();
                self.metrics.confirm_lags(&samples);
                let visible = replica.replica().confirmed();
                let announced = node.leader_confirmed();
                let bookmarks = if announced.epoch == visible.epoch {
                    announced.sequence.0.saturating_sub(visible.sequence.0)
                } else {
                    u64::from(announced > visible)
                };
                if let Some(&last) = samples.last() {
                    self.last_lag_us
                        .store(last, std::sync::atomic::Ordering::Relaxed);
                }
                let last = self.last_lag_us.load(std::sync::atomic::Ordering::Relaxed);
                Some(ReplicaLag {
                    bookmarks,
                    last_confirm_lag_us: last,
                })
            }
        };
        let mut text = self
            .metrics
            .render(self.role_name(), &self.config.region, lag);
        if let (Some(tt), Some(db)) = (&self.time_travel, self.primary_database()) {
            text.push_str(&tt.metrics_text(db.latest_bookmark()));
        }
        text
    }
}

/// Why a replica hands a request to the primary.
enum Forward {
    Write,
    Behind,
}

/// A request's fate on this node.
enum Routed {
    Done(Answer),
    Forward(Forward),
}

impl Routed {
    fn into_answer(self) -> Answer {
        match self {
            Routed::Done(a) => a,
            // Only a primary's run ends here, and a primary never forwards.
            Routed::Forward(_) => Answer::error(500, codes::INTERNAL, "nowhere to forward"),
        }
    }
}

fn run_body(session: &Session, body: &Body) -> Result<Vec<QueryResult>, QueryError> {
    match body {
        Body::One(s) => Ok(vec![
            session
                .prepare(s.sql.clone())
                .bind(s.params.iter().cloned())
                .all()?,
        ]),
        Body::Batch(ss) => session.batch(ss.iter().map(|s| {
            session
                .prepare(s.sql.clone())
                .bind(s.params.iter().cloned())
        })),
    }
}

/// How long a stopping server waits for its requests (all cancelled by
/// then) before it drops them.
pub const SHUTDOWN_GRACE_MS: u64 = 2_000;

/// A running HTTP server. Dropping it stops it: every running request is
/// cancelled, and the server waits at most [`SHUTDOWN_GRACE_MS`] for them.
pub struct HttpServer {
    addr: SocketAddr,
    node: Arc<Node>,
    shutdown: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl HttpServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.node.cancel_all();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Cancels its request's token when dropped: hyper drops a request's
/// future when its client goes away (HTTP/1 half-close is off, so EOF on
/// a busy connection ends it), and with it this guard.
struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

async fn query_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    // Authentication first: nothing of an unauthenticated request is
    // read, not even its body.
    let authorization = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes);
    // Cheap enough to run on the worker: a hash and a map lookup, and a
    // stat of the store at most once a second.
    let mut caller = match node.authorize(authorization, Target::Database(&name)) {
        Ok(c) => c,
        Err(answer) => return respond(answer),
    };
    caller.forwarded = headers.contains_key(super::forward::FORWARDED_HEADER);
    let header = headers
        .get(BOOKMARK_HEADER)
        .map(|v| v.to_str().map(str::to_string));
    let limit = node.config.max_body_bytes;
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Read at most one byte past the limit: enough to know it is exceeded,
    // never an allocation the client chose.
    let body = match declared {
        Some(n) if n > limit as u64 => Err(BodyRead::TooLarge),
        _ => axum::body::to_bytes(body, limit.saturating_add(1))
            .await
            .map_err(|e| {
                if is_length_limit(&e) {
                    BodyRead::TooLarge
                } else {
                    BodyRead::Failed(e.to_string())
                }
            }),
    };
    let answer = match (header, body) {
        (_, Err(BodyRead::TooLarge)) => {
            node.refuse(Answer::error(413, codes::TOO_LARGE, too_large(limit)))
        }
        (_, Err(BodyRead::Failed(why))) => node.refuse(Answer::error(
            400,
            codes::BAD_REQUEST,
            format!("could not read the request body: {why}"),
        )),
        (Some(Err(_)), _) => node.refuse(Answer::error(
            400,
            codes::BOOKMARK,
            "the bookmark header is not text",
        )),
        (header, Ok(body)) => {
            let header = header.and_then(Result::ok);
            // SQLite, the output gate and forwarding all block: they run on
            // the blocking pool while this future waits, so that hyper can
            // drop the future (cancelling the query) if the client leaves.
            let token = node.request_token();
            let _cancel_on_drop = CancelOnDrop(token.clone());
            let n = Arc::clone(&node);
            tokio::task::spawn_blocking(move || {
                n.query_cancellable(&caller, &name, header.as_deref(), &body, &token)
            })
            .await
            .unwrap_or_else(|e| {
                node.refuse(Answer::error(
                    500,
                    codes::INTERNAL,
                    format!("the request failed: {e}"),
                ))
            })
        }
    };
    respond(answer)
}

/// Why a request body was not read.
enum BodyRead {
    TooLarge,
    Failed(String),
}

/// Whether a body error is the size limit (http-body's `LengthLimitError`,
/// which axum wraps; matched by its message to avoid a dependency for one
/// type).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.to_string().contains("length limit exceeded") {
            return true;
        }
        source = err.source();
    }
    false
}

/// `GET /metrics`: node-wide, so it needs an all-databases token (of
/// either permission).
async fn metrics_route(State(node): State<Arc<Node>>, headers: HeaderMap) -> HttpResponse {
    let authorization = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes);
    if let Err(answer) = node.authorize(authorization, Target::Metrics) {
        return respond(answer).into_response();
    }
    let n = Arc::clone(&node);
    let text = tokio::task::spawn_blocking(move || n.metrics_text())
        .await
        .unwrap_or_default();
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// Serves `node` on `addr` from a thread of its own (a small tokio
/// runtime; a request's blocking work runs on its blocking pool).
pub fn serve(node: Arc<Node>, addr: SocketAddr) -> io::Result<HttpServer> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("walrelay-http")
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind(addr))?;
    let bound = listener.local_addr()?;
    // The body limit is enforced by the handler, in D1's error shape.
    let app = Router::new()
        .route("/v1/databases/{name}/query", post(query_route))
        .route("/metrics", get(metrics_route))
        .route(
            "/internal/fleet/{call}",
            post(super::fleet_internal::internal_route),
        )
        .route(
            "/v1/databases",
            post(super::control_api::databases_route).get(super::control_api::databases_route),
        )
        .route(
            "/v1/databases/{id}",
            get(super::control_api::database_route).delete(super::control_api::database_route),
        )
        .route(
            "/client/v4/accounts/{account_id}/d1/database",
            post(super::control_api::cf_databases_route)
                .get(super::control_api::cf_databases_route),
        )
        .route(
            "/client/v4/accounts/{account_id}/d1/database/{database_id}",
            get(super::control_api::cf_database_route)
                .delete(super::control_api::cf_database_route),
        )
        .route(
            "/v1/databases/{name}/time_travel/bookmark",
            get(super::time_travel::bookmark_route).post(super::time_travel::bookmark_route),
        )
        .route(
            "/v1/databases/{name}/time_travel/restore",
            post(super::time_travel::restore_route),
        )
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::clone(&node));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let grace = Duration::from_millis(SHUTDOWN_GRACE_MS);
    let thread = std::thread::Builder::new()
        .name("walrelay-http-main".into())
        .spawn(move || {
            let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let serving = axum::serve(listener, app).with_graceful_shutdown(stopped(rx.clone()));
            runtime.block_on(async move {
                // Graceful: no new connections, in-flight requests finish
                // (they were cancelled) — but for at most `grace`.
                tokio::select! {
                    _ = serving => {}
                    _ = async {
                        stopped(rx).await;
                        tokio::time::sleep(grace).await;
                    } => {}
                }
            });
            // Blocking work still running is left to finish on its own.
            runtime.shutdown_timeout(Duration::from_millis(100));
        })?;
    Ok(HttpServer {
        addr: bound,
        node,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}
