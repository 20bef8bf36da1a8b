//! Time travel, in D1's API shape: which bookmark a time names, and
//! restoring the database in place to a bookmark or time.
//!
//! A restore runs on the primary (a replica forwards it, as it forwards
//! writes): the database at the target is rebuilt from cold storage into
//! a scratch file, then copied over the live database as one new
//! transaction that replicas follow like any other write. The answer
//! names that transaction's bookmark and the one before it, so a restore
//! can itself be undone. Like D1, at most [`RESTORES_PER_WINDOW`] restores
//! per [`RESTORE_WINDOW`] per database.
//!
//! Cold storage lags the primary by the upload bound (about 10 s): a
//! target the store does not hold yet is waited for, up to
//! `archive_wait_ms`, then refused with 503 and `Retry-After`.

use super::answer::respond;
use super::api::{TimeTravelResponse, TimeTravelResult};
use super::auth::Target;
use super::server::{Answer, Caller, Node, codes};
use axum::extract::{Path, RawQuery, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::IntoResponse;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_archive::{Archive, Manifest, NoProgress, RestoreError, Store};
use walrelay_replicator::{Bookmark, DatabaseId};

/// D1's limit: restores per window per database.
pub const RESTORES_PER_WINDOW: usize = 10;
pub const RESTORE_WINDOW: Duration = Duration::from_secs(600);

/// Most fleet databases whose time-travel state a node keeps at once.
pub const MAX_FLEET_STATES: usize = 4_096;

/// Where a node finds its database's history.
#[derive(Debug, Clone)]
pub struct TimeTravelConfig {
    pub store: Store,
    pub database: DatabaseId,
    /// Scratch space for the restored image (one database's size).
    pub work_dir: PathBuf,
    /// How long a request waits for cold storage to reach its target.
    pub archive_wait_ms: u64,
}

/// A node's time-travel state: its configuration and the restore limit.
#[derive(Debug)]
pub struct TimeTravel {
    config: TimeTravelConfig,
    restores: Mutex<VecDeque<Instant>>,
}

/// What a request asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    Bookmark(Bookmark),
    /// µs since the Unix epoch.
    Time(u64),
}

/// `2026-11-30T18:00:00Z` (any RFC 3339 offset) or Unix seconds, as µs.
pub fn parse_timestamp_us(s: &str) -> Result<u64, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = s.parse().map_err(|e| format!("{e}"))?;
        return secs
            .checked_mul(1_000_000)
            .ok_or_else(|| "timestamp out of range".to_string());
    }
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .map_err(|e| format!("not RFC 3339 or Unix seconds: {e}"))?;
    u64::try_from(t.timestamp_micros()).map_err(|_| "timestamp before 1970".to_string())
}

