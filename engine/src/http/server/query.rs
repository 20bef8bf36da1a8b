//! The query path: `/query` and `/raw` on this node, from a request's
//! bytes to its answer. A request is prepared (database, bookmark
//! constraint, parsed body), then dispatched: run here, on a fleet
//! database, or forwarded to the primary. On a primary a single plain DML
//! write may instead be waited for by its task
//! ([`Node::write_without_thread`]).

use super::{Caller, Node, Role};
use crate::database::Database;
use crate::error::{QueryError, SessionError};
use crate::execution::CancelToken;
use crate::http::answer::{Answer, codes, log_refusal, query_error, retry_after_s, too_large};
use crate::http::api::{self, Body, Shape};
use crate::session::{Access, Constraint, RawResult, Session};
use std::future::Future;
use std::sync::Arc;

/// A query request read but not yet run ([`Node::prepare_query`]).
pub(in crate::http) struct PreparedQuery {
    name: String,
    /// The database is one of the fleet's.
    fleet: bool,
    constraint: Constraint,
    parsed: Body,
}

impl Node {
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

    /// Handles `POST /v1/databases/{name}/raw`: as [`Node::query`], rows
    /// as arrays.
    pub fn raw(
        &self,
        caller: &Caller,
        name: &str,
        bookmark_header: Option<&str>,
        body: &[u8],
    ) -> Answer {
        self.query_shaped(
            caller,
            name,
            bookmark_header,
            body,
            Shape::Arrays,
            &self.request_token(),
        )
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
        self.query_shaped(caller, name, bookmark_header, body, Shape::Objects, cancel)
    }

    /// [`Node::query_cancellable`] answering in `shape`.
    pub fn query_shaped(
        &self,
        caller: &Caller,
        name: &str,
        bookmark_header: Option<&str>,
        body: &[u8],
        shape: Shape,
        cancel: &CancelToken,
    ) -> Answer {
        let answer = match self.prepare_query(name, bookmark_header, body) {
            Ok(q) => self.dispatch(caller, &q, bookmark_header, body, shape, cancel),
            Err(a) => a,
        };
        self.finish_query(answer)
    }

    /// Counts a query's answer in the metrics (and logs a refusal).
    pub(in crate::http) fn finish_query(&self, answer: Answer) -> Answer {
        if answer.status >= 400 {
            log_refusal(&answer);
            self.metrics.refused(answer.status);
        } else if let Some(served) = &answer.served {
            for (by_primary, region) in served {
                self.metrics.served(*by_primary, region);
            }
        } else if let Ok(r) =
            serde_json::from_slice::<api::Envelope<Vec<api::MetaOnlyJson>>>(&answer.body)
        {
            for res in &r.result {
                self.metrics
                    .served(res.meta.served_by_primary, &res.meta.served_by_region);
            }
        }
        answer
    }

    /// What a query request says, read without running anything: its
    /// database, bookmark constraint and parsed body. An `Err` is the
    /// answer (400, 404, 413).
    pub(in crate::http) fn prepare_query(
        &self,
        name: &str,
        header: Option<&str>,
        body: &[u8],
    ) -> Result<PreparedQuery, Answer> {
        let name = self.resolve_database(name)?.name;
        let fleet = self.is_fleet_name(&name);
        if body.len() > self.config.max_body_bytes {
            return Err(Answer::error(
                413,
                codes::TOO_LARGE,
                too_large(self.config.max_body_bytes),
            ));
        }
        let constraint = match header.map(str::parse::<Constraint>).transpose() {
            Ok(c) => c.unwrap_or(Constraint::FirstUnconstrained),
            Err(e) => return Err(Answer::error(400, codes::BOOKMARK, e.to_string())),
        };
        let parsed = match api::parse_body(body) {
            Ok(b) => b,
            Err(e) => return Err(Answer::error(400, codes::BAD_REQUEST, e.to_string())),
        };
        Ok(PreparedQuery {
            name,
            fleet,
            constraint,
            parsed,
        })
    }

