//! A node's request handling: the D1-shaped query endpoints (`/query`,
//! `/raw`), database resolution, authentication and `/metrics`. The HTTP
//! routes themselves are in `super::routes` (and `super::cloudflare`,
//! `super::transfer`).
//!
//! On the primary every request runs locally (behind the output gate when
//! the primary replicates). On a replica:
//! - `first-primary` (the session's first query) and batches go to the
//!   primary; so does a multi-statement `sql` that writes (the replica
//!   runs one that only reads itself, in one read transaction);
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

pub(super) mod query;
use super::answer::log_refusal;
use super::auth::{Auth, AuthError, Target};
use super::metrics::{Metrics, ReplicaLag};
pub use super::routes::{HttpServer, SHUTDOWN_GRACE_MS, serve};
use crate::database::Database;
use crate::execution::CancelToken;
use crate::replication::ReplicatedReplica;
use crate::session::Access;
use std::sync::Arc;
use std::time::Duration;

/// A database a request runs on: the node's own or a hosted fleet
/// database (held open while the request runs).
pub(super) enum LocalDb<'a> {
    Main(&'a Database),
    Fleet(Arc<crate::fleet::host::OpenDb>),
    /// A replica node's copy of a fleet database (reads only).
    FleetReplica(Arc<crate::fleet::replica_host::FleetReplica>),
}

impl std::ops::Deref for LocalDb<'_> {
    type Target = Database;
    fn deref(&self) -> &Database {
        match self {
            LocalDb::Main(db) => db,
            LocalDb::Fleet(open) => open.database(),
            LocalDb::FleetReplica(r) => r.database(),
        }
    }
}

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
    /// Cold storage for the fleet's databases hosted here (their history,
    /// archived by the followers), and where restores are staged.
    pub fleet_store: Option<(walrelay_archive::Store, std::path::PathBuf)>,
    /// Largest export (the SQL text, held in memory while it is built and
    /// while its link lives); a larger one is refused with 413.
    pub max_export_bytes: usize,
    /// Largest import body (the SQL file); a larger one is refused with
    /// 413 before it is read.
    pub max_import_bytes: usize,
    /// Most HTTP connections open at once; one more is answered 503 and
    /// closed (see `listen`).
    pub max_connections: usize,
    /// A connection waiting this long for a request head (idle between
    /// requests, or sending one slowly), for the next part of a request
    /// body, or for the client to take any of its answer is closed.
    pub idle_timeout_ms: u64,
}

/// [`HttpConfig::max_connections`] by default: well under the usual
/// descriptor limit, with room for the node's databases and replication
/// sockets (a fleet node's open-database cap keeps this many descriptors
/// aside).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1_000;

impl HttpConfig {
    /// [`HttpConfig::idle_timeout_ms`] as a duration.
    pub fn idle_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.idle_timeout_ms)
    }
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
            fleet_store: None,
            max_export_bytes: 64 << 20,
            max_import_bytes: 32 << 20,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            // Longer than clients keep an idle connection pooled (ureq 15
            // s, browsers and proxies similar), short enough that idle
            // and slow connections do not pile up.
            idle_timeout_ms: 30_000,
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
    /// The time-travel state of fleet databases served here (their
    /// restore limits), at most [`super::time_travel::MAX_FLEET_STATES`].
    fleet_time_travel: parking_lot::Mutex<
        std::collections::HashMap<
            walrelay_replicator::DatabaseId,
            Arc<super::time_travel::TimeTravel>,
        >,
    >,
    /// The fleet's databases and control plane (None: this node serves
    /// only its own database).
    fleet: Option<Arc<crate::fleet::Fleet>>,
    /// Exports and uploads in flight ([`super::transfer`]).
    transfers: super::transfer::Transfers,
}

/// An authenticated caller: what its statements may do, and the
/// credentials a forwarded request carries on. Only [`Node::authorize`]
/// makes one.
#[derive(Clone)]
pub struct Caller {
    access: Access,
    pub(super) authorization: Option<String>,
    /// The request came from a replica forwarding it.
    pub(super) forwarded: bool,
}

