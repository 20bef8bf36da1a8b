//! A connection's sending side, shared by the threads that send and the
//! ring thread.
//!
//! A frame sent from a thread other than the ring's goes straight into
//! the socket with one non-blocking `sendmsg` when the ring has nothing of
//! that connection's to send: no command, no wake-up of the ring thread,
//! one thread hop less before the first byte leaves (on a primary, the
//! committing session sends its own Append). Everything else goes to the
//! ring as before: frames sent from the ring thread itself (they are
//! batched into its next submission), and every frame behind one the ring
//! still holds, so frames leave in the order they were sealed.
//!
//! # Who may write the socket
//!
//! The ring *owns* the connection's sends from the moment a frame is
//! posted to it until its queue is empty, nothing is in flight and no
//! posted frame waits in its inbox; it then hands the connection back
//! ([`Outlet::release`]). Each frame is tagged ([`Sealer`]) and either
//! written or posted under the outlet's lock, so tags and bytes on the wire
//! follow one order. A direct write that the socket takes only in part
//! (its buffer is full) posts the rest to the ring, which then owns the
//! connection: a slow peer is waited for by the ring, with its write
//! timeout and queue bound, never by the sender.
//!
//! A sender with frames for several connections at once (a record's
//! Appends) seals each ([`Outlet::seal`], which holds the outlet's lock
//! in the [`Sealed`] frame), writes them all with one system call
//! (`batch`), and finishes each ([`Sealed::finish`]), posting what a
//! socket did not take, as `send` does for one. A sender with several
//! frames for one connection (a lazy follower's batch) seals them all
//! under one hold of the lock and writes them with one `sendmsg`
//! ([`Outlet::send_run`]).
//!
//! A connection that is closing, failed or closed takes no more frames.

use super::super::auth::Sealer;
use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// One frame: its header, its (possibly shared) body and its tag, each
/// possibly empty.
pub(super) type Parts = [Bytes; 3];

/// See the module docs.
pub(super) struct Outlet {
    /// The socket, through a descriptor of the outlet's own (the ring's
    /// may be closed first); written only with `MSG_DONTWAIT`.
    stream: TcpStream,
    state: Mutex<State>,
}

struct State {
    seal: Option<Sealer>,
    /// The ring holds frames of this connection (queued, in flight, or
    /// posted and not yet taken): every frame goes to it.
    ring_owns: bool,
    /// Frames posted to the ring and not yet taken from its inbox.
    posted: usize,
    /// Closing, failed or closed: frames are dropped.
    shut: bool,
    /// Frames the socket took whole from their sender, and frames (or
    /// their rests) posted to the ring.
    direct: u64,
    ringed: u64,
}

impl State {
    /// The tag of the next frame (empty without a cluster key).
    fn tag(&mut self, head: &Bytes, body: &Bytes) -> Bytes {
        self.seal
            .as_mut()
            .map(|seal| seal.seal(head, body))
            .unwrap_or_default()
    }

    /// One frame (or its rest) was posted to the ring, which now owns the
    /// connection's sends.
    fn posted_to_ring(&mut self) {
        self.ring_owns = true;
        self.posted += 1;
        self.ringed += 1;
    }
}

/// What [`Outlet::send`] did with a frame.
pub(super) enum Sent {
    /// The socket took all of it, or the connection takes no more.
    Done,
    /// The ring must send these parts (all of the frame, or its rest),
    /// posted by the closure given, under the outlet's lock.
    Posted,
    /// The socket refused the write: the connection must fail.
    Failed(io::Error),
}

/// A frame tagged under its outlet's lock, which it holds: written (or
/// not) and then finished, so that frames leave in the order they were
/// sealed.
pub(super) struct Sealed<'a> {
    state: parking_lot::MutexGuard<'a, State>,
    pub(super) parts: Parts,
    direct: bool,
    fd: std::os::fd::RawFd,
}

impl Sealed<'_> {
    /// Whether the sender writes this frame into the socket itself.
    pub(super) fn writable(&self) -> bool {
        self.direct
    }

    /// The socket the frame is written to.
    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.fd
    }

    /// One non-blocking `sendmsg` of the frame; how many bytes the socket
    /// took (`WouldBlock` when none).
    pub(super) fn write(&self) -> io::Result<usize> {
        write_some(self.fd, &self.parts)
    }

    /// Ends the send: `written` is what the sender's write returned (None:
    /// no write was made); what is left goes to the ring through `post`.
    pub(super) fn finish(
        mut self,
        written: Option<io::Result<usize>>,
        post: impl FnOnce(Parts) -> bool,
    ) -> Sent {
        match written {
            Some(Ok(n)) => {
                advance(&mut self.parts, n);
                if self.parts.iter().all(|p| p.is_empty()) {
                    self.state.direct += 1;
                    return Sent::Done;
                }
            }
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Some(Err(e)) => {
                // The ring reports the connection closed; nothing more is
                // written to it.
                self.state.shut = true;
                return Sent::Failed(e);
            }
            None => {}
        }
        let parts = std::mem::take(&mut self.parts);
        if post(parts) {
            self.state.posted_to_ring();
        }
        Sent::Posted
    }
}

