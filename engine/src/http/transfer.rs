//! Export and import over HTTP (`wrangler d1 export`, `wrangler d1
//! execute --file`), and the short-lived transfer links Cloudflare's
//! export and import flows hand out ([`super::cloudflare`]).
//!
//! ```text
//! POST /v1/databases/{name}/export            body: empty | {"dump_options": {...}}
//!   dump_options: {"no_data": bool, "no_schema": bool, "tables": ["t", ...]}
//! 200 content-type: application/sql  x-d1-bookmark: <the state it reflects, at least>
//!   PRAGMA defer_foreign_keys=TRUE;
//!   CREATE TABLE ...; INSERT INTO ...; ...      (format: crate::dump)
//! 413 {"errors": [{"code": 7413, ...}], "success": false, ...}   past max_export_bytes
//!
//! POST /v1/databases/{name}/import            body: the SQL text (UTF-8)
//! 200 {"result": {"num_queries": n, "final_bookmark": "...",
//!                 "meta": {"served_by_primary": true, "changes": n, ...}},
//!      "success": true, "errors": [], "messages": []}
//!
//! GET  /v1/transfers/{token}     an export's dump (Cloudflare's signed_url)
//! PUT  /v1/transfers/{token}     an import's file (Cloudflare's upload_url)
//! ```
//!
//! An import is one transaction on the primary (a replica forwards it):
//! all or nothing, every statement within `max_sql_bytes`, the whole
//! within `max_transaction_bytes`; the body within
//! [`super::server::HttpConfig::max_import_bytes`]. It needs a read-write
//! token, checked before its body is read. An export reads one snapshot
//! on the node it is sent to and is held in memory up to
//! [`super::server::HttpConfig::max_export_bytes`].
//!
//! Transfer links: the token (32 random bytes, hex) is the only
//! credential, like a presigned URL. Everything held is bounded: at most
//! [`MAX_EXPORTS`] exports and [`MAX_UPLOADS`] uploads (the oldest is
//! dropped to make room), each for [`TRANSFER_TTL`], and at most
//! [`MAX_IMPORT_RESULTS`] finished imports for polling. At most
//! [`MAX_RUNNING`] exports, imports and uploads are in progress on a node
//! at once (each holds up to its size limit in memory while it runs); one
//! more is answered 503 with `Retry-After`, before its body is read.

use super::answer::respond;
use super::api::{Envelope, MetaJson};
use super::routes::{blocking, caller_for, read_body};
use super::server::{Answer, Caller, Node, codes};
use crate::dump::{Dump, DumpError, DumpOptions};
use crate::execution::CancelToken;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response as HttpResponse};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an export link or a pending upload lives (Cloudflare's signed
/// URLs: one hour).
pub const TRANSFER_TTL: Duration = Duration::from_secs(3600);
/// Exports held for download at once.
pub const MAX_EXPORTS: usize = 4;
/// Uploads pending (announced or uploaded, not ingested) at once.
pub const MAX_UPLOADS: usize = 4;
/// Finished imports remembered for `poll`.
pub const MAX_IMPORT_RESULTS: usize = 16;
/// Exports being made, and imports and uploads being read or run, at
/// once per node.
pub const MAX_RUNNING: usize = 4;

/// What an import did, as answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportResult {
    pub num_queries: u64,
    pub final_bookmark: String,
    pub meta: MetaJson,
}

struct HeldExport {
    token: String,
    filename: String,
    created: Instant,
    sql: bytes::Bytes,
}

/// An upload announced by Cloudflare's `init`.
pub(super) struct Upload {
    pub(super) token: String,
    pub(super) etag: String,
    pub(super) filename: String,
    created: Instant,
    pub(super) body: Option<bytes::Bytes>,
}

struct Finished {
    at_bookmark: String,
    created: Instant,
    result: ImportResult,
}

#[derive(Default)]
struct Held {
    exports: VecDeque<HeldExport>,
    uploads: VecDeque<Upload>,
    finished: VecDeque<Finished>,
}

