//! Several frames, each to its own connection, written by their sender
//! with one system call: a primary's Appends of one record to every peer.
//!
//! One `sendmsg` per socket lets each woken receiver preempt the sender
//! on its way back from the call (the kernel runs the receiver's TCP and
//! wakes it inside the send, on loopback on the sender's CPU), so the
//! fifth follower heard of a record only after four others had run. Here
//! the sends go into a small io_uring of the sending thread's own, all in
//! one `io_uring_enter`: each completes inline (non-blocking, so never
//! queued in the kernel), and the sender is preempted at most once.
//!
//! Each frame is sealed under its outlet's lock and written while that lock
//! is held, as [`super::outlet::Outlet::send`] does; the locks are taken in
//! connection order, so two senders cannot wait on each other.

use super::outlet::{Sealed, iovecs};
use io_uring::{IoUring, opcode, types};
use std::cell::RefCell;
use std::io;

/// Per frame, what its write returned (None: not written by its sender).
type Written = Vec<Option<io::Result<usize>>>;

/// A batch holds at most this many frames (the thread's ring's size).
pub(super) const MAX_BATCH: usize = 16;

thread_local! {
    /// The sending thread's ring; None until its first batch, or where
    /// io_uring refused one (then frames are written one by one).
    static RING: RefCell<Option<Option<IoUring>>> = const { RefCell::new(None) };
}

/// Writes every writable frame of `frames` (at most [`MAX_BATCH`]) and
/// returns, per frame, what its write returned (None: not written by
/// the sender), in order.
pub(super) fn write_all(frames: &[Sealed<'_>]) -> Written {
    assert!(
        frames.len() <= MAX_BATCH,
        "a batch is at most {MAX_BATCH} frames"
    );
    RING.with(|cell| {
        let mut cell = cell.borrow_mut();
        let ring = cell.get_or_insert_with(|| IoUring::new(MAX_BATCH as u32).ok());
        let Some(r) = ring else {
            return frames.iter().map(one_by_one).collect();
        };
        match submit(r, frames) {
            Ok(out) => out,
            Err(mut out) => {
                // The ring is closed and not used again. A frame without a
                // completion was not taken by the kernel (a non-blocking
                // send that was taken completed in its submission): it goes
                // to its connection's ring whole.
                *ring = None;
                for (o, f) in out.iter_mut().zip(frames) {
                    if o.is_none() && f.writable() {
                        *o = Some(Err(io::ErrorKind::WouldBlock.into()));
                    }
                }
                out
            }
        }
    })
}

fn one_by_one(frame: &Sealed<'_>) -> Option<io::Result<usize>> {
    frame.writable().then(|| frame.write())
}

/// The frames' results; `Err` (with what did complete) if the ring failed.
fn submit(ring: &mut IoUring, frames: &[Sealed<'_>]) -> Result<Written, Written> {
    let mut out: Written = (0..frames.len()).map(|_| None).collect();
    // Each message header and its iovecs stay put until every completion
    // is reaped below.
    let mut iovs: Vec<([libc::iovec; 3], usize)> =
        frames.iter().map(|f| iovecs(&f.parts)).collect();
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msgs: Vec<libc::msghdr> = (0..frames.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    let mut queued = 0usize;
    for (i, frame) in frames.iter().enumerate() {
        if !frame.writable() {
            continue;
        }
        if iovs[i].1 == 0 {
            out[i] = Some(Ok(0));
            continue;
        }
        msgs[i].msg_iov = iovs[i].0.as_mut_ptr();
        msgs[i].msg_iovlen = iovs[i].1;
        let sqe = opcode::SendMsg::new(types::Fd(frame.fd()), &raw const msgs[i])
            .flags((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32)
            .build()
            .user_data(i as u64);
        // SAFETY: the entry points at `msgs[i]` and, through it, at
        // `iovs[i]` and the frame's parts, none of which moves or is freed
        // before this function returns. Every entry the kernel takes is a
        // non-blocking send (MSG_DONTWAIT: io_uring completes it, with
        // EAGAIN if the socket is full, inside the submission instead of
        // arming a retry; the test below holds it to that), so it has
        // completed when `submit_and_wait` returns. An entry not taken
        // when the call fails is never submitted: the ring is then closed
        // (`write_all`).
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            out[i] = Some(frame.write()); // cannot happen: the ring holds a batch
            continue;
        }
        queued += 1;
    }
    if queued == 0 {
        return Ok(out);
    }
    let mut reaped = 0usize;
    loop {
        match ring.submit_and_wait(queued - reaped) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                drain(ring, &mut out, &mut reaped);
                tracing::warn!(
                    error = %e,
                    "a batched send's io_uring_enter failed; the thread's frames go one by one from now on"
                );
                return Err(out);
            }
        }
        drain(ring, &mut out, &mut reaped);
        if reaped == queued {
            return Ok(out);
        }
    }
}

fn drain(ring: &mut IoUring, out: &mut [Option<io::Result<usize>>], reaped: &mut usize) {
    for cqe in ring.completion() {
        let i = cqe.user_data() as usize;
        let r = cqe.result();
        out[i] = Some(if r >= 0 {
            Ok(r as usize)
        } else {
            Err(io::Error::from_raw_os_error(-r))
        });
        *reaped += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::outlet::Outlet;
    use super::*;
    use bytes::Bytes;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    #[test]
    fn a_full_socket_answers_would_block_at_once_and_never_holds_the_sender() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let a = TcpStream::connect(addr).expect("connect");
        let b = TcpStream::connect(addr).expect("connect");
        // Accepted and never read: their senders' buffers fill.
        let (_ra, _) = listener.accept().expect("accept");
        let (_rb, _) = listener.accept().expect("accept");
        let (oa, ob) = (Outlet::new(a, None), Outlet::new(b, None));
        let chunk = Bytes::from(vec![1u8; 256 * 1024]);
        let started = Instant::now();
        let mut blocked = false;
        for _ in 0..1_000 {
            let frames: Vec<Sealed<'_>> = [&oa, &ob]
                .iter()
                .map(|o| o.seal(chunk.clone(), Bytes::new(), true).expect("open"))
                .collect();
            let out = write_all(&frames);
            assert_eq!(out.len(), 2);
            if out.iter().any(|r| {
                matches!(r, Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock)
                    || matches!(r, Some(Ok(n)) if *n < chunk.len())
            }) {
                blocked = true;
                break;
            }
        }
        assert!(blocked, "the sockets never filled");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a full socket held the sender"
        );
        // Full: the next batch answers at once, taking nothing.
        let t = Instant::now();
        let frames: Vec<Sealed<'_>> = [&oa, &ob]
            .iter()
            .map(|o| o.seal(chunk.clone(), Bytes::new(), true).expect("open"))
            .collect();
        let out = write_all(&frames);
        assert!(t.elapsed() < Duration::from_secs(1), "a batch waited");
        for r in out {
            match r {
                Some(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
                Some(Ok(n)) => assert!(n < chunk.len(), "a full socket took a whole frame"),
                None => panic!("a direct frame was not written"),
            }
        }
    }
}
