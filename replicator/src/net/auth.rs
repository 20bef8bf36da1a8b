//! Authentication of replication connections: the one module that reads
//! or writes the auth handshake and the tag after every frame.
//!
//! Every process of a cluster holds the same [`ClusterKey`] `K`. A
//! connection starts with a mutual challenge-response; only once both
//! sides proved they know `K` does the transport report the connection
//! (`accepted` / `connected`), so no message from a peer without the key
//! ever reaches a protocol core. After it, every frame in each direction
//! carries a tag over a per-direction sequence number.
//!
//! ```text
//! handshake (before any frame)
//!  dialer -> acceptor   HELLO      40 bytes
//!    0  magic  "WRLAUTH3" (8)
//!    8  n_d    the dialer's random nonce (32)
//!  acceptor -> dialer   CHALLENGE  72 bytes
//!    0  magic  "WRLAUTH3" (8)
//!    8  n_a    the acceptor's random nonce (32)
//!   40  proof  keyed_hash(P, 0x02 ‖ n_d ‖ n_a) (32)
//!  dialer -> acceptor   PROOF      32 bytes
//!    0  proof  keyed_hash(P, 0x01 ‖ n_d ‖ n_a) (32)
//!
//!  P    = derive_key("walrelay replication v1 handshake proof", K)
//!  K_da = derive_key("walrelay replication v1 dialer to acceptor", K ‖ n_d ‖ n_a)
//!  K_ad = derive_key("walrelay replication v1 acceptor to dialer", K ‖ n_d ‖ n_a)
//!
//! authenticated stream, each direction (K_da dialer -> acceptor, K_ad back)
//!  0    frame  exactly as in `wire` (length u32, version, kind, body)
//!  len  tag    keyed_hash(K_dir, head ‖ hash(rest) ‖ seq u64 BE) (32)
//!  head: the frame's first 6 bytes (`wire::FRAME_HEADER_BYTES`: length,
//!        version, kind), or all of a shorter frame
//!  rest: the frame after head (possibly empty); hash is plain BLAKE3
//!  seq:  0 for the direction's first frame, then +1 per frame
//! ```
//!
//! The frame's rest is hashed without a key and the key tags only that
//! digest (with the head and the sequence number), so a sender sending one
//! log record to several peers hashes the record once, not once per
//! connection: an Append's rest is exactly its shared record buffer, whose
//! digest each sending thread keeps for the last record it tagged
//! ([`Sealer::seal`]), and the process for its last [`RECENT_DIGESTS`]
//! records (the ticker sends the lazy followers records the committing
//! sessions tagged). BLAKE3's collision resistance makes the digest
//! stand for the bytes: a tag over it binds them as a tag over them would.
//! The receiver's cost is the same as before (one pass over the frame). v1
//! and v2 tagged the whole frame per connection (v1 with the sequence
//! number first, which cost BLAKE3 its whole-chunk SIMD path); each
//! version's magic keeps older peers from talking to newer: they refuse
//! each other at the handshake.
//!
//! keyed_hash and derive_key are BLAKE3's keyed and key-derivation modes;
//! tags are compared in constant time. The role byte keeps a proof from
//! being reflected back as the other side's; fresh nonces on both sides
//! keep it from being replayed; the session keys bind every tag to this
//! connection (no splicing between connections) and the sequence number to
//! its place in the stream (no replay, reordering or dropped frame goes
//! unnoticed). Nothing is encrypted: see papers/security.md.
//!
//! The handshake runs on the accepting or dialing thread with blocking
//! reads bounded by [`HANDSHAKE_TIMEOUT`]; at most [`MAX_PENDING_HANDSHAKES`]
//! accepted connections are in their handshake at once per transport (more
//! are closed at once). Every refusal is counted ([`Auth::refusals`]) and
//! reported on stderr.

use super::cluster_key::{ClusterKey, KeyFileError, random_bytes};
use bytes::Bytes;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const MAGIC: [u8; 8] = *b"WRLAUTH3";
pub const NONCE_BYTES: usize = 32;
/// The tag after every frame of an authenticated stream.
pub const TAG_BYTES: usize = 32;
pub const HELLO_BYTES: usize = MAGIC.len() + NONCE_BYTES;
pub const CHALLENGE_BYTES: usize = MAGIC.len() + NONCE_BYTES + TAG_BYTES;
pub const PROOF_BYTES: usize = TAG_BYTES;
/// A handshake not done in this long is refused.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Accepted connections in their handshake at once, per transport.
pub const MAX_PENDING_HANDSHAKES: usize = 64;

const PROOF_CONTEXT: &str = "walrelay replication v1 handshake proof";
const DIALER_TO_ACCEPTOR: &str = "walrelay replication v1 dialer to acceptor";
const ACCEPTOR_TO_DIALER: &str = "walrelay replication v1 acceptor to dialer";
const DIALER: u8 = 1;
const ACCEPTOR: u8 = 2;