/// A node's transfer state: exports to download, uploads to ingest,
/// finished imports to poll. Every queue is bounded in count and age.
pub struct Transfers {
    held: Mutex<Held>,
    /// [`MAX_RUNNING`] slots; a permit is given back when dropped.
    running: Arc<tokio::sync::Semaphore>,
}

impl Default for Transfers {
    fn default() -> Transfers {
        Transfers {
            held: Mutex::default(),
            running: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING)),
        }
    }
}

impl std::fmt::Debug for Transfers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfers").finish_non_exhaustive()
    }
}

/// A fresh unguessable token: 32 bytes from the OS RNG, in hex.
fn new_token() -> Result<String, Answer> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| Answer::error(500, codes::INTERNAL, format!("the OS RNG failed: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Held {
    fn expire(&mut self) {
        let live = |t: &Instant| t.elapsed() < TRANSFER_TTL;
        self.exports.retain(|e| live(&e.created));
        self.uploads.retain(|u| live(&u.created));
        self.finished.retain(|f| live(&f.created));
    }
}

impl Transfers {
    /// A slot for one export, import or upload, or the 503 to answer when
    /// all [`MAX_RUNNING`] are taken.
    pub(super) fn start(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Answer> {
        Arc::clone(&self.running).try_acquire_owned().map_err(|_| {
                        Answer::error(
                503,
                codes::UNAVAILABLE,
                format!(
                    "{MAX_RUNNING} exports and imports are running on this node, its limit: retry shortly"
                ),
            ).retry_after(1)
        })
    }

    /// Holds an export for download; its token.
    pub(super) fn hold_export(&self, filename: String, sql: String) -> Result<String, Answer> {
        let token = new_token()?;
        let mut h = self.held.lock();
        h.expire();
        while h.exports.len() >= MAX_EXPORTS {
            h.exports.pop_front();
        }
        h.exports.push_back(HeldExport {
            token: token.clone(),
            filename,
            created: Instant::now(),
            sql: bytes::Bytes::from(sql),
        });
        Ok(token)
    }

    fn export(&self, token: &str) -> Option<(String, bytes::Bytes)> {
        let mut h = self.held.lock();
        h.expire();
        h.exports
            .iter()
            .find(|e| e.token == token)
            .map(|e| (e.filename.clone(), e.sql.clone()))
    }

    /// Announces an upload; its token.
    pub(super) fn announce_upload(&self, etag: &str, filename: &str) -> Result<String, Answer> {
        let token = new_token()?;
        let mut h = self.held.lock();
        h.expire();
        while h.uploads.len() >= MAX_UPLOADS {
            h.uploads.pop_front();
        }
        h.uploads.push_back(Upload {
            token: token.clone(),
            etag: etag.to_string(),
            filename: filename.to_string(),
            created: Instant::now(),
            body: None,
        });
        Ok(token)
    }

    /// Stores an uploaded file; false if the token names no live upload.
    fn store_upload(&self, token: &str, body: bytes::Bytes) -> bool {
        let mut h = self.held.lock();
        h.expire();
        match h.uploads.iter_mut().find(|u| u.token == token) {
            Some(u) => {
                u.body = Some(body);
                true
            }
            None => false,
        }
    }

    /// Takes the upload named `filename` out, for ingesting.
    pub(super) fn take_upload(&self, filename: &str) -> Option<Upload> {
        let mut h = self.held.lock();
        h.expire();
        let i = h.uploads.iter().position(|u| u.filename == filename)?;
        h.uploads.remove(i)
    }

    /// Puts an upload back (an ingest that failed before running).
    pub(super) fn restore_upload(&self, u: Upload) {
        let mut h = self.held.lock();
        if h.uploads.len() < MAX_UPLOADS {
            h.uploads.push_back(u);
        }
    }

    pub(super) fn finish_import(&self, at_bookmark: String, result: ImportResult) {
        let mut h = self.held.lock();
        h.expire();
        while h.finished.len() >= MAX_IMPORT_RESULTS {
            h.finished.pop_front();
        }
        h.finished.push_back(Finished {
            at_bookmark,
            created: Instant::now(),
            result,
        });
    }

    pub(super) fn finished_import(&self, at_bookmark: &str) -> Option<ImportResult> {
        let mut h = self.held.lock();
        h.expire();
        h.finished
            .iter()
            .rev()
            .find(|f| f.at_bookmark == at_bookmark)
            .map(|f| f.result.clone())
    }
}

/// `{"dump_options": {...}}` (or nothing), as `/v1/.../export` takes it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportBody {
    #[serde(default)]
    dump_options: Option<DumpOptionsJson>,
}

/// D1's `dump_options`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DumpOptionsJson {
    #[serde(default)]
    no_data: bool,
    #[serde(default)]
    no_schema: bool,
    #[serde(default)]
    tables: Vec<String>,
}