/// A database a request named, resolved by [`Node::resolve_database`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The database's name: what tokens are scoped to, and what a
    /// replica's forwarded request names on the primary.
    pub name: String,
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
            transfers: super::transfer::Transfers::default(),
            config,
            fleet: None,
            fleet_time_travel: parking_lot::Mutex::new(std::collections::HashMap::new()),
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

    /// The database `name_or_id` names: the `{name}` of a `/v1` path or
    /// the `{database_id}` of a Cloudflare path. All name-to-database
    /// resolution goes through here. Today a node serves one database,
    /// [`HttpConfig::database`], by that name; an unknown one is a 404
    /// (code 7404).
    pub fn resolve_database(&self, name_or_id: &str) -> Result<Resolved, Answer> {
        if name_or_id == self.config.database && !matches!(self.role, Role::Fleet) {
            Ok(Resolved {
                name: self.config.database.clone(),
            })
        } else if self.fleet.is_some() {
            // The fleet's databases are found through its routing table
            // when the request runs ([`super::fleet_query`]).
            Ok(Resolved {
                name: name_or_id.to_string(),
            })
        } else {
            Err(Answer::error(
                404,
                codes::UNKNOWN_DATABASE,
                format!("unknown database {name_or_id:?}"),
            ))
        }
    }

    /// Authenticates a request for the database `name_or_id` names (its
    /// token must grant that database), then resolves it. A caller the
    /// token does not admit learns nothing about which databases exist.
    pub fn authorize_database(
        &self,
        authorization: Option<&[u8]>,
        name_or_id: &str,
    ) -> Result<(Caller, Resolved), Answer> {
        let target = self
            .resolve_database(name_or_id)
            .map_or_else(|_| name_or_id.to_string(), |r| r.name);
        // A fleet database's token may name it by name or by uuid, and
        // reaches it whichever the path uses (its routing entry pairs them).
        let other_name = self.fleet.as_ref().and_then(|fleet| {
            let route = fleet.route(&target, &fleet.config.default_account).ok()?;
            [route.uuid, route.name].into_iter().find(|n| *n != target)
        });
        let caller = match (
            self.auth.check(authorization, Target::Database(&target)),
            other_name,
        ) {
            (Err(_), Some(other))
                if self
                    .auth
                    .check(authorization, Target::Database(&other))
                    .is_ok() =>
            {
                self.authorize(authorization, Target::Database(&other))?
            }
            _ => self.authorize(authorization, Target::Database(&target))?,
        };
        let resolved = self
            .resolve_database(name_or_id)
            .map_err(|a| self.refuse(a))?;
        Ok((caller, resolved))
    }

    pub(super) fn config(&self) -> &HttpConfig {
        &self.config
    }

    pub(super) fn time_travel_state(&self) -> Option<&super::time_travel::TimeTravel> {
        self.time_travel.as_ref()
    }

    /// The time-travel state of the fleet database `id` (None: this node
    /// has no store for the fleet).
    pub(super) fn fleet_time_travel(
        &self,
        id: walrelay_replicator::DatabaseId,
    ) -> Option<Arc<super::time_travel::TimeTravel>> {
        let (store, work) = self.config.fleet_store.as_ref()?;
        let mut states = self.fleet_time_travel.lock();
        if let Some(tt) = states.get(&id) {
            return Some(Arc::clone(tt));
        }
        if states.len() >= super::time_travel::MAX_FLEET_STATES {
            // Forgetting one costs only its restore-rate history.
            if let Some(k) = states.keys().next().copied() {
                states.remove(&k);
            }
        }
        let tt = Arc::new(super::time_travel::TimeTravel::new(
            super::time_travel::TimeTravelConfig {
                store: store.clone(),
                database: id,
                work_dir: work.join(id.to_string()),
                archive_wait_ms: 30_000,
            },
        ));
        states.insert(id, Arc::clone(&tt));
        Some(tt)
    }

    pub(super) fn transfers(&self) -> &super::transfer::Transfers {
        &self.transfers
    }

    /// The database `name` (resolved) as this node holds it: the
    /// primary's, the replica's copy, or a fleet database hosted here.
    pub(super) fn local_database(&self, name: &str) -> Result<LocalDb<'_>, Answer> {
        if self.is_fleet_name(name) {
            return match self.hosted_database(name) {
                Ok(open) => Ok(LocalDb::Fleet(open)),
                Err(a) if a.status == 421 => match self.replica_database(name) {
                    Some(r) => Ok(LocalDb::FleetReplica(r)),
                    None => Err(a),
                },
                Err(a) => Err(a),
            };
        }
        Ok(LocalDb::Main(match &self.role {
            Role::Primary(db) => db,
            Role::Replica { replica, .. } => replica.replica().database(),
            Role::Fleet => unreachable!("every name is the fleet's on a fleet node"),
        }))
    }

    /// The primary of `name` on this node, if it has it here: `main`'s on a
    /// primary, or a fleet database hosted here (None: a replica's `main`).
    pub(super) fn writable_database(&self, name: &str) -> Result<Option<LocalDb<'_>>, Answer> {
        if self.is_fleet_name(name) {
            return self.hosted_database(name).map(|o| Some(LocalDb::Fleet(o)));
        }
        Ok(self.primary_database().map(LocalDb::Main))
    }

    /// Whether `name` is one of the fleet's databases rather than this
    /// node's own.
    pub(super) fn is_fleet_name(&self, name: &str) -> bool {
        self.fleet.is_some() && (name != self.config.database || matches!(self.role, Role::Fleet))
    }

    /// Forwards `payload` to another endpoint of the primary (`path`),
    /// with the caller's credentials; `reason` labels the metric.
    pub(super) fn forward_payload(
        &self,
        caller: &Caller,
        name: &str,
        path: &str,
        payload: &[u8],
        reason: &'static str,
    ) -> Answer {
        let Some(primaries) = &self.primaries else {
            return Answer::error(503, codes::UNAVAILABLE, "no primary is known");
        };
        self.metrics.forwarded(reason);
        let request = super::client::Request {
            database: name,
            bookmark: None,
            authorization: caller.authorization.as_deref(),
            payload,
            forwarded: true,
            path: Some(path),
        };
        super::forward::answer(primaries.post(&self.agent, &request, 1 << 20))
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

    /// Counts a refusal made before the request reached [`Node::query`]
    /// (the framework layer), and passes it through.
    pub(super) fn refuse(&self, answer: Answer) -> Answer {
        log_refusal(&answer);
        self.metrics.refused(answer.status);
        answer
    }

    /// Counts a refusal logged elsewhere, once for many (a connection past
    /// the limit: `listen` warns when the limit is first reached, not for
    /// each refused connection, which would let a flood flood the log).
    pub(super) fn count_refusal(&self, status: u16) {
        self.metrics.refused(status);
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
        if let Some(db) = self.primary_database() {
            text.push_str(&super::metrics::Metrics::render_group_commit(
                self.role_name(),
                &self.config.region,
                &db.group_commit_stats(),
            ));
        }
        if let Some(fleet) = &self.fleet {
            text.push_str(&fleet.metrics_text());
        }
        text
    }
}