/// Why a connection was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("handshake i/o: {0}")]
    Io(#[from] io::Error),
    #[error("the peer does not speak the auth handshake (wrong magic)")]
    BadMagic,
    #[error("the peer's proof is wrong: it does not hold the cluster key")]
    BadProof,
    #[error("frame {seq}: bad tag (forged, altered, replayed, reordered or truncated)")]
    BadTag { seq: u64 },
    #[error("more than {MAX_PENDING_HANDSHAKES} handshakes pending")]
    TooManyPending,
    #[error(transparent)]
    Random(#[from] KeyFileError),
}

/// Tags the frames one side sends, in order.
pub struct Sealer {
    key: [u8; 32],
    seq: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The session key stays out of logs.
        f.debug_struct("Sealer")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// Bytes of a frame's head in its tag (the rest goes in as its digest).
const TAG_HEAD_BYTES: usize = crate::wire::FRAME_HEADER_BYTES;

thread_local! {
    /// The last shared body this thread tagged and its digest. The clone
    /// keeps the buffer alive, so a later body at the same address and of
    /// the same length is the same immutable bytes, never a reused
    /// allocation.
    static LAST_BODY: std::cell::RefCell<Option<(Bytes, blake3::Hash)>> =
        const { std::cell::RefCell::new(None) };
}

/// How many bodies the process remembers the digests of, beside each
/// thread's last: a lazy flush's records (every flush interval's worth at
/// one session, dozens) were tagged by the sessions that committed them,
/// and the ticker tags them again for each lazy follower.
pub const RECENT_DIGESTS: usize = 256;

/// Bodies larger than this are not remembered process-wide, which bounds
/// the cache's copies to [`RECENT_DIGESTS`] times it (8 MiB).
const RECENT_DIGEST_MAX_BODY: usize = 32 << 10;

/// The process's recently tagged bodies and their digests, oldest first
/// replaced. Each entry holds a copy of its body, not the body: a body
/// may be a slice of a much larger buffer (a catch-up read), which a
/// clone would keep alive. A body is found by its buffer's address and
/// length, and taken only if its bytes equal the copy (a comparison costs
/// a tenth of hashing them), so a buffer reused at the same address is
/// hashed anew.
static RECENT: parking_lot::Mutex<Recent> = parking_lot::Mutex::new(Recent {
    entries: Vec::new(),
    next: 0,
});

struct Recent {
    /// The body's address, a copy of its bytes, their digest.
    entries: Vec<(usize, Bytes, blake3::Hash)>,
    /// The slot the next body replaces once `entries` is full.
    next: usize,
}

impl Recent {
    fn get(&self, body: &[u8]) -> Option<blake3::Hash> {
        self.entries
            .iter()
            .find(|(at, copy, _)| *at == body.as_ptr() as usize && copy[..] == *body)
            .map(|(_, _, digest)| *digest)
    }

    fn put(&mut self, body: &[u8], digest: blake3::Hash) {
        let entry = (body.as_ptr() as usize, Bytes::copy_from_slice(body), digest);
        if self.entries.len() < RECENT_DIGESTS {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % RECENT_DIGESTS;
        }
    }
}

/// BLAKE3 of `body`, from this thread's cache when it tagged the same
/// buffer last (one log record sent to several peers), or from the
/// process's recent bodies (a record sent by another thread before).
fn body_digest(body: &Bytes) -> blake3::Hash {
    if body.is_empty() {
        // A bare header: nothing to share, and the record stays cached.
        return blake3::hash(&[]);
    }
    LAST_BODY.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((cached, digest)) = last.as_ref()
            && cached.as_ptr() == body.as_ptr()
            && cached.len() == body.len()
        {
            return *digest;
        }
        let shared = body.len() <= RECENT_DIGEST_MAX_BODY;
        let digest = match shared.then(|| RECENT.lock().get(body)).flatten() {
            Some(digest) => digest,
            None => {
                let digest = blake3::hash(body);
                if shared {
                    RECENT.lock().put(body, digest);
                }
                digest
            }
        };
        *last = Some((body.clone(), digest));
        digest
    })
}

/// The tag of a frame whose head (its first [`TAG_HEAD_BYTES`]) is `head`
/// and whose rest hashes to `rest`.
fn tag(key: &[u8; 32], head: &[u8], rest: &blake3::Hash, seq: u64) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(head);
    h.update(rest.as_bytes());
    h.update(&seq.to_be_bytes());
    h.finalize()
}