impl From<DumpOptionsJson> for DumpOptions {
    fn from(o: DumpOptionsJson) -> DumpOptions {
        DumpOptions {
            no_data: o.no_data,
            no_schema: o.no_schema,
            tables: o.tables,
        }
    }
}

fn dump_error(e: &DumpError) -> Answer {
    match e {
        DumpError::TooLarge { .. } => Answer::error(413, codes::TOO_LARGE, e.to_string()),
        DumpError::VirtualTable { .. } | DumpError::UnknownTable { .. } => {
            Answer::error(400, codes::BAD_REQUEST, e.to_string())
        }
        DumpError::Query(q) => {
            let (status, code) = super::answer::query_error(q);
            Answer::error(status, code, e.to_string())
        }
    }
}

impl Node {
    /// Exports the database `name` (resolved) as this node holds it.
    pub fn export(
        &self,
        caller: &Caller,
        name: &str,
        options: &DumpOptions,
        cancel: &CancelToken,
    ) -> Result<Dump, Answer> {
        let name = self.resolve_database(name).map_err(|a| self.refuse(a))?;
        let _running = self.transfers().start().map_err(|a| self.refuse(a))?;
        let db = match self.local_database(&name.name) {
            Ok(db) => db,
            // A fleet database neither hosted nor replicated here: its
            // host exports it, and its dump is passed back as is.
            Err(a) if a.status == 421 && !caller.forwarded => {
                return self.export_from_host(caller, &name.name, options);
            }
            Err(a) => return Err(a),
        };
        let dump = db
            .dump(options, self.config().max_export_bytes, Some(cancel))
            .map_err(|e| self.refuse(dump_error(&e)))?;
        tracing::info!(database = name.name, bookmark = %dump.bookmark, bytes = dump.sql.len(), tables = dump.tables, rows = dump.rows, "exported");
        Ok(dump)
    }

    /// An export of a fleet database hosted on another node, made there.
    fn export_from_host(
        &self,
        caller: &Caller,
        name: &str,
        options: &DumpOptions,
    ) -> Result<Dump, Answer> {
        let body = serde_json::to_vec(&serde_json::json!({ "dump_options": {
            "no_data": options.no_data,
            "no_schema": options.no_schema,
            "tables": options.tables,
        }}))
        .unwrap_or_default();
        // The host checks the caller's token again.
        let answer = self
            .pass_to_host_with(caller, name, "/export", &body)
            .ok_or_else(|| Answer::error(404, codes::UNKNOWN_DATABASE, "unknown database"))?;
        if answer.status != 200 {
            return Err(answer);
        }
        let bookmark = answer
            .bookmark
            .as_deref()
            .and_then(|b| b.parse().ok())
            .unwrap_or_default();
        let sql = String::from_utf8(answer.body).map_err(|_| {
            Answer::error(502, codes::UNAVAILABLE, "the host's export is not UTF-8")
        })?;
        Ok(Dump {
            sql,
            bookmark,
            tables: 0,
            rows: 0,
        })
    }

