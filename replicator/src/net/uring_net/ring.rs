//! The ring thread: its connections, their requests and completions.
//!
//! Soundness rests on one rule: whatever a request points at (a receive
//! buffer, an iovec array, a msghdr, the tick's timespec, a socket) is owned
//! by a boxed connection or by the ring state and is neither moved, touched
//! nor freed until that request's completion has been reaped. A connection
//! is dropped only with nothing in flight; the ring state is dropped only
//! once every request has completed, and leaked otherwise (a fatal ring
//! error, a panicking handler).

use super::super::auth::Opener;
use super::super::{MAX_QUEUED_BYTES, READ_CHUNK, WRITE_TIMEOUT};
use super::outlet::{Outlet, Parts};
use super::{Cmd, ConnId, Shared};
use bytes::{Buf, Bytes, BytesMut};
use io_uring::{IoUring, Probe, opcode, squeue, types};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Below this much free room a receive buffer grows before the next recv.
const MIN_RECV: usize = 16 * 1024;
/// The kernel caps one recv near 2 GiB; the result must fit an i32.
const MAX_RECV: usize = 1 << 30;
/// The kernel's `UIO_MAXIOV`: a sendmsg with more iovecs fails.
const MAX_IOVECS: usize = 1024;
const RING_ENTRIES: u32 = 256;
/// How often stalled sends are looked for (only while some are in flight).
const TICK: Duration = Duration::from_millis(500);
/// Linux's `MSG_NOSIGNAL`: EPIPE instead of SIGPIPE, whatever the host
/// process does with the signal.
const MSG_NOSIGNAL: u32 = 0x4000;

// What a completion is for: user_data is `conn << 3 | kind`.
const WAKE: u64 = 1;
const TICKED: u64 = 2;
const RECV: u64 = 3;
const SEND: u64 = 4;
const CANCEL: u64 = 5;

/// The transport's ring, made and checked on the thread that runs it.
///
/// Where the kernel has them (6.1 and later), the ring is made for one
/// issuing thread that runs its completions' work only when it asks for
/// completions (`SINGLE_ISSUER`, `DEFER_TASKRUN`, `COOP_TASKRUN`): a peer's
/// bytes arriving while the ring thread is busy no longer interrupt it,
/// and its completions are gathered in one go when it next waits.
/// `TASKRUN_FLAG` tells a submission that does not wait (a full queue)
/// that completion work is pending, so it runs it too. The thread that
/// makes the ring is its issuer. Older kernels refuse the flags and get a
/// plain ring. 1 session in process, alternated 6 times: 1,418 against
/// 1,206 commits/s (papers/performance.md, lever 22).
pub(super) fn new_ring() -> io::Result<IoUring> {
    let flagged = IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES);
    let ring = match flagged {
        Ok(ring) => ring,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::new(RING_ENTRIES)?,
        Err(e) => return Err(e),
    };
    // Without NODROP an overflowing completion queue loses completions,
    // and with them the knowledge that a buffer is free again.
    if !ring.params().is_feature_nodrop() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring too old (no IORING_FEAT_NODROP)",
        ));
    }
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for code in [
        opcode::Recv::CODE,
        opcode::SendMsg::CODE,
        opcode::AsyncCancel::CODE,
        opcode::Timeout::CODE,
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring lacks opcode {code}"),
            ));
        }
    }
    Ok(ring)
}

fn user_data(conn: ConnId, kind: u64) -> u64 {
    conn << 3 | kind
}

/// The kernel's `struct iovec`.
#[repr(C)]
struct IoVec {
    base: *const u8,
    len: usize,
}

/// The kernel's `struct user_msghdr`, what `sendmsg` reads (the crate's
/// opcode wants libc's, which this crate does not link; same layout).
#[repr(C)]
struct MsgHdr {
    name: *mut u8,
    name_len: u32,
    iov: *const IoVec,
    iov_len: usize,
    control: *mut u8,
    control_len: usize,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<MsgHdr>() == 7 * std::mem::size_of::<usize>());
const _: () = assert!(std::mem::size_of::<IoVec>() == 2 * std::mem::size_of::<usize>());

