//! The HTTP routes of a node: the framework layer over [`Node`]. Every
//! route authenticates first, before any of the body is read, then reads
//! the body within its limit and runs the request on the blocking pool
//! (SQLite, the output gate and forwarding block), cancelled if the
//! client goes away. The query routes are matched by hand ahead of the
//! router too (`hot_route`), and run the same body, [`query_answer`].

use super::answer::{respond, too_large};
use super::api::{BOOKMARK_HEADER, Shape};
use super::auth::Target;
use super::server::{Answer, Caller, Node, codes};
use crate::execution::CancelToken;
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
pub(super) struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The `Authorization` header's raw bytes.
pub(super) fn authorization(headers: &HeaderMap) -> Option<&[u8]> {
    headers.get(AUTHORIZATION).map(HeaderValue::as_bytes)
}

/// Authenticates a request for the database `name_or_id` names, marking
/// it forwarded if a replica sent it.
pub(super) fn caller_for(
    node: &Node,
    headers: &HeaderMap,
    name_or_id: &str,
) -> Result<(Caller, super::server::Resolved), Answer> {
    let (mut caller, resolved) = node.authorize_database(authorization(headers), name_or_id)?;
    caller.forwarded = headers.contains_key(super::forward::FORWARDED_HEADER);
    Ok((caller, resolved))
}

/// Reads a request body of at most `limit` bytes: a larger declared
/// length is refused unread, at most one byte past the limit is ever
/// read (never an allocation the client chose), and a body that stops
/// arriving for the node's idle timeout is refused (408), so a client
/// cannot hold a request open by sending its body slowly. A refusal is
/// counted.
pub(super) async fn read_body(
    node: &Node,
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<bytes::Bytes, Answer> {
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let idle = node.config().idle_timeout();
    let read = match declared {
        Some(n) if n > limit as u64 => Err(BodyRead::TooLarge),
        _ => collect(body, limit, idle).await,
    };
    match read {
        Ok(b) => Ok(b),
        Err(BodyRead::TooLarge) => {
            Err(node.refuse(Answer::error(413, codes::TOO_LARGE, too_large(limit))))
        }
        Err(BodyRead::Stalled) => Err(node.refuse(Answer::error(
            408,
            codes::TIMEOUT,
            format!(
                "the request body stopped arriving: nothing for {} ms",
                idle.as_millis()
            ),
        ))),
        Err(BodyRead::Failed(why)) => Err(node.refuse(Answer::error(
            400,
            codes::BAD_REQUEST,
            format!("could not read the request body: {why}"),
        ))),
    }
}

/// Collects a body of at most `limit` bytes, each frame due within
/// `idle` of the one before.
pub(super) async fn collect(
    mut body: axum::body::Body,
    limit: usize,
    idle: Duration,
) -> Result<bytes::Bytes, BodyRead> {
    use axum::body::HttpBody;
    let mut out = bytes::BytesMut::new();
    loop {
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx));
        let frame = match tokio::time::timeout(idle, next).await {
            Err(_) => return Err(BodyRead::Stalled),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(e))) => return Err(BodyRead::Failed(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers carry nothing a route reads.
        if let Ok(data) = frame.into_data() {
            if data.len() > limit.saturating_sub(out.len()) {
                return Err(BodyRead::TooLarge);
            }
            if out.is_empty() && body.is_end_stream() {
                // The whole body in one frame (the usual small request):
                // no copy.
                return Ok(data);
            }
            out.extend_from_slice(&data);
        }
    }
}

/// Largest request body parsed on the async worker rather than the
/// blocking pool: JSON of this size parses in microseconds, so it does not
/// hold up the worker's other connections.
const PARSE_ON_WORKER_BYTES: usize = 16 << 10;

/// Runs `work` on the blocking pool with a cancel token that is
/// cancelled if this future is dropped (the client went away).
pub(super) async fn blocking<F>(node: &Arc<Node>, work: F) -> Answer
where
    F: FnOnce(&Node, &CancelToken) -> Answer + Send + 'static,
{
    blocking_with(node, node.request_token(), work).await
}