    /// Imports `sql` into the database `name` (resolved): one transaction
    /// on the primary (a replica forwards it). The answer is the module's
    /// import shape.
    pub fn import(&self, caller: &Caller, name: &str, sql: &[u8], cancel: &CancelToken) -> Answer {
        let answer = self.import_inner(caller, name, sql, cancel);
        if answer.status >= 400 {
            return self.refuse(answer);
        }
        answer
    }

    fn import_inner(
        &self,
        caller: &Caller,
        name: &str,
        sql: &[u8],
        cancel: &CancelToken,
    ) -> Answer {
        let name = match self.resolve_database(name) {
            Ok(r) => r.name,
            Err(a) => return a,
        };
        if !caller.may_write() {
            return Answer::error(403, codes::AUTH, "an import needs a read-write token");
        }
        if sql.len() > self.config().max_import_bytes {
            return Answer::error(
                413,
                codes::TOO_LARGE,
                super::answer::too_large(self.config().max_import_bytes),
            );
        }
        let db = match self.writable_database(&name) {
            Ok(db) => db,
            // A fleet database hosted elsewhere: its host imports it.
            Err(a) if a.status == 421 && !caller.forwarded => {
                return self
                    .pass_to_host_with(caller, &name, "/import", sql)
                    .unwrap_or(a);
            }
            Err(a) => return a,
        };
        let Some(db) = db else {
            if caller.forwarded {
                return super::forward::not_primary();
            }
            let path = format!("/v1/databases/{name}/import");
            return self.forward_payload(caller, &name, &path, sql, "import");
        };
        let Ok(text) = std::str::from_utf8(sql) else {
            return Answer::error(400, codes::BAD_REQUEST, "the SQL to import is not UTF-8");
        };
        match db.import(text, Some(cancel)) {
            Ok(done) => {
                tracing::info!(database = name, statements = done.num_queries, bookmark = %done.final_bookmark, "imported");
                let result = ImportResult {
                    num_queries: done.num_queries as u64,
                    final_bookmark: done.final_bookmark.to_string(),
                    meta: MetaJson::from(&done.meta),
                };
                let mut a = Answer::raw_json(
                    200,
                    serde_json::to_vec(&Envelope::ok(result)).unwrap_or_default(),
                );
                a.bookmark = Some(done.final_bookmark.to_string());
                a
            }
            Err(e) => {
                let (status, code) = super::answer::query_error(&e);
                Answer::error(status, code, e.to_string())
            }
        }
    }
}

/// Parses an export request's options (an empty body: the defaults).
pub(super) fn export_options(body: &[u8]) -> Result<DumpOptions, Answer> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DumpOptions::default());
    }
    let b: ExportBody = serde_json::from_slice(body).map_err(|e| {
        Answer::error(
            400,
            codes::BAD_REQUEST,
            format!("malformed export request: {e}"),
        )
    })?;
    Ok(b.dump_options.map(Into::into).unwrap_or_default())
}

/// Largest export request body (its options).
const MAX_OPTIONS_BYTES: usize = 64 << 10;

/// `POST /v1/databases/{name}/export`.
pub(super) async fn export_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> HttpResponse {
    let (caller, resolved) = match caller_for(&node, &headers, &name) {
        Ok(c) => c,
        Err(a) => return respond(a).into_response(),
    };
    let body = match read_body(&node, &headers, body, MAX_OPTIONS_BYTES).await {
        Ok(b) => b,
        Err(a) => return respond(a).into_response(),
    };
    let options = match export_options(&body) {
        Ok(o) => o,
        Err(a) => return respond(node.refuse(a)).into_response(),
    };
    let dumped = Arc::new(Mutex::new(None));
    let out = Arc::clone(&dumped);
    let answer = blocking(&node, move |n, token| {
        match n.export(&caller, &resolved.name, &options, token) {
            Ok(d) => {
                let bookmark = d.bookmark.to_string();
                *out.lock() = Some(d.sql);
                let mut a = Answer::raw_json(200, Vec::new());
                a.bookmark = Some(bookmark);
                a
            }
            Err(a) => a,
        }
    })
    .await;
    match dumped.lock().take() {
        Some(sql) if answer.status == 200 => {
            let mut h = HeaderMap::new();
            h.insert(
                "content-type",
                axum::http::HeaderValue::from_static("application/sql"),
            );
            if let Some(b) = answer
                .bookmark
                .and_then(|b| axum::http::HeaderValue::from_str(&b).ok())
            {
                h.insert(super::api::BOOKMARK_HEADER, b);
            }
            (h, sql).into_response()
        }
        _ => respond(answer).into_response(),
    }
}