/// The point a query string names: exactly one of `bookmark=` and
/// `timestamp=` (a restore), or `timestamp=` alone (a lookup).
pub fn parse_point(query: &str, bookmark_allowed: bool) -> Result<Point, String> {
    let mut point = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or("a parameter is not valid percent-encoding")?;
        let p = match k {
            "bookmark" if bookmark_allowed => Point::Bookmark(
                v.parse()
                    .map_err(|e| format!("bookmark {v:?} is not valid: {e}"))?,
            ),
            "timestamp" => Point::Time(parse_timestamp_us(&v)?),
            _ => return Err(format!("unknown parameter {k:?}")),
        };
        if point.replace(p).is_some() {
            return Err("give exactly one of bookmark= and timestamp=".into());
        }
    }
    point.ok_or_else(|| {
        if bookmark_allowed {
            "give bookmark= or timestamp=".to_string()
        } else {
            "give timestamp=".to_string()
        }
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn ok(result: TimeTravelResult) -> Answer {
    Answer::raw_json(
        200,
        serde_json::to_vec(&TimeTravelResponse::ok(result)).unwrap_or_default(),
    )
}

fn store_error(e: &RestoreError) -> Answer {
    match e {
        RestoreError::NotArchived { .. } => {
            Answer::error(503, codes::UNAVAILABLE, e.to_string()).retry_after(5)
        }
        RestoreError::BeforeRetention { .. }
        | RestoreError::NotInHistory { .. }
        | RestoreError::TimeOutOfRange { .. } => Answer::error(400, codes::BOOKMARK, e.to_string()),
        RestoreError::NoManifest => Answer::error(
            404,
            codes::UNKNOWN_DATABASE,
            "no history of this database in cold storage yet",
        ),
        _ => Answer::error(500, codes::INTERNAL, e.to_string()),
    }
}

impl TimeTravel {
    pub fn new(config: TimeTravelConfig) -> TimeTravel {
        TimeTravel {
            config,
            restores: Mutex::new(VecDeque::new()),
        }
    }

    fn archive(&self) -> Archive {
        Archive::new(self.config.store.clone(), self.config.database)
    }

    /// The manifest once it covers `need` (or the wait runs out: then the
    /// newest one).
    fn manifest_covering(
        &self,
        need: impl Fn(&Manifest) -> bool,
    ) -> Result<Manifest, RestoreError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.archive_wait_ms);
        loop {
            let m = self.archive().manifest();
            match &m {
                Ok(m) if need(m) => return Ok(m.clone()),
                Ok(_) | Err(RestoreError::NoManifest) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                _ => return m,
            }
        }
    }

    /// The bookmark `point` names, once the store holds it. `current` is
    /// the database's newest bookmark (a time after the store's end needs
    /// the store to reach it).
    fn resolve(
        &self,
        point: Point,
        current: Bookmark,
    ) -> Result<(Manifest, Bookmark), RestoreError> {
        let m = match point {
            Point::Bookmark(b) => self.manifest_covering(|m| m.log_end >= b)?,
            Point::Time(t) => {
                self.manifest_covering(|m| m.log_end >= current || m.log_end_us >= t)?
            }
        };
        let at = match point {
            Point::Bookmark(b) => b,
            Point::Time(t) => self.archive().bookmark_at_time(&m, t)?,
        };
        Ok((m, at))
    }

    fn admit_restore(&self) -> bool {
        let mut q = self.restores.lock();
        let now = Instant::now();
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) > RESTORE_WINDOW)
        {
            q.pop_front();
        }
        if q.len() >= RESTORES_PER_WINDOW {
            return false;
        }
        q.push_back(now);
        true
    }
}

impl TimeTravel {
    /// Cold storage's gauges, from its manifest, for `/metrics`: how far
    /// the archive is behind the primary (`current`), and its snapshots.
    pub fn metrics_text(&self, current: Bookmark) -> String {
        let m = match self.archive().manifest() {
            Ok(m) => m,
            Err(RestoreError::NoManifest) => {
                walrelay_archive::Manifest::empty(self.config.database)
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: reading the cold store's manifest");
                return "# cold storage unreadable\nwalrelay_archive_up 0\n".into();
            }
        };
        let now_us = walrelay_archive::archiver::now_us();
        let behind = current > m.log_end;
        let lag_transactions = if !behind {
            0
        } else if current.epoch == m.log_end.epoch {
            current.sequence.0 - m.log_end.sequence.0
        } else {
            current.sequence.0
        };
        let lag_ms = if behind {
            now_us.saturating_sub(m.log_end_us) / 1000
        } else {
            0
        };
        let newest_snapshot_age_ms = m
            .snapshots
            .last()
            .map_or(0, |s| now_us.saturating_sub(s.commit_us) / 1000);
        format!(
            "# HELP walrelay_archive_up Whether the cold store's manifest was readable.\n\
             # TYPE walrelay_archive_up gauge\nwalrelay_archive_up 1\n\
             # HELP walrelay_archive_lag_ms How long the newest unarchived commit has waited (0 when all is archived).\n\
             # TYPE walrelay_archive_lag_ms gauge\nwalrelay_archive_lag_ms {lag_ms}\n\
             # HELP walrelay_archive_lag_transactions Commits of the primary not yet in cold storage.\n\
             # TYPE walrelay_archive_lag_transactions gauge\nwalrelay_archive_lag_transactions {lag_transactions}\n\
             # HELP walrelay_archive_log_bytes_since_snapshot Record bytes archived after the newest snapshot.\n\
             # TYPE walrelay_archive_log_bytes_since_snapshot gauge\nwalrelay_archive_log_bytes_since_snapshot {}\n\
             # HELP walrelay_archive_snapshots Snapshots the store retains.\n\
             # TYPE walrelay_archive_snapshots gauge\nwalrelay_archive_snapshots {}\n\
             # HELP walrelay_archive_newest_snapshot_age_ms Age of the newest snapshot's commit.\n\
             # TYPE walrelay_archive_newest_snapshot_age_ms gauge\nwalrelay_archive_newest_snapshot_age_ms {newest_snapshot_age_ms}\n",
            m.since_snapshot_bytes,
            m.snapshots.len(),
        )
    }
}