impl Sealer {
    /// The tag of the next frame, given as its two parts in order, as the
    /// transports write them (`wire::encode_parts`: a header, or the whole
    /// frame, and a shared body): the frame is never copied to be tagged,
    /// and a body this thread tagged last is not hashed again.
    pub fn seal(&mut self, head: &[u8], body: &Bytes) -> Bytes {
        let t = match head.len().cmp(&TAG_HEAD_BYTES) {
            // The rest is exactly the shared body (an Append's record).
            std::cmp::Ordering::Equal => tag(&self.key, head, &body_digest(body), self.seq),
            std::cmp::Ordering::Greater => {
                let (head, more) = head.split_at(TAG_HEAD_BYTES);
                let mut rest = blake3::Hasher::new();
                rest.update(more);
                rest.update(body);
                tag(&self.key, head, &rest.finalize(), self.seq)
            }
            // A head shorter than the frame header (no transport sends
            // one): the frame as one buffer, split as the receiver does.
            std::cmp::Ordering::Less => {
                let frame = [head, &body[..]].concat();
                let (head, rest) = frame.split_at(frame.len().min(TAG_HEAD_BYTES));
                tag(&self.key, head, &blake3::hash(rest), self.seq)
            }
        };
        self.seq = self
            .seq
            .checked_add(1)
            .expect("2^64 frames on one connection");
        Bytes::copy_from_slice(t.as_bytes())
    }
}

/// Checks the tags of the frames one side receives, in order.
pub struct Opener {
    key: [u8; 32],
    seq: u64,
    auth: Arc<Auth>,
    peer: SocketAddr,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("seq", &self.seq)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Opener {
    /// Checks `tag` for the next `frame` (constant time); a bad tag is
    /// counted and reported as a refusal, and the stream is unusable after.
    pub fn open(&mut self, frame: &[u8], tag: &[u8]) -> Result<(), AuthError> {
        let (head, rest) = frame.split_at(frame.len().min(TAG_HEAD_BYTES));
        let expected = self::tag(&self.key, head, &blake3::hash(rest), self.seq);
        // blake3::Hash's comparison with a slice is constant-time.
        if expected != *tag {
            let e = AuthError::BadTag { seq: self.seq };
            self.auth.refused("frame from", self.peer, &e);
            return Err(e);
        }
        self.seq = self
            .seq
            .checked_add(1)
            .expect("2^64 frames on one connection");
        Ok(())
    }
}

/// What an authenticated connection carries in its two directions.
#[derive(Debug)]
pub struct Session {
    pub seal: Sealer,
    pub open: Opener,
}

/// One transport's authentication: its key (None: connections are not
/// authenticated) and its refusal count.
pub struct Auth {
    key: Option<ClusterKey>,
    refused: AtomicU64,
    pending: AtomicUsize,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("authenticated", &self.key.is_some())
            .field("refused", &self.refusals())
            .finish()
    }
}

impl Auth {
    pub fn new(key: Option<ClusterKey>) -> Arc<Auth> {
        Arc::new(Auth {
            key,
            refused: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
        })
    }

    pub fn enabled(&self) -> bool {
        self.key.is_some()
    }

    /// Connections (or frames) refused so far.
    pub fn refusals(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self, what: &str, peer: SocketAddr, e: &AuthError) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, "replication auth refused {what} {peer}: {e}");
    }

    /// Authenticates a freshly dialed stream (None without a key). A
    /// refusal is counted and reported here.
    pub fn dial(
        self: &Arc<Self>,
        stream: &mut TcpStream,
        peer: SocketAddr,
    ) -> Result<Option<Session>, AuthError> {
        self.run(stream, peer, true, "connection to")
    }

    /// Authenticates a freshly accepted stream (None without a key). A
    /// refusal is counted and reported here.
    pub fn accept(
        self: &Arc<Self>,
        stream: &mut TcpStream,
        peer: SocketAddr,
    ) -> Result<Option<Session>, AuthError> {
        self.run(stream, peer, false, "connection from")
    }

    /// Accepted connections in their handshake now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Takes one of the pending-handshake slots; false (and counted) when
    /// all are taken. [`Auth::release`] gives it back.
    pub(crate) fn reserve(&self, peer: SocketAddr) -> bool {
        let taken = self.pending.fetch_add(1, Ordering::AcqRel);
        if taken >= MAX_PENDING_HANDSHAKES {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.refused("connection from", peer, &AuthError::TooManyPending);
            return false;
        }
        true
    }

    pub(crate) fn release(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    fn run(
        self: &Arc<Self>,
        stream: &mut TcpStream,
        peer: SocketAddr,
        dialer: bool,
        what: &str,
    ) -> Result<Option<Session>, AuthError> {
        let Some(key) = &self.key else {
            return Ok(None);
        };
        let result = (|| {
            stream.set_nodelay(true)?;
            let mut io = Deadline {
                stream: &mut *stream,
                until: Instant::now() + HANDSHAKE_TIMEOUT,
            };
            let keys = if dialer {
                handshake_as_dialer(key, &mut io)?
            } else {
                handshake_as_acceptor(key, &mut io)?
            };
            stream.set_read_timeout(None)?;
            stream.set_write_timeout(None)?;
            Ok(keys)
        })();
        match result {
            Ok(keys) => Ok(Some(Session {
                seal: Sealer {
                    key: keys.send,
                    seq: 0,
                },
                open: Opener {
                    key: keys.receive,
                    seq: 0,
                    auth: Arc::clone(self),
                    peer,
                },
            })),
            Err(e) => {
                self.refused(what, peer, &e);
                Err(e)
            }
        }
    }
}