/// `POST /v1/databases/{name}/import`: the body is the SQL.
pub(super) async fn import_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> HttpResponse {
    let (caller, resolved) = match caller_for(&node, &headers, &name) {
        Ok(c) => c,
        Err(a) => return respond(a).into_response(),
    };
    // The write permission is checked before the body is read.
    if !caller.may_write() {
        return respond(node.refuse(Answer::error(
            403,
            codes::AUTH,
            "an import needs a read-write token",
        )))
        .into_response();
    }
    let running = match node.transfers().start() {
        Ok(r) => r,
        Err(a) => return respond(node.refuse(a)).into_response(),
    };
    let limit = node.config().max_import_bytes;
    let body = match read_body(&node, &headers, body, limit).await {
        Ok(b) => b,
        Err(a) => return respond(a).into_response(),
    };
    respond(
        blocking(&node, move |n, token| {
            let _running = running;
            n.import(&caller, &resolved.name, &body, token)
        })
        .await,
    )
    .into_response()
}

fn unknown_link(node: &Node) -> HttpResponse {
    respond(node.refuse(Answer::error(
        404,
        codes::UNKNOWN_DATABASE,
        "no such transfer link, or it expired",
    )))
    .into_response()
}

/// `GET /v1/transfers/{token}`: an export's dump.
pub(super) async fn download_route(
    State(node): State<Arc<Node>>,
    Path(token): Path<String>,
) -> HttpResponse {
    match node.transfers().export(&token) {
        Some((filename, sql)) => {
            let disposition = format!("attachment; filename=\"{filename}\"");
            let mut h = HeaderMap::new();
            h.insert(
                "content-type",
                axum::http::HeaderValue::from_static("application/sql"),
            );
            if let Ok(v) = axum::http::HeaderValue::from_str(&disposition) {
                h.insert("content-disposition", v);
            }
            (h, sql).into_response()
        }
        None => unknown_link(&node),
    }
}

/// `PUT /v1/transfers/{token}`: an import's file.
pub(super) async fn upload_route(
    State(node): State<Arc<Node>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> HttpResponse {
    // An unknown link reads nothing.
    if !node.transfers().has_upload(&token) {
        return unknown_link(&node);
    }
    let _running = match node.transfers().start() {
        Ok(r) => r,
        Err(a) => return respond(node.refuse(a)).into_response(),
    };
    let limit = node.config().max_import_bytes;
    let body = match read_body(&node, &headers, body, limit).await {
        Ok(b) => b,
        Err(a) => return respond(a).into_response(),
    };
    let etag = format!("\"{}\"", md5_hex(&body));
    if !node.transfers().store_upload(&token, body) {
        return unknown_link(&node);
    }
    let mut h = HeaderMap::new();
    if let Ok(v) = axum::http::HeaderValue::from_str(&etag) {
        h.insert("etag", v);
    }
    (axum::http::StatusCode::OK, h).into_response()
}

impl Transfers {
    fn has_upload(&self, token: &str) -> bool {
        let mut h = self.held.lock();
        h.expire();
        h.uploads.iter().any(|u| u.token == token)
    }
}

/// MD5 of `bytes`, lowercase hex (Cloudflare's import etag).
pub(super) fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(bytes)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}
