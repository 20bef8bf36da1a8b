//! The control-plane API: create, list, get and delete databases, in
//! D1's REST shape, at walrelay's paths and at Cloudflare's.
//!
//! ```text
//! POST   /v1/databases            {"name": "shop", "account": "a1"?, "primary_location_hint": "weur"?}
//! POST   /client/v4/accounts/{account_id}/d1/database   {"name": ..., "primary_location_hint": ...}
//! 200  {"result": {"uuid": "…", "name": "shop", "created_at": "2026-11-30T22:00:00.000Z",
//!                  "version": "production", "num_tables": 0, "file_size": 0},
//!       "success": true, "errors": [], "messages": []}
//!
//! GET    /v1/databases?account=a1&name=<prefix>&page=1&per_page=100
//! GET    /client/v4/accounts/{account_id}/d1/database?name=&page=&per_page=
//! 200  {"result": [{"uuid", "name", "created_at", "version"}, ...],
//!       "result_info": {"page": 1, "per_page": 100, "count": n, "total_count": n},
//!       "success": true, "errors": [], "messages": []}
//!
//! GET    /v1/databases/{uuid or name}[?account=]   /client/v4/accounts/{a}/d1/database/{uuid}
//! DELETE /v1/databases/{uuid or name}[?account=]   /client/v4/accounts/{a}/d1/database/{uuid}
//! 200  {"result": {...} | null, "success": true, ...}
//! ```
//!
//! Errors are the usual envelope: 400 (a bad name, account or page),
//! 401/403 (these calls need an all-databases token; create and delete a
//! read-write one), 404 (no such live database), 409 (the name is taken),
//! 429 (the account holds its limit of databases), 503 (the catalog is
//! unavailable; retry). A node that does not run the control plane passes
//! the call on to the one that does.

