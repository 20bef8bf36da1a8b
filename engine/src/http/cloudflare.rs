//! Cloudflare's own D1 REST paths and envelope, so D1 clients (the
//! official SDKs, wrangler's API calls) work against a node unchanged.
//!
//! `{account_id}` names the account a database *name* in
//! `{database_id}` is looked up in (fleet databases; a uuid needs none).
//! Otherwise it is accepted and ignored: a node has no accounts (a
//! token grants databases, not accounts). `{database_id}` is resolved by
//! [`Node::resolve_database`]. Creating, listing, getting and deleting
//! databases (`.../d1/database`) are the control plane's
//! (`super::control_api`).
//!
//! ```text
//! base: /client/v4/accounts/{account_id}/d1/database/{database_id}
//!
//! POST {base}/query   {"sql": "...", "params": [...]} | {"batch": [{"sql", "params"}, ...]}
//! POST {base}/raw     the same; rows as {"columns": [...], "rows": [[...], ...]}
//!   200 {"result": [<one per statement, as super::api>], "success": true,
//!        "errors": [], "messages": []}
//!
//! POST {base}/export  {"output_format": "polling",
//!                      "dump_options": {"no_data", "no_schema", "tables"}}   (optional)
//!   200 {"result": {"success": true, "type": "export", "status": "complete",
//!                   "at_bookmark": "<the state exported, at least>",
//!                   "result": {"filename": "<name>-<bookmark>.sql",
//!                              "signed_url": "http://<Host>/v1/transfers/<token>"}},
//!        "success": true, "errors": [], "messages": []}
//!   GET signed_url -> the dump (super::transfer; valid TRANSFER_TTL)
//!
//! POST {base}/import  (a read-write token; checked before the body is read)
//!   {"action": "init", "etag": "<md5 hex of the file>"}
//!   200 {"result": {"success": true, "type": "import",
//!                   "upload_url": "http://<Host>/v1/transfers/<token>",
//!                   "filename": "<name>-<etag>.sql"}, ...}
//!   PUT upload_url <the SQL file>                      (at most max_import_bytes)
//!   {"action": "ingest", "etag": "...", "filename": "..."}
//!   200 {"result": {"success": true, "type": "import", "status": "complete",
//!                   "at_bookmark": "<the database before the import>",
//!                   "result": {"num_queries": n, "final_bookmark": "...", "meta": {...}}}, ...}
//!   {"action": "poll", "current_bookmark": "<at_bookmark>"}
//!   200 the same as ingest's, while remembered (MAX_IMPORT_RESULTS, TRANSFER_TTL)
//!
//! GET|POST {base}/time_travel/bookmark?timestamp=...    as super::time_travel
//! POST     {base}/time_travel/restore?bookmark=...|timestamp=...
//!
//! errors: 4xx/5xx {"result": [], "success": false,
//!                  "errors": [{"code": n, "message": "..."}], "messages": []}
//! ```
//!
//! An ingest runs the whole import before it answers, so its answer is
//! already `complete` and a poll only repeats it. The links use the
//! request's `Host` header: the node the client reached.

use super::answer::respond;
use super::api::{Envelope, Shape};
use super::routes::{blocking, caller_for, query_answer, read_body};
use super::server::{Answer, Node, codes};
use super::transfer::{ImportResult, md5_hex};
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The path of one database's endpoints.
pub const BASE: &str = "/client/v4/accounts/{account_id}/d1/database/{database_id}";

/// Largest export or import request (its JSON, not the file).
const MAX_REQUEST_BYTES: usize = 64 << 10;

/// `{account_id}` and `{database_id}`.
type Ids = Path<(String, String)>;

/// Export's request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportRequest {
    output_format: String,
    /// Polling an export in progress: every export here completes at
    /// once, so a poll exports again.
    #[serde(default)]
    #[allow(dead_code)]
    current_bookmark: Option<String>,
    #[serde(default)]
    dump_options: Option<super::transfer::DumpOptionsJson>,
}

#[derive(Debug, Serialize)]
struct ExportFile {
    filename: String,
    signed_url: String,
}

#[derive(Debug, Serialize)]
struct ExportResponse {
    success: bool,
    #[serde(rename = "type")]
    kind: &'static str,
    status: &'static str,
    at_bookmark: String,
    result: ExportFile,
}

/// Import's request (one of the three actions).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportRequest {
    action: String,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default)]
    filename: Option<String>,
    #[serde(default)]
    current_bookmark: Option<String>,
}

#[derive(Debug, Serialize)]
struct ImportResponse {
    success: bool,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at_bookmark: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upload_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filename: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<ImportResult>,
}

fn ok<T: Serialize>(result: T) -> Answer {
    Answer::raw_json(
        200,
        serde_json::to_vec(&Envelope::ok(result)).unwrap_or_default(),
    )
}