/// [`blocking`] under a token the caller made.
async fn blocking_with<F>(node: &Arc<Node>, token: CancelToken, work: F) -> Answer
where
    F: FnOnce(&Node, &CancelToken) -> Answer + Send + 'static,
{
    let _cancel_on_drop = CancelOnDrop(token.clone());
    let n = Arc::clone(node);
    tokio::task::spawn_blocking(move || work(&n, &token))
        .await
        .unwrap_or_else(|e| {
            node.refuse(Answer::error(
                500,
                codes::INTERNAL,
                format!("the request failed: {e}"),
            ))
        })
}

/// A query in `shape` for the database `name_or_id` names: the route
/// body shared by `/v1/databases/{name}/query|raw` and Cloudflare's
/// `.../d1/database/{database_id}/query|raw`.
pub(super) async fn query_answer(
    node: Arc<Node>,
    name_or_id: String,
    headers: HeaderMap,
    body: axum::body::Body,
    shape: Shape,
) -> Answer {
    // Authentication first: nothing of an unauthenticated request is
    // read, not even its body. Cheap enough to run on the worker: a hash
    // and a map lookup, and a stat of the store at most once a second.
    let (caller, resolved) = match caller_for(&node, &headers, &name_or_id) {
        Ok(c) => c,
        Err(answer) => return answer,
    };
    let header = match headers.get(BOOKMARK_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(h)) => Some(h.to_string()),
        Some(Err(_)) => {
            return node.refuse(Answer::error(
                400,
                codes::BOOKMARK,
                "the bookmark header is not text",
            ));
        }
    };
    let limit = node.config().max_body_bytes;
    let body = match read_body(&node, &headers, body, limit).await {
        Ok(b) => b,
        Err(a) => return a,
    };
    if body.len() > PARSE_ON_WORKER_BYTES {
        return blocking(&node, move |n, token| {
            n.query_shaped(
                &caller,
                &resolved.name,
                header.as_deref(),
                &body,
                shape,
                token,
            )
        })
        .await;
    }
    // A small body is read here, so that a single write on a primary can
    // wait for its group commit without a blocking thread, and a short
    // read on a replica can run without one.
    let query = match node.prepare_query(&resolved.name, header.as_deref(), &body) {
        Ok(q) => q,
        Err(answer) => return node.finish_query(answer),
    };
    let token = node.request_token();
    if let Some(answer) = node.write_without_thread(&caller, &query, shape, &token) {
        let _cancel_on_drop = CancelOnDrop(token);
        return answer.await;
    }
    // A short read runs here: a hop to the blocking pool costs more than
    // the read (on a primary its answer then waits at the output gate).
    if let Some(answer) = node.read_without_thread(&caller, &query, shape, &token) {
        let _cancel_on_drop = CancelOnDrop(token);
        return answer.await;
    }
    blocking_with(&node, token, move |n, token| {
        let answer = n.dispatch(&caller, &query, header.as_deref(), &body, shape, token);
        n.finish_query(answer)
    })
    .await
}

async fn query_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    respond(query_answer(node, name, headers, body, Shape::Objects).await)
}

async fn raw_route(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> impl IntoResponse {
    respond(query_answer(node, name, headers, body, Shape::Arrays).await)
}

/// Why a request body was not read.
pub(super) enum BodyRead {
    TooLarge,
    /// Nothing arrived for the idle timeout.
    Stalled,
    Failed(String),
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
    let app = super::cloudflare::routes(Router::new())
        .route("/v1/databases/{name}/query", post(query_route))
        .route("/v1/databases/{name}/raw", post(raw_route))
        .route(
            "/v1/databases/{name}/export",
            post(super::transfer::export_route),
        )
        .route(
            "/v1/databases/{name}/import",
            post(super::transfer::import_route),
        )
        .route(
            "/v1/transfers/{token}",
            get(super::transfer::download_route).put(super::transfer::upload_route),
        )
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
    let for_serving = Arc::clone(&node);
    let thread = std::thread::Builder::new()
        .name("walrelay-http-main".into())
        .spawn(move || {
            let mut stop = rx.clone();
            let serving = super::listen::serve_bounded(listener, app, for_serving, rx);
            runtime.block_on(async move {
                // Graceful: no new connections, in-flight requests finish
                // (they were cancelled) — but for at most `grace`.
                tokio::select! {
                    _ = serving => {}
                    _ = async {
                        super::listen::stopped(&mut stop).await;
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