use super::answer::{Answer, codes, respond};
use super::auth::Target;
use super::server::Node;
use crate::fleet::catalog::{CatalogError, DatabaseRow};
use crate::fleet::control::ControlError;
use crate::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use axum::extract::{Path, RawQuery, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::IntoResponse;
use serde_json::{Value as Json, json};
use std::sync::Arc;

/// Largest control-plane request body.
const MAX_BODY_BYTES: usize = 16 << 10;
/// Most databases per listing page.
pub const MAX_PER_PAGE: u64 = 10_000;
const DEFAULT_PER_PAGE: u64 = 100;

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

fn database_json(row: &DatabaseRow) -> Json {
    json!({
        "uuid": row.uuid.to_string(),
        "name": row.name.as_str(),
        "created_at": rfc3339(row.created_at_ms),
        "version": "production",
        "num_tables": 0,
        "file_size": 0,
        "primary_location_hint": row.location,
    })
}

fn ok(result: Json) -> Answer {
    let body = json!({"result": result, "success": true, "errors": [], "messages": []});
    Answer::raw_json(200, serde_json::to_vec(&body).unwrap_or_default())
}

fn control_error(e: &ControlError) -> Answer {
    match e {
        ControlError::NotFound(what) => Answer::error(
            404,
            codes::UNKNOWN_DATABASE,
            format!("no database {what:?}"),
        ),
        ControlError::Catalog(CatalogError::NameTaken(n)) => Answer::error(
            409,
            codes::BAD_REQUEST,
            format!("a database named {n:?} already exists in this account"),
        ),
        ControlError::Catalog(CatalogError::TooManyDatabases(n)) => Answer::error(
            429,
            codes::BAD_REQUEST,
            format!("the account already holds its limit of {n} databases"),
        ),
        other => Answer::error(503, codes::UNAVAILABLE, other.to_string()).retry_after(1),
    }
}

fn bad(message: impl Into<String>) -> Answer {
    Answer::error(400, codes::BAD_REQUEST, message)
}

/// The query string's pairs (percent-decoding is not needed: every value
/// accepted is plain ASCII; anything else is refused by its parser).
fn query_pairs(raw: Option<&str>) -> Vec<(&str, &str)> {
    raw.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect()
}

fn account_of(explicit: Option<&str>, node: &Node) -> Result<AccountId, Answer> {
    match explicit {
        Some(a) => AccountId::new(a).map_err(|e| bad(e.to_string())),
        None => Ok(node
            .fleet()
            .map(|f| f.config.default_account.clone())
            .unwrap_or_else(AccountId::default_account)),
    }
}

/// What a control-plane request asks.
enum Call<'a> {
    Create(&'a [u8]),
    List,
    Get(&'a str),
    Delete(&'a str),
}

impl Node {
    fn control_call(
        &self,
        account_in_path: Option<&str>,
        query: Option<&str>,
        call: Call<'_>,
    ) -> Answer {
        let pairs = query_pairs(query);
        let param = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let Some(fleet) = self.fleet() else {
            return Answer::error(404, codes::UNKNOWN_DATABASE, "this node serves no fleet");
        };
        let control = match fleet.control() {
            Ok(c) => Arc::clone(c),
            Err(_) => return Answer::error(503, codes::UNAVAILABLE, "no control plane is known"),
        };
        let account = match account_of(account_in_path.or(param("account")), self) {
            Ok(a) => a,
            Err(a) => return a,
        };
        let found = |id: &str| -> Result<DatabaseRow, ControlError> {
            match id.parse::<DatabaseUuid>() {
                Ok(uuid) => control.get(uuid),
                Err(_) => match DatabaseName::new(id) {
                    Ok(name) => control.by_name(&account, &name),
                    Err(_) => Err(ControlError::NotFound(id.chars().take(80).collect())),
                },
            }
        };
        match call {
            Call::Create(body) => {
                #[derive(serde::Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Create {
                    name: String,
                    account: Option<String>,
                    primary_location_hint: Option<String>,
                    #[allow(dead_code)]
                    jurisdiction: Option<String>,
                }
                let c: Create = match serde_json::from_slice(body) {
                    Ok(c) => c,
                    Err(e) => return bad(format!("the body must be {{\"name\": ...}}: {e}")),
                };
                let name = match DatabaseName::new(&c.name) {
                    Ok(n) => n,
                    Err(e) => return bad(e.to_string()),
                };
                let account = match c.account.as_deref() {
                    Some(a) if account_in_path.is_none() => match AccountId::new(a) {
                        Ok(a) => a,
                        Err(e) => return bad(e.to_string()),
                    },
                    _ => account,
                };
                if c.primary_location_hint
                    .as_ref()
                    .is_some_and(|h| h.len() > 64)
                {
                    return bad("primary_location_hint is longer than 64 bytes");
                }
                match control.create(&account, &name, c.primary_location_hint.as_deref()) {
                    Ok(row) => ok(database_json(&row)),
                    Err(e) => control_error(&e),
                }
            }
            Call::List => {
                let number = |k: &str, default: u64| -> Result<u64, Answer> {
                    match param(k) {
                        None => Ok(default),
                        // Cloudflare's SDKs type these as numbers and may
                        // send `2.0`; any integral value is taken.
                        Some(v) => v
                            .parse::<u64>()
                            .ok()
                            .or_else(|| {
                                v.parse::<f64>()
                                    .ok()
                                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15)
                                    .map(|f| f as u64)
                            })
                            .ok_or_else(|| bad(format!("{k} must be a positive integer"))),
                    }
                };
                let (page, per_page) =
                    match (number("page", 1), number("per_page", DEFAULT_PER_PAGE)) {
                        (Ok(p), Ok(n)) => (p, n),
                        (Err(a), _) | (_, Err(a)) => return a,
                    };
                if page == 0 || per_page == 0 || per_page > MAX_PER_PAGE {
                    return bad(format!(
                        "page must be at least 1 and per_page 1 to {MAX_PER_PAGE}"
                    ));
                }
                let prefix = param("name").filter(|n| !n.is_empty());
                if prefix.is_some_and(|p| DatabaseName::new(p).is_err()) {
                    return bad("name must be a database name (or its prefix)");
                }
                match control.list(&account, prefix, page, per_page) {
                    Ok(p) => {
                        let result: Vec<Json> = p.rows.iter().map(database_json).collect();
                        let body = json!({
                            "result": result,
                            "result_info": {"page": page, "per_page": per_page,
                                            "count": p.rows.len(), "total_count": p.total},
                            "success": true, "errors": [], "messages": [],
                        });
                        Answer::raw_json(200, serde_json::to_vec(&body).unwrap_or_default())
                    }
                    Err(e) => control_error(&e),
                }
            }
            Call::Get(id) => match found(id) {
                Ok(row) => ok(database_json(&row)),
                Err(e) => control_error(&e),
            },
            Call::Delete(id) => match found(id).and_then(|row| control.delete(row.uuid)) {
                Ok(_) => ok(Json::Null),
                Err(e) => control_error(&e),
            },
        }
    }

    /// Passes a control-plane call to the node that runs the control plane.
    fn pass_to_control(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Answer {
        let Some(url) = self.fleet().and_then(|f| f.config.control_url.clone()) else {
            return Answer::error(503, codes::UNAVAILABLE, "no control plane is known");
        };
        let target = format!("{url}{path_and_query}");
        let auth = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let agent = self.agent();
        let sent = match *method {
            Method::POST => agent
                .post(&target)
                .header("authorization", auth)
                .header("content-type", "application/json")
                .send(body),
            Method::DELETE => agent.delete(&target).header("authorization", auth).call(),
            _ => agent.get(&target).header("authorization", auth).call(),
        };
        match sent {
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                match resp.body_mut().with_config().limit(64 << 20).read_to_vec() {
                    Ok(b) => Answer::raw_json(status, b),
                    Err(e) => Answer::error(
                        502,
                        codes::UNAVAILABLE,
                        format!("the control plane's answer: {e}"),
                    ),
                }
            }
            Err(e) => Answer::error(
                503,
                codes::UNAVAILABLE,
                format!("the control plane is unreachable: {e}"),
            )
            .retry_after(1),
        }
    }
}

/// A control-plane request as it arrived.
struct Incoming {
    method: Method,
    account: Option<String>,
    id: Option<String>,
    query: Option<String>,
    headers: HeaderMap,
    path_and_query: String,
}

async fn handle(
    node: Arc<Node>,
    incoming: Incoming,
    body: axum::body::Body,
) -> axum::response::Response {
    let Incoming {
        method,
        account,
        id,
        query,
        headers,
        path_and_query,
    } = incoming;
    let write = method == Method::POST || method == Method::DELETE;
    let authorization = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes);
    if let Err(answer) = node.authorize(authorization, Target::ControlPlane { write }) {
        return respond(answer).into_response();
    }
    let body = match super::routes::read_body(&node, &headers, body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(answer) => return respond(answer).into_response(),
    };
    let n = Arc::clone(&node);
    let answer = tokio::task::spawn_blocking(move || {
        if !n.fleet().is_some_and(|f| f.runs_control_plane()) && n.fleet().is_some() {
            return n.pass_to_control(&method, &path_and_query, &headers, &body);
        }
        let call = match (&method, id.as_deref()) {
            (&Method::POST, None) => Call::Create(&body),
            (&Method::GET, None) => Call::List,
            (&Method::GET, Some(id)) => Call::Get(id),
            (&Method::DELETE, Some(id)) => Call::Delete(id),
            _ => return Answer::error(405, codes::BAD_REQUEST, "method not allowed"),
        };
        n.control_call(account.as_deref(), query.as_deref(), call)
    })
    .await
    .unwrap_or_else(|e| Answer::error(500, codes::INTERNAL, format!("the request failed: {e}")));
    let answer = if answer.status >= 400 {
        node.refuse(answer)
    } else {
        answer
    };
    respond(answer).into_response()
}

