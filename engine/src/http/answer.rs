//! What a node answers: the status, bookmark and body of a response, the
//! D1-style error codes, and how query errors map to them.

use super::api::{BOOKMARK_HEADER, Response};
use crate::error::QueryError;
use axum::http::header::WWW_AUTHENTICATE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};

/// D1-style error codes, one per family.
pub mod codes {
    pub const BAD_REQUEST: u32 = 7400;
    pub const BOOKMARK: u32 = 7401;
    pub const UNKNOWN_DATABASE: u32 = 7404;
    pub const TIMEOUT: u32 = 7408;
    pub const TOO_LARGE: u32 = 7413;
    pub const RESPONSE_TOO_LARGE: u32 = 7414;
    pub const SQL: u32 = 7500;
    /// An account limit (storage, daily rows) refused the query.
    pub const LIMIT: u32 = 7429;
    pub const UNAVAILABLE: u32 = 7503;
    pub const INTERNAL: u32 = 7000;
    /// Missing or invalid credentials (401), or a token that does not
    /// grant the request (403): Cloudflare's "Authentication error".
    pub const AUTH: u32 = 10000;
}

/// An answer: status, the session's bookmark, the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub bookmark: Option<String>,
    pub body: Vec<u8>,
    /// Where each result was served, when answered here (a relayed answer
    /// is read back from its body instead).
    pub(super) served: Option<Vec<(bool, String)>>,
    /// Seconds for a `Retry-After` header (a 503 the client should retry).
    pub retry_after_s: Option<u32>,
    /// Rows read and written by the statements answered here (the
    /// fleet's usage events).
    pub(super) usage: Option<(u64, u64)>,
}

impl Answer {
    pub(super) fn json(status: u16, bookmark: Option<String>, r: &Response) -> Answer {
        Answer {
            status,
            bookmark,
            body: serde_json::to_vec(r).unwrap_or_default(),
            served: Some(
                r.result
                    .iter()
                    .map(|res| {
                        (
                            res.meta.served_by_primary,
                            res.meta.served_by_region.clone(),
                        )
                    })
                    .collect(),
            ),
            retry_after_s: None,
            usage: None,
        }
    }
    /// A successful query's answer, rows laid out in `shape`.
    pub(super) fn results(
        status: u16,
        bookmark: Option<String>,
        results: &[crate::session::RawResult],
        shape: super::api::Shape,
    ) -> Answer {
        Answer {
            status,
            bookmark,
            body: super::api::encode_results(results, shape),
            served: Some(
                results
                    .iter()
                    .map(|r| (r.meta.served_by_primary, r.meta.served_by_region.clone()))
                    .collect(),
            ),
            retry_after_s: None,
            usage: None,
        }
    }

    /// A relayed answer, as the primary sent it.
    pub(crate) fn relayed(raw: super::client::RawAnswer) -> Answer {
        Answer {
            status: raw.status,
            bookmark: raw.bookmark,
            body: raw.body,
            served: None,
            retry_after_s: raw.retry_after_s,
            usage: None,
        }
    }

    pub(crate) fn error(status: u16, code: u32, message: impl Into<String>) -> Answer {
        Answer::json(status, None, &Response::error(code, message))
    }

    /// The same answer, telling the client when to try again
    /// (`Retry-After`, in seconds).
    pub(crate) fn retry_after(mut self, seconds: u32) -> Answer {
        self.retry_after_s = Some(seconds);
        self
    }

    /// An answer with a body encoded elsewhere (time travel's).
    pub(crate) fn raw_json(status: u16, body: Vec<u8>) -> Answer {
        Answer {
            status,
            bookmark: None,
            body,
            served: None,
            retry_after_s: None,
            usage: None,
        }
    }
}