fn bad(message: impl Into<String>) -> Answer {
    Answer::error(400, codes::BAD_REQUEST, message)
}

/// `http://<Host>`, if the request's Host header is a plain host[:port].
fn origin(headers: &HeaderMap) -> Result<String, Answer> {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .ok_or_else(|| bad("a transfer link needs the request's Host header (host[:port])"))?;
    Ok(format!("http://{host}"))
}

/// An md5 etag: 32 hex digits.
fn etag_ok(etag: &str) -> bool {
    etag.len() == 32 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn query_route(
    State(node): State<Arc<Node>>,
    Path((account, database)): Ids,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    let database = node.in_account(&account, database);
    respond(query_answer(node, database, headers, body, Shape::Objects).await)
}

async fn raw_route(
    State(node): State<Arc<Node>>,
    Path((account, database)): Ids,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    let database = node.in_account(&account, database);
    respond(query_answer(node, database, headers, body, Shape::Arrays).await)
}

async fn export_route(
    State(node): State<Arc<Node>>,
    Path((account, database)): Ids,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    let database = node.in_account(&account, database);
    let (caller, resolved) = match caller_for(&node, &headers, &database) {
        Ok(c) => c,
        Err(a) => return respond(a),
    };
    let body = match read_body(&node, &headers, body, MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(a) => return respond(a),
    };
    let request: ExportRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return respond(node.refuse(bad(format!("malformed export request: {e}")))),
    };
    if request.output_format != "polling" {
        return respond(node.refuse(bad(format!(
            "output_format must be \"polling\", not {:?}",
            request.output_format
        ))));
    }
    let origin = match origin(&headers) {
        Ok(o) => o,
        Err(a) => return respond(node.refuse(a)),
    };
    let options = request.dump_options.map(Into::into).unwrap_or_default();
    respond(
        blocking(&node, move |n, token| {
            let dump = match n.export(&caller, &resolved.name, &options, token) {
                Ok(d) => d,
                Err(a) => return a,
            };
            let at_bookmark = dump.bookmark.to_string();
            let filename = format!("{}-{at_bookmark}.sql", resolved.name);
            match n.transfers().hold_export(filename.clone(), dump.sql) {
                Ok(link) => ok(ExportResponse {
                    success: true,
                    kind: "export",
                    status: "complete",
                    at_bookmark,
                    result: ExportFile {
                        filename,
                        signed_url: format!("{origin}/v1/transfers/{link}"),
                    },
                }),
                Err(a) => n.refuse(a),
            }
        })
        .await,
    )
}

async fn import_route(
    State(node): State<Arc<Node>>,
    Path((account, database)): Ids,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    let database = node.in_account(&account, database);
    let (caller, resolved) = match caller_for(&node, &headers, &database) {
        Ok(c) => c,
        Err(a) => return respond(a),
    };
    if !caller.may_write() {
        return respond(node.refuse(Answer::error(
            403,
            codes::AUTH,
            "an import needs a read-write token",
        )));
    }
    let body = match read_body(&node, &headers, body, MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(a) => return respond(a),
    };
    let request: ImportRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return respond(node.refuse(bad(format!("malformed import request: {e}")))),
    };
    let origin = match origin(&headers) {
        Ok(o) => o,
        Err(a) => return respond(node.refuse(a)),
    };
    let name = resolved.name;
    respond(
        blocking(&node, move |n, token| {
            let answer = match request.action.as_str() {
                "init" => init(n, &name, &request, &origin),
                "ingest" => ingest(n, &caller, &name, &request, token),
                "poll" => poll(n, &request),
                other => bad(format!(
                    "unknown action {other:?}: give \"init\", \"ingest\" or \"poll\""
                )),
            };
            if answer.status >= 400 {
                return n.refuse(answer);
            }
            answer
        })
        .await,
    )
}

fn init(node: &Node, name: &str, request: &ImportRequest, origin: &str) -> Answer {
    let Some(etag) = request.etag.as_deref().filter(|e| etag_ok(e)) else {
        return bad("init needs \"etag\": the md5 of the file, 32 hex digits");
    };
    let etag = etag.to_ascii_lowercase();
    let filename = format!("{name}-{etag}.sql");
    // A repeated init replaces the earlier one's pending upload.
    let _ = node.transfers().take_upload(&filename);
    match node.transfers().announce_upload(&etag, &filename) {
        Ok(link) => ok(ImportResponse {
            success: true,
            kind: "import",
            status: None,
            at_bookmark: None,
            upload_url: Some(format!("{origin}/v1/transfers/{link}")),
            filename: Some(filename),
            result: None,
        }),
        Err(a) => a,
    }
}