impl Node {
    /// `GET|POST /v1/databases/{name}/time_travel/bookmark?timestamp=`.
    pub fn time_travel_bookmark(&self, caller: &Caller, name: &str, query: &str) -> Answer {
        if let Some(a) = self.time_travel_precheck(caller, name, query, "bookmark", false) {
            return a;
        }
        let target = match self.time_travel_target(name) {
            Ok(t) => t,
            Err(a) => return self.refuse(a),
        };
        let (tt, db) = target.parts();
        let point = match parse_point(query, false) {
            Ok(p) => p,
            Err(why) => return self.refuse(Answer::error(400, codes::BAD_REQUEST, why)),
        };
        match tt.resolve(point, db.latest_bookmark()) {
            Ok((_, at)) => ok(TimeTravelResult {
                bookmark: at.to_string(),
                previous_bookmark: None,
                message: None,
            }),
            Err(e) => self.refuse(store_error(&e)),
        }
    }

    /// `POST /v1/databases/{name}/time_travel/restore?bookmark=|timestamp=`.
    pub fn time_travel_restore(&self, caller: &Caller, name: &str, query: &str) -> Answer {
        if let Some(a) = self.time_travel_precheck(caller, name, query, "restore", true) {
            return a;
        }
        let target = match self.time_travel_target(name) {
            Ok(t) => t,
            Err(a) => return self.refuse(a),
        };
        let (tt, db) = target.parts();
        if !caller.may_write() {
            return self.refuse(Answer::error(
                403,
                codes::AUTH,
                "a restore needs a read-write token",
            ));
        }
        let point = match parse_point(query, true) {
            Ok(p) => p,
            Err(why) => return self.refuse(Answer::error(400, codes::BAD_REQUEST, why)),
        };
        if !tt.admit_restore() {
            let a = Answer::error(
                429,
                codes::UNAVAILABLE,
                format!(
                    "at most {RESTORES_PER_WINDOW} restores per {} minutes per database",
                    RESTORE_WINDOW.as_secs() / 60
                ),
            )
            .retry_after(60);
            return self.refuse(a);
        }
        let previous = db.latest_bookmark();
        if let Point::Bookmark(b) = point
            && b > previous
        {
            return self.refuse(Answer::error(
                400,
                codes::BOOKMARK,
                format!("bookmark {b} is after the database's newest ({previous})"),
            ));
        }
        let (m, at) = match tt.resolve(point, previous) {
            Ok(r) => r,
            Err(e) => return self.refuse(store_error(&e)),
        };
        if at > previous {
            return self.refuse(Answer::error(
                400,
                codes::BOOKMARK,
                format!("bookmark {at} is after the database's newest ({previous})"),
            ));
        }
        if let Err(e) = std::fs::create_dir_all(&tt.config.work_dir) {
            return self.refuse(Answer::error(500, codes::INTERNAL, e.to_string()));
        }
        let image = tt.config.work_dir.join("time-travel.db");
        let restored =
            walrelay_archive::restore_to_file(&tt.archive(), &m, at, &image, &NoProgress);
        let answer = match restored {
            Err(e) => self.refuse(store_error(&e)),
            Ok(_) => match db.restore_in_place(&image) {
                Ok(bookmark) => {
                    tracing::info!(database = name, to = %at, %previous, %bookmark, "time travel: restored");
                    ok(TimeTravelResult {
                        bookmark: bookmark.to_string(),
                        previous_bookmark: Some(previous.to_string()),
                        message: Some(format!("database restored to {at}")),
                    })
                }
                Err(e) => self.refuse(Answer::error(503, codes::UNAVAILABLE, e.to_string())),
            },
        };
        // The image is closed: its files go, its lock file too.
        for p in walrelay_vfs::closed_replica_files(&image) {
            let _ = std::fs::remove_file(p);
        }
        answer
    }