impl Outlet {
    pub(super) fn new(stream: TcpStream, seal: Option<Sealer>) -> Outlet {
        Outlet {
            stream,
            state: Mutex::new(State {
                seal,
                ring_owns: false,
                posted: 0,
                shut: false,
                direct: 0,
                ringed: 0,
            }),
        }
    }

    /// Tags the frame `head` + `body` and writes it into the socket at once
    /// when `direct` and the ring holds nothing of this connection's;
    /// otherwise (or for what the socket did not take) calls `post` with
    /// the parts, still under the lock, so nothing sealed later can pass
    /// it. `post` says whether the ring took the command.
    pub(super) fn send(
        &self,
        head: Bytes,
        body: Bytes,
        direct: bool,
        post: impl FnOnce(Parts) -> bool,
    ) -> Sent {
        let Some(sealed) = self.seal(head, body, direct) else {
            return Sent::Done;
        };
        let written = sealed.writable().then(|| sealed.write());
        sealed.finish(written, post)
    }

    /// Tags the frame under the outlet's lock, which the returned frame
    /// holds until [`Sealed::finish`]: None if the connection takes no
    /// more frames. A frame to write at once is [`Sealed::writable`].
    pub(super) fn seal(&self, head: Bytes, body: Bytes, direct: bool) -> Option<Sealed<'_>> {
        let mut s = self.state.lock();
        if s.shut {
            return None;
        }
        let tag = s.tag(&head, &body);
        let direct = direct && !s.ring_owns;
        Some(Sealed {
            state: s,
            parts: [head, body, tag],
            direct,
            fd: self.stream.as_raw_fd(),
        })
    }

    /// Tags each frame of `frames`, a run to this one connection, in order,
    /// and writes as many as the socket takes with one `sendmsg` per
    /// [`MAX_RUN`] frames when `direct` and the ring holds nothing of this
    /// connection's; posts the rest (the rest of a frame the socket took in
    /// part, and every frame after it), in order, through `post`, under the
    /// lock, as [`Outlet::send`] does for one frame. A lazy follower's
    /// batch so costs its sender one system call and its receiver one
    /// wake-up, not one per record.
    pub(super) fn send_run(
        &self,
        frames: impl IntoIterator<Item = (Bytes, Bytes)>,
        direct: bool,
        mut post: impl FnMut(Parts) -> bool,
    ) -> Sent {
        let mut s = self.state.lock();
        if s.shut {
            return Sent::Done;
        }
        let mut run: Vec<Parts> = frames
            .into_iter()
            .map(|(head, body)| {
                let tag = s.tag(&head, &body);
                [head, body, tag]
            })
            .collect();
        // The first frame not yet wholly in the socket.
        let mut next = 0;
        if direct && !s.ring_owns {
            while next < run.len() {
                let end = run.len().min(next + MAX_RUN);
                let wanted: usize = run[next..end].iter().flatten().map(Bytes::len).sum();
                let taken = match write_run(self.stream.as_raw_fd(), &run[next..end]) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => {
                        // As for one frame: the ring reports the connection
                        // closed; nothing more is written to it.
                        s.shut = true;
                        return Sent::Failed(e);
                    }
                };
                let mut left = taken;
                while next < end {
                    let len: usize = run[next].iter().map(Bytes::len).sum();
                    if left < len {
                        advance(&mut run[next], left);
                        break;
                    }
                    left -= len;
                    s.direct += 1;
                    next += 1;
                }
                if taken < wanted {
                    break;
                }
            }
        }
        if next == run.len() {
            return Sent::Done;
        }
        for parts in run.drain(next..) {
            if post(parts) {
                s.posted_to_ring();
            }
        }
        Sent::Posted
    }

    /// Frames written directly and frames posted to the ring, so far.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.direct, s.ringed)
    }

    /// Takes no more frames (the connection is closing or failed).
    pub(super) fn shut(&self) {
        self.state.lock().shut = true;
    }

    /// The ring took one posted frame from its inbox.
    pub(super) fn taken(&self) {
        let mut s = self.state.lock();
        // Posted frames are counted before they can be taken.
        assert!(s.posted > 0, "a frame taken that was never posted");
        s.posted -= 1;
    }

    /// The ring has nothing of this connection's left to send: direct
    /// writes may start again, unless a frame posted meanwhile is still on
    /// its way to the ring.
    pub(super) fn release(&self) {
        let mut s = self.state.lock();
        if s.posted == 0 {
            s.ring_owns = false;
        }
    }
}

/// One non-blocking `sendmsg` of the non-empty parts; how many bytes the
/// socket took (`WouldBlock` when none).
fn write_some(fd: std::os::fd::RawFd, parts: &Parts) -> io::Result<usize> {
    let (mut iov, count) = iovecs(parts);
    if count == 0 {
        return Ok(0);
    }
    sendmsg(fd, &mut iov[..count])
}

