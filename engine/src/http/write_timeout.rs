//! A connection that takes none of its answer for a while is closed.
//!
//! hyper times how long a request head takes to arrive, but not how long
//! an answer takes to leave: a client that sends requests and never reads
//! the answers would hold each answer (up to the response limit) and its
//! connection slot for as long as it stays connected. [`WriteTimed`]
//! wraps a connection's socket: a write that makes no progress for the
//! timeout fails with `TimedOut`, and hyper closes the connection. A
//! write that goes through at once (nearly all of them) arms no timer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A socket whose writes fail after `timeout` without progress.
pub(super) struct WriteTimed<S> {
    inner: S,
    timeout: Duration,
    /// Armed while a write waits; dropped when one makes progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteTimed<S> {
    pub(super) fn new(inner: S, timeout: Duration) -> WriteTimed<S> {
        WriteTimed {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// What a write's poll means, with the timer: progress disarms it, a
    /// wait arms it (once) and fails once it fires.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => {
                let timeout = self.timeout;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        tracing::debug!(
                            timeout_ms = timeout.as_millis() as u64,
                            "an HTTP client took none of its answer: the connection closes"
                        );
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client took none of the answer in time",
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.timed(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.timed(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.timed(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
