//! Accepting a node's HTTP connections, within bounds.
//!
//! - **Connections:** at most [`HttpConfig::max_connections`] are open at
//!   once. One more is answered at once with a 503 in D1's error shape
//!   (`Retry-After: 1`, `Connection: close`) and closed, so a client that
//!   opens connections without end cannot take the process's
//!   descriptors (SQLite's files and the replication sockets need them).
//! - **Idle time:** a connection waiting for a request head for
//!   [`HttpConfig::idle_timeout_ms`] is closed, whether it sits idle
//!   between keep-alive requests or sends a head byte by byte. A request
//!   being answered is not timed here: its query has its own time limit.
//!   Nor may an answer wait that long for the client to take any of it
//!   (`write_timeout`).
//! - **Stopping:** no new connections; open ones finish the request in
//!   hand (the node cancels it) and close. A request still running when
//!   the grace period ([`SHUTDOWN_GRACE_MS`]) is nearly over, such as a
//!   write whose quorum does not answer, is answered 503 with its outcome
//!   unknown rather than left to a dropped connection.
//!
//! Answers go out at once: without TCP_NODELAY a response written in two
//! parts waits for the client's delayed ACK (tens of milliseconds)
//! whenever Nagle holds the second.
//!
//! [`HttpConfig::max_connections`]: super::server::HttpConfig::max_connections
//! [`HttpConfig::idle_timeout_ms`]: super::server::HttpConfig::idle_timeout_ms
//! [`SHUTDOWN_GRACE_MS`]: super::server::SHUTDOWN_GRACE_MS

use super::hot_route::Routed;
use super::server::{Answer, Node, SHUTDOWN_GRACE_MS, codes};
use axum::Router;
use hyper::server::conn::http1;
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

/// How often a node at its connection limit says so.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// How long before a stopping server's grace period ends a request still
/// running is answered instead ([`unfinished`]): time to write the answer
/// before the connections are dropped.
const UNFINISHED_MARGIN_MS: u64 = 300;
const _: () = assert!(UNFINISHED_MARGIN_MS < SHUTDOWN_GRACE_MS);

/// Serves `app` on `listener` until `stop` turns true, then waits for the
/// open connections to finish.
pub(super) async fn serve_bounded(
    listener: TcpListener,
    app: Router,
    node: Arc<Node>,
    mut stop: watch::Receiver<bool>,
) {
    let max = node.config().max_connections;
    let idle = node.config().idle_timeout();
    let slots = Arc::new(Semaphore::new(max));
    // Each connection holds a receiver: `closed` is when the last is gone.
    let (all_closed, open) = watch::channel(());
    // Refusals are warned about at most every WARN_EVERY, with a count.
    let (mut refused, mut warned_at) = (0u64, None::<Instant>);
    loop {
        let stream = tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or the peer gave up before the
                    // accept: wait a little rather than spin.
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refused += 1;
            if warned_at.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                tracing::warn!(
                    max_connections = max,
                    refused,
                    "HTTP connections at their limit: refusing more with 503 until some close"
                );
                (refused, warned_at) = (0, Some(Instant::now()));
            }
            refuse(&node, &stream, max);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an HTTP connection");
        }
        let router = TowerToHyperService::new(app.clone());
        let (for_requests, node_for_requests) = (stop.clone(), Arc::clone(&node));
        let service = service_fn(move |request| {
            let (request, ended) = super::unread_body::watch(request);
            let routed = Routed::new(request, |request| router.call(request));
            let mut stop = for_requests.clone();
            let node = Arc::clone(&node_for_requests);
            async move {
                let mut response = tokio::select! {
                    biased;
                    r = routed.answer(&node) => r,
                    () = grace_nearly_over(&mut stop) => unfinished(&node),
                };
                super::unread_body::mark(&mut response, ended.as_deref());
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let mut stop = stop.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _open = open;
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(idle);
            let stream = super::write_timeout::WriteTimed::new(stream, idle);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::trace!(error = %e, "an HTTP connection ended");
                    }
                }
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    drop(open);
    all_closed.closed().await;
}

/// Until `stop` turns true (or its sender is gone).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Until a stopping server's grace period is nearly over (never while it
/// serves).
async fn grace_nearly_over(stop: &mut watch::Receiver<bool>) {
    stopped(stop).await;
    if stop.has_changed().is_err() && !*stop.borrow() {
        // The sender is gone without a stop: not a stop.
        return std::future::pending().await;
    }
    tokio::time::sleep(Duration::from_millis(
        SHUTDOWN_GRACE_MS - UNFINISHED_MARGIN_MS,
    ))
    .await;
}

/// The answer to a request still running as the node stops (its future
/// is dropped, which cancels what it ran): a 503 whose outcome is unknown,
/// since a write may have committed and may yet become durable.
fn unfinished(node: &Node) -> axum::response::Response {
    let mut answer = Answer::error(
        503,
        codes::UNAVAILABLE,
        "this node stopped before the request finished: its outcome is unknown (a write may \
         have committed, and may still become durable); read it back before retrying a write",
    );
    answer.retry_after_s = Some(1);
    super::answer::response(node.refuse(answer))
}

/// Answers a connection past the limit with a 503 and closes it. The
/// answer is a few hundred bytes into a fresh socket's empty send buffer:
/// it is written at once or not at all, never waited on.
fn refuse(node: &Node, stream: &TcpStream, max: usize) {
    let answer = Answer::error(
        503,
        codes::UNAVAILABLE,
        format!("this node has {max} HTTP connections open, its limit: retry shortly"),
    );
    node.count_refusal(answer.status);
    let mut raw = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        answer.body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&answer.body);
    if let Err(e) = stream.try_write(&raw) {
        tracing::debug!(error = %e, "a refused HTTP connection was not told why");
    }
}