    /// Runs a prepared query where it belongs: here, on a fleet
    /// database, or on the primary (forwarded). `header` and `body` are
    /// the request's own, for the fleet and forwarding.
    pub(in crate::http) fn dispatch(
        &self,
        caller: &Caller,
        q: &PreparedQuery,
        header: Option<&str>,
        body: &[u8],
        shape: Shape,
        cancel: &CancelToken,
    ) -> Answer {
        let (name, constraint, parsed) = (q.name.as_str(), q.constraint, &q.parsed);
        let fleet_database = q.fleet;
        if fleet_database {
            let request = crate::http::fleet_query::FleetRequest {
                header,
                raw_body: body,
                constraint,
                body: parsed,
                shape,
            };
            return self.fleet_query(caller, name, &request, cancel);
        }
        match &self.role {
            // Every name is the fleet's on a fleet node (handled above).
            Role::Fleet => Answer::error(404, codes::UNKNOWN_DATABASE, "unknown database"),
            Role::Primary(db) => self
                .run(db, caller, constraint, parsed, shape, cancel)
                .into_answer(),
            Role::Replica { replica, .. } => {
                if caller.forwarded {
                    // Sent here as the primary by a replica that believes
                    // this node leads (a failover moved it): whatever the
                    // request, it was meant for the primary, so say this
                    // is not it and the sender tries the next node.
                    return crate::http::forward::not_primary();
                }
                let forward = |reason| self.forward(caller, name, header, body, shape, reason);
                if constraint == Constraint::FirstPrimary {
                    return forward("first-primary");
                }
                if matches!(parsed, Body::Batch(_)) {
                    // An atomic batch runs where writes run.
                    return forward("batch");
                }
                match self.run_on_replica(
                    replica.replica().database(),
                    caller,
                    constraint,
                    parsed,
                    shape,
                    cancel,
                ) {
                    Ok(a) => a,
                    Err(Forward::Write) => forward("write"),
                    Err(Forward::Behind) => forward("behind"),
                }
            }
        }
    }

    /// The answer to a prepared query that is one plain DML write on this
    /// primary's own database, waited for by the calling task instead of
    /// a blocking thread ([`crate::group_write_async`]); `None` declines,
    /// having changed nothing, and the caller dispatches it as usual.
    pub(in crate::http) fn write_without_thread(
        self: &Arc<Self>,
        caller: &Caller,
        q: &PreparedQuery,
        shape: Shape,
        cancel: &CancelToken,
    ) -> Option<impl Future<Output = Answer> + Send + use<>> {
        let (Role::Primary(db), false, Body::One(statement)) = (&self.role, q.fleet, &q.parsed)
        else {
            return None;
        };
        let session = db
            .session(q.constraint)
            .ok()?
            .with_access(caller.access)
            .cancel_with(cancel.clone());
        let session = Arc::new(session);
        let write = Arc::clone(&session).exec_without_thread(&statement.sql, &statement.params)?;
        let node = Arc::clone(self);
        Some(async move {
            let result = write.await;
            let answer = node.routed(&session, result, shape).into_answer();
            node.finish_query(answer)
        })
    }