impl MsgHdr {
    const EMPTY: MsgHdr = MsgHdr {
        name: std::ptr::null_mut(),
        name_len: 0,
        iov: std::ptr::null(),
        iov_len: 0,
        control: std::ptr::null_mut(),
        control_len: 0,
        flags: 0,
    };
}

/// One connection, as the ring thread sees it. Boxed: requests point into
/// it (`rbuf`'s spare room, `iov`, `msg`), so it must never move.
struct Conn {
    stream: TcpStream,
    /// The handler knows of it: reading may start, `closed` is reported.
    started: bool,
    /// `close` was called: deliver nothing more, flush, then shut down.
    closing: bool,
    /// Failed or shut down, with the reason to report once nothing is in
    /// flight.
    dead: Option<Option<String>>,
    rbuf: BytesMut,
    receiving: bool,
    queue: VecDeque<Bytes>,
    /// Bytes queued or in flight, not yet taken by the kernel.
    queued: u64,
    /// The buffers of the sendmsg in flight (kept alive until it completes).
    out: Vec<Bytes>,
    iov: Vec<IoVec>,
    msg: MsgHdr,
    sending: bool,
    sent_at: Instant,
    /// Under a key: checks the tags of what arrives (what leaves is
    /// tagged by its sender, in `outlet`).
    open: Option<Opener>,
    /// The sending side other threads share: the ring owns it while it
    /// holds any of the connection's frames.
    outlet: Arc<Outlet>,
}

impl Conn {
    fn new(stream: TcpStream, open: Option<Opener>, outlet: Arc<Outlet>) -> Box<Conn> {
        Box::new(Conn {
            open,
            outlet,
            stream,
            started: false,
            closing: false,
            dead: None,
            rbuf: BytesMut::new(),
            receiving: false,
            queue: VecDeque::new(),
            queued: 0,
            out: Vec::new(),
            iov: Vec::new(),
            msg: MsgHdr::EMPTY,
            sending: false,
            sent_at: Instant::now(),
        })
    }
}

/// The ring thread's state.
pub(super) struct Ring {
    ring: IoUring,
    shared: Arc<Shared>,
    conns: HashMap<ConnId, Box<Conn>>,
    /// Requests made but not yet in the submission queue (it was full).
    backlog: VecDeque<squeue::Entry>,
    /// Requests made whose completion has not been reaped yet.
    in_flight: u64,
    wake_rx: UnixStream,
    wake_buf: Box<[u8; 64]>,
    tick: Box<types::Timespec>,
    ticking: bool,
    /// Connections with a sendmsg in flight.
    sending: usize,
    stopping: bool,
    /// Set when the kernel may still hold requests we can no longer wait
    /// for: dropping then leaks instead of freeing.
    leak: bool,
    cmds: Vec<Cmd>,
    dirty: Vec<ConnId>,
    cqes: Vec<(u64, i32)>,
    /// A connection was drained in this batch of completions: the
    /// handler hears `drains_done` once the batch is through.
    drained_any: bool,
}

fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    )
}

impl Ring {
    pub(super) fn new(ring: IoUring, shared: Arc<Shared>, wake_rx: UnixStream) -> Ring {
        Ring {
            ring,
            shared,
            conns: HashMap::new(),
            backlog: VecDeque::new(),
            in_flight: 0,
            wake_rx,
            wake_buf: Box::new([0; 64]),
            tick: Box::new(types::Timespec::from(TICK)),
            ticking: false,
            sending: 0,
            stopping: false,
            leak: false,
            cmds: Vec::new(),
            dirty: Vec::new(),
            cqes: Vec::new(),
            drained_any: false,
        }
    }

    pub(super) fn run(mut self) {
        let _ = self.shared.ring_thread.set(std::thread::current().id());
        self.arm_wake();
        loop {
            self.take_inbox();
            if self.stopping && self.in_flight == 0 {
                return; // nothing points into `self` any more
            }
            if self.sending > 0 && !self.ticking && !self.stopping {
                self.arm_tick();
            }
            let all_queued = self.fill_sq();
            // Wait only when everything made so far is submitted.
            if let Err(e) = self.ring.submit_and_wait(usize::from(all_queued)) {
                let busy = e.kind() == io::ErrorKind::ResourceBusy; // reap first
                if !retryable(&e) && !busy {
                    self.die(e);
                }
            }
            if !self.leak {
                self.reap();
            }
            if self.leak {
                return; // dropping leaks what the kernel may still use
            }
        }
    }