/// Logs a refused request: credentials, size and server-side failures at
/// WARN (an operator wants to see them), a client's own SQL errors at DEBUG.
pub(super) fn log_refusal(answer: &Answer) {
    let message = serde_json::from_slice::<Response>(&answer.body)
        .ok()
        .and_then(|r| r.errors.into_iter().next())
        .map(|e| format!("{} {}", e.code, e.message))
        .unwrap_or_default();
    match answer.status {
        401 | 403 | 413 | 500.. => {
            tracing::warn!(status = answer.status, "request refused: {message}")
        }
        _ => tracing::debug!(status = answer.status, "request refused: {message}"),
    }
}

pub(super) fn too_large(limit: usize) -> String {
    format!("request body exceeds the limit of {limit} bytes")
}

/// The HTTP status and D1-style code of a query error:
/// - the statement's own fault (SQL errors, parameters, transaction
///   control, a replica asked to write): 400 / 7500;
/// - it ran past the time limit: 400 / 7408 (a property of the query; a
///   plain retry would run just as long, so not a 5xx);
/// - its result is past the response cap: 400 / 7414;
/// - the node cannot take it now (the gate, a replica behind, no free
///   connection, stopping, a cancelled request): 503 / 7503;
/// - the database stopped taking writes: 500 / 7000.
///
/// A batch's error is answered as its failing statement's.
pub(super) fn query_error(e: &QueryError) -> (u16, u32) {
    match e {
        QueryError::ReadOnlyAccess => (403, codes::AUTH),
        QueryError::Batch { source, .. } => query_error(source),
        QueryError::Sql { .. }
        | QueryError::ParameterCount { .. }
        | QueryError::ParametersNotLast
        | QueryError::NotSupported(_)
        | QueryError::NotAuthorized(_)
        | QueryError::SqlTooLong { .. }
        | QueryError::TooManyParameters { .. }
        | QueryError::ValueTooLarge { .. }
        | QueryError::TooManyColumns { .. }
        | QueryError::DatabaseFull { .. }
        | QueryError::ReadOnlyReplica => (400, codes::SQL),
        QueryError::StorageLimit => (429, codes::LIMIT),
        QueryError::Timeout { .. } => (400, codes::TIMEOUT),
        QueryError::ResponseTooLarge { .. } => (400, codes::RESPONSE_TOO_LARGE),
        QueryError::NotConfirmed { .. }
        | QueryError::WriteNotAdmitted { .. }
        | QueryError::ReplicaBehind { .. }
        | QueryError::Busy { .. }
        | QueryError::Cancelled
        | QueryError::Stopping => (503, codes::UNAVAILABLE),
        QueryError::TransactionTooLarge { .. } => (413, codes::TOO_LARGE),
        QueryError::CaptureFailed(_)
        | QueryError::SequenceExhausted
        | QueryError::WriteAbandoned => (500, codes::INTERNAL),
    }
}

/// Whether a client should retry after a second (a `Retry-After` header).
pub(super) fn retry_after_s(e: &QueryError) -> Option<u32> {
    match e {
        QueryError::Batch { source, .. } => retry_after_s(source),
        QueryError::Busy { .. } => Some(1),
        _ => None,
    }
}

/// `answer` as an HTTP response, built directly: what
/// `respond(answer).into_response()` makes, without axum's conversions.
pub(super) fn response(answer: Answer) -> axum::response::Response {
    let (status, headers, body) = respond(answer);
    let mut response = axum::response::Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// An answer as an HTTP response (JSON; a 401 names the scheme expected).
pub(super) fn respond(answer: Answer) -> (StatusCode, HeaderMap, Vec<u8>) {
    let mut out = HeaderMap::new();
    out.insert("content-type", HeaderValue::from_static("application/json"));
    if answer.status == 401 {
        out.insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"walrelay\""),
        );
    }
    if let Some(b) = answer.bookmark.and_then(|b| HeaderValue::from_str(&b).ok()) {
        out.insert(BOOKMARK_HEADER, b);
    }
    if let Some(s) = answer.retry_after_s {
        out.insert("retry-after", HeaderValue::from(s));
    }
    (
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        out,
        answer.body,
    )
}