    /// Forwards from a replica, refuses a node without cold storage; None
    /// when this node should answer itself.
    fn time_travel_precheck(
        &self,
        caller: &Caller,
        name: &str,
        query: &str,
        what: &str,
        write: bool,
    ) -> Option<Answer> {
        if let Err(a) = self.resolve_database(name) {
            return Some(self.refuse(a));
        }
        if self.is_fleet_name(name) {
            // A fleet database's host answers (`time_travel_target`).
            return self.pass_to_host(caller, name, &format!("/time_travel/{what}?{query}"));
        }
        if self.primary_database().is_none() {
            let path = format!("/v1/databases/{name}/time_travel/{what}?{query}");
            return Some(self.forward_path(caller, name, &path, write));
        }
        if self.time_travel_state().is_none() {
            return Some(self.refuse(Answer::error(
                501,
                codes::UNAVAILABLE,
                "time travel needs cold storage: start the node with --store",
            )));
        }
        None
    }
}

/// The time-travel state and database behind `name`: the node's own, or
/// a fleet database hosted here (held open while the request runs).
enum TimeTravelTarget<'a> {
    Main(&'a TimeTravel, &'a crate::Database),
    Fleet(
        std::sync::Arc<TimeTravel>,
        std::sync::Arc<crate::fleet::host::OpenDb>,
    ),
}

impl TimeTravelTarget<'_> {
    fn parts(&self) -> (&TimeTravel, &crate::Database) {
        match self {
            TimeTravelTarget::Main(tt, db) => (tt, db),
            TimeTravelTarget::Fleet(tt, open) => (tt, open.database()),
        }
    }
}

impl Node {
    fn time_travel_target(&self, name: &str) -> Result<TimeTravelTarget<'_>, Answer> {
        if self.is_fleet_name(name) {
            let open = self.hosted_database(name)?;
            let tt = self.fleet_time_travel(open.id()).ok_or_else(|| {
                Answer::error(
                    501,
                    codes::UNAVAILABLE,
                    "time travel needs cold storage: start the node with --store",
                )
            })?;
            return Ok(TimeTravelTarget::Fleet(tt, open));
        }
        match (self.time_travel_state(), self.primary_database()) {
            (Some(tt), Some(db)) => Ok(TimeTravelTarget::Main(tt, db)),
            _ => Err(Answer::error(500, codes::INTERNAL, "no primary")),
        }
    }
}

/// Which time-travel endpoint.
#[derive(Clone, Copy)]
enum Endpoint {
    Bookmark,
    Restore,
}

async fn route(
    node: Arc<Node>,
    name: String,
    query: Option<String>,
    headers: HeaderMap,
    endpoint: Endpoint,
) -> impl IntoResponse {
    let authorization = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes);
    let mut caller = match node.authorize(authorization, Target::Database(&name)) {
        Ok(c) => c,
        Err(answer) => return respond(answer),
    };
    caller.set_forwarded(headers.contains_key(super::forward::FORWARDED_HEADER));
    let query = query.unwrap_or_default();
    // Cold storage and SQLite block: run on the blocking pool.
    let n = Arc::clone(&node);
    let answer = tokio::task::spawn_blocking(move || match endpoint {
        Endpoint::Bookmark => n.time_travel_bookmark(&caller, &name, &query),
        Endpoint::Restore => n.time_travel_restore(&caller, &name, &query),
    })
    .await
    .unwrap_or_else(|e| Answer::error(500, codes::INTERNAL, format!("the request failed: {e}")));
    respond(answer)
}

/// `GET|POST /v1/databases/{name}/time_travel/bookmark`.
pub(super) async fn bookmark_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> impl IntoResponse {
    route(node, name, query, headers, Endpoint::Bookmark).await
}

/// `POST /v1/databases/{name}/time_travel/restore`.
pub(super) async fn restore_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> impl IntoResponse {
    route(node, name, query, headers, Endpoint::Restore).await
}