fn path_and_query(uri: &axum::http::Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string())
}

/// `POST|GET /v1/databases`.
pub(super) async fn databases_route(
    State(node): State<Arc<Node>>,
    method: Method,
    uri: axum::http::Uri,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    let pq = path_and_query(&uri);
    handle(
        node,
        Incoming {
            method,
            account: None,
            id: None,
            query,
            headers,
            path_and_query: pq,
        },
        body,
    )
    .await
}

/// `GET|DELETE /v1/databases/{id}`.
pub(super) async fn database_route(
    State(node): State<Arc<Node>>,
    method: Method,
    uri: axum::http::Uri,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    let pq = path_and_query(&uri);
    handle(
        node,
        Incoming {
            method,
            account: None,
            id: Some(id),
            query,
            headers,
            path_and_query: pq,
        },
        body,
    )
    .await
}

/// `POST|GET /client/v4/accounts/{account_id}/d1/database`.
pub(super) async fn cf_databases_route(
    State(node): State<Arc<Node>>,
    method: Method,
    uri: axum::http::Uri,
    Path(account): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    let pq = path_and_query(&uri);
    handle(
        node,
        Incoming {
            method,
            account: Some(account),
            id: None,
            query,
            headers,
            path_and_query: pq,
        },
        body,
    )
    .await
}

/// `GET|DELETE /client/v4/accounts/{account_id}/d1/database/{database_id}`.
pub(super) async fn cf_database_route(
    State(node): State<Arc<Node>>,
    method: Method,
    uri: axum::http::Uri,
    Path((account, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    let pq = path_and_query(&uri);
    let incoming = Incoming {
        method,
        account: Some(account),
        id: Some(id),
        query,
        headers,
        path_and_query: pq,
    };
    handle(node, incoming, body).await
}