    /// The answer to a prepared query that is one short read on this
    /// node's own database, run here on the calling thread (over HTTP, the
    /// async worker) under a small budget ([`crate::read_on_worker`]), and
    /// on a primary waited for at the output gate by the returned future;
    /// `None` declines, having changed nothing, and the caller dispatches
    /// it as usual.
    pub(in crate::http) fn read_without_thread(
        self: &Arc<Self>,
        caller: &Caller,
        q: &PreparedQuery,
        shape: Shape,
        cancel: &CancelToken,
    ) -> Option<impl Future<Output = Answer> + Send + use<>> {
        let (false, Body::One(statement)) = (q.fleet, &q.parsed) else {
            return None;
        };
        let db = match &self.role {
            Role::Primary(db) => db,
            Role::Replica { replica, .. } => {
                if caller.forwarded || q.constraint == Constraint::FirstPrimary {
                    return None;
                }
                replica.replica().database()
            }
            Role::Fleet => return None,
        };
        let session = db
            .session(q.constraint)
            .ok()?
            .with_access(caller.access)
            .cancel_with(cancel.clone());
        let session = Arc::new(session);
        let read = Arc::clone(&session).exec_on_worker(&statement.sql, &statement.params);
        self.metrics.read_on_worker(read.is_some());
        let read = read?;
        let node = Arc::clone(self);
        Some(async move {
            let result = read.await;
            let answer = node.routed(&session, result, shape).into_answer();
            node.finish_query(answer)
        })
    }

    fn run(
        &self,
        db: &Database,
        caller: &Caller,
        constraint: Constraint,
        body: &Body,
        shape: Shape,
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
        self.routed(&session, result, shape)
    }

    /// A primary's or replica's answer to what a session ran.
    fn routed(
        &self,
        session: &Session,
        result: Result<Vec<RawResult>, QueryError>,
        shape: Shape,
    ) -> Routed {
        let bookmark = session.bookmark().map(|b| b.to_string());
        match result {
            Ok(results) => {
                let mut a = Answer::results(200, bookmark, &results, shape);
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
    pub(in crate::http) fn run_on(
        &self,
        db: &Database,
        caller: &Caller,
        constraint: Constraint,
        body: &Body,
        shape: Shape,
        cancel: &CancelToken,
    ) -> Answer {
        self.run(db, caller, constraint, body, shape, cancel)
            .into_answer()
    }

    /// Runs a body on a read replica, or says why it belongs on the
    /// primary (a write, or a bookmark the replica did not reach in its
    /// wait). A read-only caller's write is refused here: the primary
    /// would refuse it too.
    pub(in crate::http) fn run_on_replica(
        &self,
        db: &Database,
        caller: &Caller,
        constraint: Constraint,
        body: &Body,
        shape: Shape,
        cancel: &CancelToken,
    ) -> Result<Answer, Forward> {
        match self.run(db, caller, constraint, body, shape, cancel) {
            Routed::Done(a) => Ok(a),
            Routed::Forward(Forward::Write) if caller.access == Access::ReadOnly => {
                let e = QueryError::ReadOnlyAccess;
                let (status, code) = query_error(&e);
                Ok(Answer::error(status, code, e.to_string()))
            }
            Routed::Forward(f) => Err(f),
        }
    }

    fn forward(
        &self,
        caller: &Caller,
        name: &str,
        header: Option<&str>,
        body: &[u8],
        shape: Shape,
        reason: &'static str,
    ) -> Answer {
        let Some(primaries) = &self.primaries else {
            return Answer::error(503, codes::UNAVAILABLE, "no primary is known");
        };
        self.metrics.forwarded(reason);
        let raw_path = format!("/v1/databases/{name}/raw");
        let request = crate::http::client::Request {
            database: name,
            bookmark: header,
            authorization: caller.authorization.as_deref(),
            payload: body,
            forwarded: true,
            path: match shape {
                Shape::Objects => None,
                Shape::Arrays => Some(&raw_path),
            },
        };
        crate::http::forward::answer(primaries.post(&self.agent, &request, 64 << 20))
    }
}

/// Why a replica hands a request to the primary.
pub(in crate::http) enum Forward {
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

fn run_body(session: &Session, body: &Body) -> Result<Vec<RawResult>, QueryError> {
    match body {
        Body::One(s) => session.exec(&s.sql, s.params.iter().cloned()),
        Body::Batch(ss) => session.batch_raw(ss.iter().map(|s| {
            session
                .prepare(s.sql.clone())
                .bind(s.params.iter().cloned())
        })),
    }
}