/// At most this many frames go into one `sendmsg` of a run (each frame
/// is up to three iovecs; Linux takes at most 1,024).
pub(super) const MAX_RUN: usize = 256;

/// One non-blocking `sendmsg` of every non-empty part of `frames`; how
/// many bytes the socket took (`WouldBlock` when none).
fn write_run(fd: std::os::fd::RawFd, frames: &[Parts]) -> io::Result<usize> {
    assert!(
        frames.len() <= MAX_RUN,
        "a run's write is at most {MAX_RUN} frames"
    );
    let mut iov: Vec<libc::iovec> = frames
        .iter()
        .flatten()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    if iov.is_empty() {
        return Ok(0);
    }
    sendmsg(fd, &mut iov)
}

/// One non-blocking `sendmsg` of `iov`, retried if interrupted.
fn sendmsg(fd: std::os::fd::RawFd, iov: &mut [libc::iovec]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    loop {
        // SAFETY: `msg` points at `iov`, whose entries point into buffers
        // the caller holds for the call; the kernel only reads them. A
        // stale `fd` would fail the call, not touch memory.
        let n =
            unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The non-empty parts as iovecs, and how many there are.
pub(super) fn iovecs(parts: &Parts) -> ([libc::iovec; 3], usize) {
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iov = [empty; 3];
    let mut count = 0;
    for p in parts.iter().filter(|p| !p.is_empty()) {
        iov[count] = libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        };
        count += 1;
    }
    (iov, count)
}

/// Drops the first `n` bytes of `parts`.
fn advance(parts: &mut Parts, mut n: usize) {
    for p in parts.iter_mut() {
        let k = n.min(p.len());
        p.advance(k);
        n -= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(a: &'static [u8], b: &'static [u8], c: &'static [u8]) -> Parts {
        [
            Bytes::from_static(a),
            Bytes::from_static(b),
            Bytes::from_static(c),
        ]
    }

    #[test]
    fn a_run_the_socket_takes_in_part_leaves_the_rest_from_inside_a_frame_to_the_ring_in_order() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let sender = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut receiver, _) = listener.accept().expect("accept");
        // Small buffers on both ends (the kernel rounds them up a little),
        // so that a run of under a megabyte fills them.
        small_buffer(&sender, libc::SO_SNDBUF);
        small_buffer(&receiver, libc::SO_RCVBUF);
        let outlet = Outlet::new(sender, None);
        let frames: Vec<(Bytes, Bytes)> = (0..300u32)
            .map(|i| {
                let head = Bytes::from(i.to_le_bytes().to_vec());
                let body = Bytes::from(vec![(i % 251) as u8; 2_000 + i as usize]);
                (head, body)
            })
            .collect();
        let wanted: Vec<u8> = frames
            .iter()
            .flat_map(|(h, b)| h.iter().chain(b.iter()).copied())
            .collect();
        let mut posted: Vec<Parts> = Vec::new();
        let sent = outlet.send_run(frames, true, |parts| {
            posted.push(parts);
            true
        });
        assert!(matches!(sent, Sent::Posted), "the socket took all of it");
        let (direct, ringed) = outlet.counts();
        assert_eq!(direct + ringed, 300, "a frame was lost or counted twice");
        assert!(ringed > 0, "the socket took the whole run");
        assert!(direct > 0, "the socket took no whole frame");
        // The socket holds the first `direct` frames and part of the next
        // (or a whole next one's start), the posted parts the rest.
        let from_ring: Vec<u8> = posted
            .iter()
            .flatten()
            .flat_map(|p| p.iter().copied())
            .collect();
        let in_socket = wanted.len() - from_ring.len();
        let mut got = vec![0u8; in_socket];
        std::io::Read::read_exact(&mut receiver, &mut got).expect("what the socket took");
        got.extend(from_ring);
        assert!(got == wanted, "the run's bytes are not the frames in order");
        // The ring now holds the connection: a later frame is posted too.
        let later = outlet.send(Bytes::from_static(b"x"), Bytes::new(), true, |_| true);
        assert!(matches!(later, Sent::Posted), "a frame passed the ring's");
    }

    fn small_buffer(socket: &TcpStream, option: libc::c_int) {
        let bytes: libc::c_int = 4096;
        // SAFETY: the option's value is a c_int that outlives the call; a
        // bad descriptor or option fails the call, checked below.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&raw const bytes).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "setsockopt: {}", io::Error::last_os_error());
    }

    #[test]
    fn advancing_past_whole_parts_leaves_the_rest_of_the_next() {
        let mut p = parts(b"head", b"body", b"tag");
        advance(&mut p, 6);
        assert_eq!(p, parts(b"", b"dy", b"tag"));
        advance(&mut p, 5);
        assert!(p.iter().all(|x| x.is_empty()));
    }
}
