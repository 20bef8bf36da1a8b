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
//!
//! Applied around the router to every request of a connection
//! (`listen.rs`): [`watch`] before it runs, [`mark`] on its answer.

use axum::body::{Bytes, HttpBody};
use axum::http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use axum::http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// Set once a request's body has been read to its end.
pub(super) type Ended = Arc<AtomicBool>;

/// The request with its body watched, and the flag to check once it is
/// answered (None: it declared no body, nothing to read).
pub(super) fn watch(request: Request<Incoming>) -> (Request<Watched>, Option<Ended>) {
    let ended = declares_body(request.headers()).then(|| Arc::new(AtomicBool::new(false)));
    let flag = ended.clone();
    (request.map(|inner| Watched { inner, ended: flag }), ended)
}

/// Marks `response` `Connection: close` when its request's body was not
/// read to its end.
pub(super) fn mark<B>(response: &mut Response<B>, ended: Option<&AtomicBool>) {
    if ended.is_some_and(|e| !e.load(Ordering::Acquire)) {
        tracing::debug!("answered before the request body was read: the connection closes");
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
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
pub(super) struct Watched {
    inner: Incoming,
    ended: Option<Ended>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // The end is the last frame for a reader that stops on
        // `is_end_stream`, or the `None` after it for one that does not.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if ended && let Some(e) = &self.ended {
            e.store(true, Ordering::Release);
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