/// One side's session keys.
#[derive(PartialEq, Eq)]
pub struct SessionKeys {
    pub send: [u8; 32],
    pub receive: [u8; 32],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

fn nonce() -> Result<[u8; NONCE_BYTES], AuthError> {
    let mut n = [0u8; NONCE_BYTES];
    random_bytes(&mut n)?;
    Ok(n)
}

fn proof(key: &ClusterKey, role: u8, n_d: &[u8], n_a: &[u8]) -> blake3::Hash {
    let p = blake3::derive_key(PROOF_CONTEXT, key.bytes());
    let mut h = blake3::Hasher::new_keyed(&p);
    h.update(&[role]).update(n_d).update(n_a);
    h.finalize()
}

fn session_key(context: &str, key: &ClusterKey, n_d: &[u8], n_a: &[u8]) -> [u8; 32] {
    let mut material = Vec::with_capacity(ClusterKey::BYTES + 2 * NONCE_BYTES);
    material.extend_from_slice(key.bytes());
    material.extend_from_slice(n_d);
    material.extend_from_slice(n_a);
    blake3::derive_key(context, &material)
}

/// A stream whose reads and writes all end by one deadline: the socket's
/// timeout is set to what is left before each call, so a peer trickling a
/// byte at a time cannot hold a handshake (and its slot) past
/// [`HANDSHAKE_TIMEOUT`].
struct Deadline<'s> {
    stream: &'s mut TcpStream,
    until: Instant,
}

impl Deadline<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake's deadline passed",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// The dialer's half of the handshake over `io`.
pub fn handshake_as_dialer(
    key: &ClusterKey,
    io: &mut (impl Read + Write),
) -> Result<SessionKeys, AuthError> {
    let n_d = nonce()?;
    let mut hello = [0u8; HELLO_BYTES];
    hello[..8].copy_from_slice(&MAGIC);
    hello[8..].copy_from_slice(&n_d);
    io.write_all(&hello)?;
    let mut challenge = [0u8; CHALLENGE_BYTES];
    io.read_exact(&mut challenge)?;
    if challenge[..8] != MAGIC {
        return Err(AuthError::BadMagic);
    }
    let n_a = &challenge[8..8 + NONCE_BYTES];
    if proof(key, ACCEPTOR, &n_d, n_a) != challenge[8 + NONCE_BYTES..] {
        return Err(AuthError::BadProof);
    }
    io.write_all(proof(key, DIALER, &n_d, n_a).as_bytes())?;
    io.flush()?;
    Ok(SessionKeys {
        send: session_key(DIALER_TO_ACCEPTOR, key, &n_d, n_a),
        receive: session_key(ACCEPTOR_TO_DIALER, key, &n_d, n_a),
    })
}

/// The acceptor's half of the handshake over `io`.
pub fn handshake_as_acceptor(
    key: &ClusterKey,
    io: &mut (impl Read + Write),
) -> Result<SessionKeys, AuthError> {
    let mut hello = [0u8; HELLO_BYTES];
    io.read_exact(&mut hello)?;
    if hello[..8] != MAGIC {
        return Err(AuthError::BadMagic);
    }
    let n_d = &hello[8..];
    let n_a = nonce()?;
    let mut challenge = [0u8; CHALLENGE_BYTES];
    challenge[..8].copy_from_slice(&MAGIC);
    challenge[8..8 + NONCE_BYTES].copy_from_slice(&n_a);
    challenge[8 + NONCE_BYTES..].copy_from_slice(proof(key, ACCEPTOR, n_d, &n_a).as_bytes());
    io.write_all(&challenge)?;
    io.flush()?;
    let mut their = [0u8; PROOF_BYTES];
    io.read_exact(&mut their)?;
    if proof(key, DIALER, n_d, &n_a) != their {
        return Err(AuthError::BadProof);
    }
    Ok(SessionKeys {
        send: session_key(ACCEPTOR_TO_DIALER, key, n_d, &n_a),
        receive: session_key(DIALER_TO_ACCEPTOR, key, n_d, &n_a),
    })
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
