//! `Connection: close` on an answer given before its request's body was
//! read to the end.
//!
//! Routes refuse some requests unread on purpose: nothing of an
//! unauthenticated request is read, and a body declared larger than its
//! limit is refused before a byte of it arrives. hyper then cannot reuse
//! the connection (the rest of the body is still on its way) and closes
//! it after the answer; without a `Connection: close` header a client
//! that pools connections learns that only when its next request on that
//! connection fails. So every answer whose request body was not read to
//! its end says so, and the client opens a new connection instead.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// The middleware: runs the route with the body watched, and marks the
/// answer `Connection: close` when the body was not read to its end.
pub(super) async fn close_if_unread(request: Request, next: Next) -> Response {
    if !declares_body(request.headers()) {
        return next.run(request).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let watched = Arc::clone(&ended);
    let request = request.map(|inner| {
        Body::new(Watched {
            inner,
            ended: watched,
        })
    });
    let mut response = next.run(request).await;
    if !ended.load(Ordering::Acquire) {
        tracing::debug!("answered before the request body was read: the connection closes");
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Whether a request carries a body: a non-zero `Content-Length`, or any
/// `Transfer-Encoding` (chunked).
fn declares_body(headers: &HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// A request body that records when it has been read to its end.
struct Watched {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // The end is the last frame for a reader that stops on
        // `is_end_stream`, or the `None` after it for one that does not.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_declares_a_body_by_a_non_zero_length_or_a_transfer_encoding() {
        let with = |name, value| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            declares_body(&h)
        };
        assert!(!declares_body(&HeaderMap::new()));
        assert!(!with(CONTENT_LENGTH, "0"));
        assert!(with(CONTENT_LENGTH, "12"));
        assert!(with(TRANSFER_ENCODING, "chunked"));
    }
}