    fn push(&mut self, entry: squeue::Entry) {
        self.in_flight += 1;
        self.backlog.push_back(entry);
    }

    /// Moves the backlog into the submission queue; false if it filled up.
    fn fill_sq(&mut self) -> bool {
        let mut sq = self.ring.submission();
        while let Some(entry) = self.backlog.front() {
            // SAFETY: every request points only at memory and sockets owned
            // by `self` (boxed connections, the wake buffer, the tick) that
            // stay put and alive until its completion is reaped: see the
            // module docs.
            if unsafe { sq.push(entry) }.is_err() {
                return false;
            }
            self.backlog.pop_front();
        }
        true
    }

    fn take_inbox(&mut self) {
        // Handler calls made here may post more: loop until none are left.
        loop {
            let mut cmds = std::mem::take(&mut self.cmds);
            {
                let mut inbox = self.shared.inbox.lock();
                inbox.woken = false;
                std::mem::swap(&mut inbox.cmds, &mut cmds);
            }
            if cmds.is_empty() {
                self.cmds = cmds;
                return;
            }
            for cmd in cmds.drain(..) {
                self.command(cmd);
            }
            self.cmds = cmds;
            // One sendmsg per connection for everything posted together.
            let mut dirty = std::mem::take(&mut self.dirty);
            for id in dirty.drain(..) {
                self.start_send(id);
            }
            self.dirty = dirty;
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add(id, stream, open, outlet) => {
                self.conns.insert(id, Conn::new(stream, open, outlet));
            }
            Cmd::Start(id) => {
                let Some(conn) = self.conns.get_mut(&id) else {
                    return;
                };
                conn.started = true;
                if conn.dead.is_some() {
                    self.finish(id);
                } else {
                    self.arm_recv(id);
                }
            }
            Cmd::Send(id, parts) => self.queue_send(id, parts),
            Cmd::Close(id) => {
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.closing = true;
                    self.dirty.push(id); // flushes, then shuts down
                }
            }
            Cmd::Fail(id, why) => self.fail(id, Some(why)),
            Cmd::ConnectFailed(tag, e) => self.shared.handler.connect_failed(tag, e),
            Cmd::Stop => self.stop(),
        }
    }

    fn stop(&mut self) {
        self.stopping = true;
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            self.fail(id, Some("transport stopped".into()));
            self.finish(id); // also those that died before being started
        }
        let wake = opcode::AsyncCancel::new(user_data(0, WAKE)).build();
        self.push(wake.user_data(user_data(0, CANCEL)));
        if self.ticking {
            let tick = opcode::AsyncCancel::new(user_data(0, TICKED)).build();
            self.push(tick.user_data(user_data(0, CANCEL)));
        }
    }

    fn reap(&mut self) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
        for &(data, res) in &cqes {
            if self.leak {
                break; // died: nothing more is reported
            }
            self.in_flight = self.in_flight.saturating_sub(1);
            let id = data >> 3;
            match data & 7 {
                WAKE => self.woke(res),
                TICKED => {
                    self.ticking = false;
                    self.check_stalls();
                }
                RECV => self.received(id, res),
                SEND => self.sent(id, res),
                _ => {} // a cancellation's own completion
            }
        }
        cqes.clear();
        self.cqes = cqes;
        if std::mem::take(&mut self.drained_any) && !self.leak {
            self.shared.handler.drains_done();
        }
    }

    fn arm_wake(&mut self) {
        let entry = opcode::Recv::new(
            types::Fd(self.wake_rx.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            self.wake_buf.len() as u32,
        )
        .build()
        .user_data(user_data(0, WAKE));
        self.push(entry);
    }

    fn woke(&mut self, res: i32) {
        if self.stopping {
            return;
        }
        if res > 0 || (res < 0 && retryable(&io::Error::from_raw_os_error(-res))) {
            self.arm_wake();
        } else {
            // The pair is broken: nothing could wake this ring again.
            let e = if res == 0 {
                io::Error::other("wake-up socket closed")
            } else {
                io::Error::from_raw_os_error(-res)
            };
            self.die(e);
        }
    }

    fn arm_tick(&mut self) {
        let entry = opcode::Timeout::new(&raw const *self.tick)
            .build()
            .user_data(user_data(0, TICKED));
        self.ticking = true;
        self.push(entry);
    }

    fn check_stalls(&mut self) {
        let stalled: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.sending && c.dead.is_none() && c.sent_at.elapsed() >= WRITE_TIMEOUT)
            .map(|(id, _)| *id)
            .collect();
        for id in stalled {
            self.fail(id, Some(format!("no write progress in {WRITE_TIMEOUT:?}")));
        }
    }

    fn arm_recv(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.receiving || conn.dead.is_some() {
            return;
        }
        if conn.rbuf.capacity() - conn.rbuf.len() < MIN_RECV {
            conn.rbuf.reserve(READ_CHUNK);
        }
        let spare = conn.rbuf.spare_capacity_mut();
        let len = spare.len().min(MAX_RECV) as u32;
        let entry = opcode::Recv::new(
            types::Fd(conn.stream.as_raw_fd()),
            spare.as_mut_ptr().cast(),
            len,
        )
        .build()
        .user_data(user_data(id, RECV));
        conn.receiving = true;
        self.push(entry);
    }

    fn received(&mut self, id: ConnId, res: i32) {
        let handler = Arc::clone(&self.shared.handler);
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.receiving = false;
        if conn.dead.is_some() {
            return self.finish(id);
        }
        if res < 0 {
            let e = io::Error::from_raw_os_error(-res);
            if retryable(&e) {
                return self.arm_recv(id);
            }
            return self.fail(id, Some(e.to_string()));
        }
        if res == 0 {
            if conn.closing && conn.sending {
                return; // what is queued still goes out, then we shut down
            }
            return self.fail(id, None); // orderly close by the peer
        }
        let room = conn.rbuf.capacity() - conn.rbuf.len();
        let n = (res as usize).min(room);
        // SAFETY: the recv was given this spare room, untouched since, and
        // the kernel reports it initialised its first `n` bytes.
        unsafe { conn.rbuf.set_len(conn.rbuf.len() + n) };
        if conn.closing {
            conn.rbuf.clear(); // closed by us: nothing more is delivered
            return self.arm_recv(id);
        }
        let (handed, sound) = super::super::split_frames(&mut conn.rbuf, conn.open.as_mut(), |m| {
            handler.message(id, m);
        });
        if handed {
            // Even before a bad frame: what was handed over gets its sync.
            handler.drained(id);
            self.drained_any = true;
        }
        match sound {
            Ok(()) => self.arm_recv(id),
            Err(e) => self.fail(id, Some(e.to_string())),
        }
    }

    fn queue_send(&mut self, id: ConnId, parts: Parts) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return; // already gone
        };
        conn.outlet.taken();
        if conn.dead.is_some() || conn.closing {
            return;
        }
        let n: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if conn.queued > 0 && conn.queued + n > MAX_QUEUED_BYTES {
            let why = format!("over {MAX_QUEUED_BYTES} bytes queued: the peer is not keeping up");
            return self.fail(id, Some(why));
        }
        conn.queued += n;
        conn.queue
            .extend(parts.into_iter().filter(|p| !p.is_empty()));
        if !conn.sending {
            self.dirty.push(id);
        }
    }

    /// Sends what is queued (and the rest of a short send), or, once all is
    /// sent on a closing connection, shuts it down.
    fn start_send(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.sending || conn.dead.is_some() {
            return;
        }
        while conn.out.len() < MAX_IOVECS {
            let Some(b) = conn.queue.pop_front() else {
                break;
            };
            conn.out.push(b);
        }
        if conn.out.is_empty() {
            if conn.closing {
                self.fail(id, None);
            } else {
                // Nothing held: senders may write the socket themselves.
                conn.outlet.release();
            }
            return;
        }
        conn.iov.clear();
        conn.iov.extend(conn.out.iter().map(|b| IoVec {
            base: b.as_ptr(),
            len: b.len(),
        }));
        conn.msg = MsgHdr {
            iov: conn.iov.as_ptr(),
            iov_len: conn.iov.len(),
            ..MsgHdr::EMPTY
        };
        let entry = opcode::SendMsg::new(
            types::Fd(conn.stream.as_raw_fd()),
            (&raw const conn.msg).cast(),
        )
        .flags(MSG_NOSIGNAL)
        .build()
        .user_data(user_data(id, SEND));
        conn.sending = true;
        conn.sent_at = Instant::now();
        self.sending += 1;
        self.push(entry);
    }

    fn sent(&mut self, id: ConnId, res: i32) {
        self.sending = self.sending.saturating_sub(1);
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.sending = false;
        if conn.dead.is_some() {
            conn.out.clear();
            return self.finish(id);
        }
        if res < 0 {
            let e = io::Error::from_raw_os_error(-res);
            if retryable(&e) {
                return self.start_send(id);
            }
            return self.fail(id, Some(e.to_string()));
        }
        if res == 0 {
            return self.fail(id, Some("the socket took no bytes".into()));
        }
        let mut n = res as usize;
        conn.queued = conn.queued.saturating_sub(n as u64);
        let mut whole = 0;
        for b in &mut conn.out {
            if n >= b.len() {
                n -= b.len();
                whole += 1;
            } else {
                b.advance(n); // a short send: the rest goes next
                break;
            }
        }
        conn.out.drain(..whole);
        self.start_send(id);
    }

    /// Shuts `id` down; `closed` is reported once nothing is in flight.
    fn fail(&mut self, id: ConnId, reason: Option<String>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.dead.is_some() {
            return;
        }
        conn.dead = Some(reason);
        conn.outlet.shut();
        // Completes the outstanding recv (EOF) and sendmsg (EPIPE); the
        // cancellations are for good measure.
        let _ = conn.stream.shutdown(Shutdown::Both);
        conn.queue.clear();
        conn.queued = 0;
        let (receiving, sending) = (conn.receiving, conn.sending);
        if receiving {
            let cancel = opcode::AsyncCancel::new(user_data(id, RECV)).build();
            self.push(cancel.user_data(user_data(id, CANCEL)));
        }
        if sending {
            let cancel = opcode::AsyncCancel::new(user_data(id, SEND)).build();
            self.push(cancel.user_data(user_data(id, CANCEL)));
        }
        self.finish(id);
    }

    /// Drops a dead connection with nothing in flight and reports it.
    fn finish(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let idle = !conn.receiving && !conn.sending;
        if conn.dead.is_none() || !idle || !(conn.started || self.stopping) {
            return;
        }
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        self.shared.outlets.write().remove(&id);
        if conn.started {
            self.shared.handler.closed(id, conn.dead.flatten());
        }
    }

    /// The ring cannot go on: stop taking commands, report every started
    /// connection closed, and leave what the kernel may still point at to
    /// be leaked (`leak`).
    fn die(&mut self, e: io::Error) {
        self.leak = true;
        let why = format!("io_uring failed: {e}");
        let cmds = {
            let mut inbox = self.shared.inbox.lock();
            inbox.shut = Some(why.clone());
            std::mem::take(&mut inbox.cmds)
        };
        // Starts already posted are ours to report; later ones fail to post
        // and their poster reports them.
        for cmd in cmds {
            match cmd {
                Cmd::Add(id, stream, open, outlet) => {
                    outlet.shut();
                    self.conns.insert(id, Conn::new(stream, open, outlet));
                }
                Cmd::Start(id) => {
                    if let Some(conn) = self.conns.get_mut(&id) {
                        conn.started = true;
                    }
                }
                Cmd::ConnectFailed(tag, e) => self.shared.handler.connect_failed(tag, e),
                _ => {}
            }
        }
        let mut started = Vec::new();
        for (id, conn) in &self.conns {
            conn.outlet.shut();
            let _ = conn.stream.shutdown(Shutdown::Both);
            if conn.started {
                started.push(*id);
            }
        }
        for id in started {
            self.shared.handler.closed(id, Some(why.clone()));
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.in_flight == 0 && !self.leak {
            return;
        }
        // A fatal error, or a handler panicked: the kernel may still write
        // into these, so they must never be freed.
        let _ = self
            .shared
            .inbox
            .lock()
            .shut
            .get_or_insert_with(|| "io_uring thread ended".into());
        std::mem::forget(std::mem::take(&mut self.conns));
        std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 64])));
        std::mem::forget(std::mem::replace(
            &mut self.tick,
            Box::new(types::Timespec::new()),
        ));
    }
}