fn ingest(
    node: &Node,
    caller: &super::server::Caller,
    name: &str,
    request: &ImportRequest,
    cancel: &crate::execution::CancelToken,
) -> Answer {
    let (Some(etag), Some(filename)) = (request.etag.as_deref(), request.filename.as_deref())
    else {
        return bad("ingest needs \"etag\" and \"filename\" (from init)");
    };
    let Some(upload) = node.transfers().take_upload(filename) else {
        return Answer::error(
            404,
            codes::UNKNOWN_DATABASE,
            format!("no pending upload {filename:?} (init first; uploads expire)"),
        );
    };
    if !upload.etag.eq_ignore_ascii_case(etag) {
        let a = bad(format!(
            "etag {etag:?} is not the one {filename:?} was announced with"
        ));
        node.transfers().restore_upload(upload);
        return a;
    }
    let Some(body) = upload.body.clone() else {
        node.transfers().restore_upload(upload);
        return bad("nothing was uploaded to the upload_url yet");
    };
    let actual = md5_hex(&body);
    if actual != upload.etag {
        node.transfers().restore_upload(upload);
        return bad(format!(
            "the uploaded file's md5 is {actual}, not the etag {etag}"
        ));
    }
    let at_bookmark = match node.local_database(name) {
        Ok(db) => db.latest_bookmark().to_string(),
        Err(a) => return a,
    };
    let answer = node.import(caller, name, &body, cancel);
    if answer.status != 200 {
        return answer;
    }
    let result = match serde_json::from_slice::<Envelope<ImportResult>>(&answer.body) {
        Ok(e) => e.result,
        Err(e) => {
            return Answer::error(
                500,
                codes::INTERNAL,
                format!("the import's answer was not understood: {e}"),
            );
        }
    };
    node.transfers()
        .finish_import(at_bookmark.clone(), result.clone());
    ok(ImportResponse {
        success: true,
        kind: "import",
        status: Some("complete"),
        at_bookmark: Some(at_bookmark),
        upload_url: None,
        filename: None,
        result: Some(result),
    })
}

fn poll(node: &Node, request: &ImportRequest) -> Answer {
    let Some(bookmark) = request.current_bookmark.as_deref() else {
        return bad("poll needs \"current_bookmark\" (the at_bookmark ingest answered)");
    };
    match node.transfers().finished_import(bookmark) {
        Some(result) => ok(ImportResponse {
            success: true,
            kind: "import",
            status: Some("complete"),
            at_bookmark: Some(bookmark.to_string()),
            upload_url: None,
            filename: None,
            result: Some(result),
        }),
        None => Answer::error(
            404,
            codes::UNKNOWN_DATABASE,
            format!("no import at bookmark {bookmark:?} on this node (or it expired)"),
        ),
    }
}

/// Which time-travel endpoint.
#[derive(Clone, Copy)]
enum TimeTravel {
    Bookmark,
    Restore,
}

async fn time_travel(
    node: Arc<Node>,
    database: String,
    query: Option<String>,
    headers: HeaderMap,
    which: TimeTravel,
) -> (axum::http::StatusCode, HeaderMap, Vec<u8>) {
    let (caller, resolved) = match caller_for(&node, &headers, &database) {
        Ok(c) => c,
        Err(a) => return respond(a),
    };
    let query = query.unwrap_or_default();
    respond(
        blocking(&node, move |n, _| match which {
            TimeTravel::Bookmark => n.time_travel_bookmark(&caller, &resolved.name, &query),
            TimeTravel::Restore => n.time_travel_restore(&caller, &resolved.name, &query),
        })
        .await,
    )
}

async fn bookmark_route(
    State(node): State<Arc<Node>>,
    Path((account, database)): Ids,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> impl IntoResponse {
    let database = node.in_account(&account, database);
    time_travel(node, database, query, headers, TimeTravel::Bookmark).await
}

async fn restore_route(
    State(node): State<Arc<Node>>,
    Path((account, database)): Ids,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> impl IntoResponse {
    let database = node.in_account(&account, database);
    time_travel(node, database, query, headers, TimeTravel::Restore).await
}

/// Adds Cloudflare's routes to a node's router.
pub(super) fn routes(router: Router<Arc<Node>>) -> Router<Arc<Node>> {
    router
        .route(&format!("{BASE}/query"), post(query_route))
        .route(&format!("{BASE}/raw"), post(raw_route))
        .route(&format!("{BASE}/export"), post(export_route))
        .route(&format!("{BASE}/import"), post(import_route))
        .route(
            &format!("{BASE}/time_travel/bookmark"),
            post(bookmark_route).get(bookmark_route),
        )
        .route(&format!("{BASE}/time_travel/restore"), post(restore_route))
}
