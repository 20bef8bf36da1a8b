//! The replication wire format: the one module that reads or writes
//! messages between a leader, its durability followers and its replicas.
//!
//! ```text
//! frame (big-endian)
//!  0  length   u32: bytes after this field (kind byte onwards + version)
//!  4  version  u8 (2)
//!  5  kind     u8
//!  6  body     length - 2 bytes, by kind:
//!
//!  1 Handshake   database u64, epoch u32, role u8 (1 leader, 2 follower,
//!                3 replica), node u64 (a leader's id; 0 otherwise),
//!                last_durable bookmark (12), its chain (16), confirmed
//!                bookmark (12: the newest the sender knows confirmed),
//!                runs u16, runs x (epoch u32, last sequence u64)
//!                                                        = 63 + 12 x runs
//!                (a follower's epoch history; 0 runs from anyone else)
//!  2 Append      one log record (see `record`), its own length inside
//!  3 Ack         durable bookmark (12), its chain (16)           = 28
//!  4 Confirm     confirmed bookmark (12), confirmed_us u64: the
//!                leader's wall clock when it was confirmed        = 20
//!  5 CatchUp     from bookmark (12): send every record after it  = 12
//!  6 CatchUpDone upto bookmark (12): the stream has caught up    = 12
//!  7 Heartbeat   epoch u32, confirmed bookmark (12), sent_us u64 = 24
//!  8 Refuse      epoch u32 (the receiver's), reason u8 (1 stale epoch,
//!                2 wrong database, 3 gap, 4 behind, 5 diverged,
//!                6 not introduced)                                = 5
//!  9 Truncate    runs u16, runs x (epoch u32, last sequence u64):
//!                the leader's epoch history; the follower cuts its
//!                log where it leaves it               = 2 + 12 x runs
//! 10 Archived    start bookmark (12), its chain (16), runs u16, runs x
//!                (epoch u32, last sequence u64): the answer to a
//!                CatchUp from before the sender's log start: the
//!                records up to and including `start` are confirmed,
//!                archived in cold storage and released here; fetch
//!                them from there (`runs` is the epoch history of that
//!                released prefix, ending at `start`)  = 30 + 12 x runs
//! 11 Mux         a channel frame of the multiplexed transport: one
//!                channel's (database's) message on a connection shared
//!                by many; its body is defined in [`crate::net::mux_wire`]
//! ```
//!
//! Version 2 added the node id, chain and history to the handshake, the
//! chain to the ack, and Truncate; a version 1 peer is refused as
//! unsupported rather than half understood. Archived (kind 10) came later
//! without a version change: it is only ever sent in answer to a CatchUp,
//! and a peer that predates it (and so could not fetch from cold storage
//! anyway) drops the connection on the unknown kind instead of misreading
//! it. Mux (kind 11) likewise: only a peer that dialed with the
//! multiplexed transport sends it, and only to one that accepts it.
//!
//! A frame's length is checked against [`MAX_FRAME_BYTES`] before anything
//! is allocated; fixed-size bodies must have exactly their size. An Append's
//! record decodes as slices of the input buffer (no copy of page images).
//!
//! On an authenticated connection, an auth handshake comes before the first
//! frame and a tag follows every frame; both formats live in
//! [`crate::net::auth`].

use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::history::{History, MAX_RUNS};
use crate::ids::{DatabaseId, NodeId};
use crate::net::mux_wire::{self, MuxFrame, MuxWireError};
use crate::record::{Encoded, MAX_RECORD_BYTES, RecordError, be32, bookmark_at};
use bytes::{BufMut, Bytes, BytesMut};

pub const VERSION: u8 = 2;
/// Length prefix + version + kind.
pub const FRAME_HEADER_BYTES: usize = 6;
/// The largest frame: one maximal record plus the frame header, inside a
/// channel frame (its header and the channel header).
pub const MAX_FRAME_BYTES: u64 =
    MAX_RECORD_BYTES + 2 * FRAME_HEADER_BYTES as u64 + mux_wire::HEADER_BYTES as u64;

/// What a peer is in the replication topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Replica,
}

/// Why a receiver refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// The sender's epoch is older than one the receiver has accepted.
    StaleEpoch,
    /// The receiver serves another database.
    WrongDatabase,
    /// An append did not follow the receiver's log.
    Gap,
    /// The leader no longer holds the records after the peer's position:
    /// catch up from a follower first, then subscribe again.
    Behind,
    /// The peer's log holds records the leader's history does not (a
    /// diverged tail from an older epoch); it cannot be used until repaired.
    Diverged,
    /// An append arrived in an epoch no handshake introduced.
    NotIntroduced,
    /// The receiver serves many databases and cannot take this one now:
    /// it holds as many as it may (or has as many open as it may, all in
    /// use). Try another node, or later.
    Unavailable,
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// From a leader: a claim on `epoch` (a follower persists its promise
    /// of that epoch to `node` before answering). From a follower: the
    /// promise, with where its log ends and its epoch history.
    Handshake {
        database: DatabaseId,
        epoch: Epoch,
        role: Role,
        node: NodeId,
        last_durable: Bookmark,
        last_chain: ChainHash,
        /// The newest bookmark the sender knows was confirmed (a new
        /// leader starts its tail there).
        confirmed: Bookmark,
        history: History,
    },
    Append(Encoded),
    Ack {
        durable: Bookmark,
        chain: ChainHash,
    },
    Confirm {
        confirmed: Bookmark,
        /// Microseconds since the Unix epoch on the leader's clock when the
        /// quorum formed: lets a replica on the same host measure confirm
        /// lag end to end. Informational only; never used for ordering.
        confirmed_us: u64,
    },
    CatchUp {
        from: Bookmark,
    },
    CatchUpDone {
        upto: Bookmark,
    },
    Heartbeat {
        epoch: Epoch,
        confirmed: Bookmark,
        sent_us: u64,
    },
    Refuse {
        epoch: Epoch,
        reason: RefuseReason,
    },
    /// The leader's history, to a follower whose log left it.
    Truncate {
        history: History,
    },
    /// The answer to a [`Message::CatchUp`] from before the sender's log
    /// start: everything up to `start` (whose chain is `chain`) is
    /// confirmed and was released to cold storage; `history` is the epoch
    /// history of that prefix (it ends at `start`).
    Archived {
        start: Bookmark,
        chain: ChainHash,
        history: History,
    },
    /// One message of one channel of a multiplexed connection (or a
    /// channel's control frame): see [`crate::net::mux_wire`].
    Mux(MuxFrame),
}

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not an error of the bytes: more are needed (streaming reads).
    #[error("incomplete frame: {need} bytes needed, {have} available")]
    Incomplete { need: u64, have: u64 },
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u64),
    #[error("unsupported wire version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("message kind {kind} needs a {want}-byte body, got {got}")]
    BodySize { kind: u8, want: usize, got: usize },
    #[error("unknown role {0}")]
    UnknownRole(u8),
    #[error("unknown refusal reason {0}")]
    UnknownReason(u8),
    #[error("append record: {0}")]
    Record(#[from] RecordError),
    #[error("append frame length {frame} does not match its record's {record}")]
    RecordLength { frame: u64, record: u64 },
    #[error("an epoch history of {0} runs is over the limit or out of order")]
    History(usize),
    #[error("channel frame: {0}")]
    Mux(#[from] MuxWireError),
}

const HANDSHAKE: u8 = 1;
const APPEND: u8 = 2;
const ACK: u8 = 3;
const CONFIRM: u8 = 4;
const CATCH_UP: u8 = 5;
const CATCH_UP_DONE: u8 = 6;
const HEARTBEAT: u8 = 7;
const REFUSE: u8 = 8;
const TRUNCATE: u8 = 9;
const ARCHIVED: u8 = 10;
const MUX: u8 = mux_wire::KIND;

fn put_history(body: &mut Vec<u8>, history: &History) {
    let runs = history.runs();
    // Sent newest first if over the bound: the oldest runs matter least.
    let runs = &runs[runs.len().saturating_sub(MAX_RUNS)..];
    body.extend_from_slice(&(runs.len() as u16).to_be_bytes());
    for (e, s) in runs {
        body.extend_from_slice(&e.0.to_be_bytes());
        body.extend_from_slice(&s.0.to_be_bytes());
    }
}

/// A history of `count` runs at `at`; the caller checked the body holds
/// exactly them.
fn history_at(body: &[u8], at: usize, count: usize) -> Result<History, WireError> {
    let runs = (0..count)
        .map(|i| {
            let o = at + 12 * i;
            (Epoch(be32(body, o)), Sequence(be64(body, o + 4)))
        })
        .collect();
    History::from_runs(runs).ok_or(WireError::History(count))
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(raw)
}

impl Message {
    /// Encodes the message as a frame. An Append's record is encoded once
    /// here; senders that already hold the record's bytes use
    /// [`encode_append`] to share them instead.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        let mut b = BytesMut::with_capacity(64);
        let kind_and_body = |b: &mut BytesMut, kind: u8, body: &[u8]| {
            b.put_u32((2 + body.len()) as u32);
            b.put_u8(VERSION);
            b.put_u8(kind);
            b.put_slice(body);
        };
        match self {
            Message::Handshake {
                database,
                epoch,
                role,
                node,
                last_durable,
                last_chain,
                confirmed,
                history,
            } => {
                let mut body = Vec::with_capacity(63 + 12 * history.runs().len());
                body.extend_from_slice(&database.0.to_be_bytes());
                body.extend_from_slice(&epoch.0.to_be_bytes());
                body.push(match role {
                    Role::Leader => 1,
                    Role::Follower => 2,
                    Role::Replica => 3,
                });
                body.extend_from_slice(&node.0.to_be_bytes());
                body.extend_from_slice(&last_durable.to_bytes());
                body.extend_from_slice(&last_chain.to_bytes());
                body.extend_from_slice(&confirmed.to_bytes());
                put_history(&mut body, history);
                kind_and_body(&mut b, HANDSHAKE, &body);
            }
            Message::Append(_) | Message::Mux(_) => {
                let (head, rec) = encode_parts(self)?;
                let mut out = BytesMut::with_capacity(head.len() + rec.len());
                out.put_slice(&head);
                out.put_slice(&rec);
                return Ok(out.freeze());
            }
            Message::Ack { durable, chain } => {
                let mut body = durable.to_bytes().to_vec();
                body.extend_from_slice(&chain.to_bytes());
                kind_and_body(&mut b, ACK, &body);
            }
            Message::Truncate { history } => {
                let mut body = Vec::new();
                put_history(&mut body, history);
                kind_and_body(&mut b, TRUNCATE, &body);
            }
            Message::Archived {
                start,
                chain,
                history,
            } => {
                let mut body = Vec::with_capacity(30 + 12 * history.runs().len());
                body.extend_from_slice(&start.to_bytes());
                body.extend_from_slice(&chain.to_bytes());
                put_history(&mut body, history);
                kind_and_body(&mut b, ARCHIVED, &body);
            }
            Message::Confirm {
                confirmed,
                confirmed_us,
            } => {
                let mut body = confirmed.to_bytes().to_vec();
                body.extend_from_slice(&confirmed_us.to_be_bytes());
                kind_and_body(&mut b, CONFIRM, &body);
            }
            Message::CatchUp { from } => kind_and_body(&mut b, CATCH_UP, &from.to_bytes()),
            Message::CatchUpDone { upto } => kind_and_body(&mut b, CATCH_UP_DONE, &upto.to_bytes()),
            Message::Heartbeat {
                epoch,
                confirmed,
                sent_us,
            } => {
                let mut body = Vec::with_capacity(24);
                body.extend_from_slice(&epoch.0.to_be_bytes());
                body.extend_from_slice(&confirmed.to_bytes());
                body.extend_from_slice(&sent_us.to_be_bytes());
                kind_and_body(&mut b, HEARTBEAT, &body);
            }
            Message::Refuse { epoch, reason } => {
                let mut body = epoch.0.to_be_bytes().to_vec();
                body.push(match reason {
                    RefuseReason::StaleEpoch => 1,
                    RefuseReason::WrongDatabase => 2,
                    RefuseReason::Gap => 3,
                    RefuseReason::Behind => 4,
                    RefuseReason::Diverged => 5,
                    RefuseReason::NotIntroduced => 6,
                    RefuseReason::Unavailable => 7,
                });
                kind_and_body(&mut b, REFUSE, &body);
            }
        }
        Ok(b.freeze())
    }

    /// Decodes the frame at the start of `buf`; returns the message and the
    /// bytes it used, or `Incomplete` if more bytes are needed.
    pub fn decode(buf: &Bytes) -> Result<(Message, usize), WireError> {
        if buf.len() < FRAME_HEADER_BYTES {
            return Err(WireError::Incomplete {
                need: FRAME_HEADER_BYTES as u64,
                have: buf.len() as u64,
            });
        }
        let len = u64::from(be32(buf, 0));
        if len + 4 > MAX_FRAME_BYTES {
            return Err(WireError::TooLarge(len + 4));
        }
        let version = buf[4];
        if version != VERSION {
            return Err(WireError::UnsupportedVersion(version));
        }
        let kind = buf[5];
        if !(HANDSHAKE..=MUX).contains(&kind) {
            return Err(WireError::UnknownKind(kind));
        }
        let total = (4 + len) as usize;
        if len < 2 {
            return Err(WireError::BodySize {
                kind,
                want: 0,
                got: 0,
            });
        }
        if buf.len() < total {
            return Err(WireError::Incomplete {
                need: total as u64,
                have: buf.len() as u64,
            });
        }
        let body = buf.slice(FRAME_HEADER_BYTES..total);
        let fixed = |want: usize| {
            if body.len() == want {
                Ok(())
            } else {
                Err(WireError::BodySize {
                    kind,
                    want,
                    got: body.len(),
                })
            }
        };
        let msg = match kind {
            HANDSHAKE => {
                if body.len() < 63 {
                    fixed(63)?;
                }
                let runs = usize::from(u16::from_be_bytes([body[61], body[62]]));
                fixed(63 + 12 * runs)?;
                let role = match body[12] {
                    1 => Role::Leader,
                    2 => Role::Follower,
                    3 => Role::Replica,
                    r => return Err(WireError::UnknownRole(r)),
                };
                Message::Handshake {
                    database: DatabaseId(be64(&body, 0)),
                    epoch: Epoch(be32(&body, 8)),
                    role,
                    node: NodeId(be64(&body, 13)),
                    last_durable: bookmark_at(&body, 21),
                    last_chain: ChainHash::at(&body, 33),
                    confirmed: bookmark_at(&body, 49),
                    history: history_at(&body, 63, runs)?,
                }
            }
            TRUNCATE => {
                if body.len() < 2 {
                    fixed(2)?;
                }
                let runs = usize::from(u16::from_be_bytes([body[0], body[1]]));
                fixed(2 + 12 * runs)?;
                Message::Truncate {
                    history: history_at(&body, 2, runs)?,
                }
            }
            ARCHIVED => {
                if body.len() < 30 {
                    fixed(30)?;
                }
                let runs = usize::from(u16::from_be_bytes([body[28], body[29]]));
                fixed(30 + 12 * runs)?;
                Message::Archived {
                    start: bookmark_at(&body, 0),
                    chain: ChainHash::at(&body, 12),
                    history: history_at(&body, 30, runs)?,
                }
            }
            MUX => Message::Mux(mux_wire::decode_body(&body)?),
            APPEND => {
                let (record, used) = Encoded::decode(&body)?;
                if used != body.len() {
                    return Err(WireError::RecordLength {
                        frame: body.len() as u64,
                        record: used as u64,
                    });
                }
                Message::Append(record)
            }
            ACK => {
                fixed(28)?;
                Message::Ack {
                    durable: bookmark_at(&body, 0),
                    chain: ChainHash::at(&body, 12),
                }
            }
            CONFIRM => {
                fixed(20)?;
                Message::Confirm {
                    confirmed: bookmark_at(&body, 0),
                    confirmed_us: be64(&body, 12),
                }
            }
            CATCH_UP => {
                fixed(12)?;
                Message::CatchUp {
                    from: bookmark_at(&body, 0),
                }
            }
            CATCH_UP_DONE => {
                fixed(12)?;
                Message::CatchUpDone {
                    upto: bookmark_at(&body, 0),
                }
            }
            HEARTBEAT => {
                fixed(24)?;
                Message::Heartbeat {
                    epoch: Epoch(be32(&body, 0)),
                    confirmed: bookmark_at(&body, 4),
                    sent_us: be64(&body, 16),
                }
            }
            _ => {
                fixed(5)?;
                let reason = match body[4] {
                    1 => RefuseReason::StaleEpoch,
                    2 => RefuseReason::WrongDatabase,
                    3 => RefuseReason::Gap,
                    4 => RefuseReason::Behind,
                    5 => RefuseReason::Diverged,
                    6 => RefuseReason::NotIntroduced,
                    7 => RefuseReason::Unavailable,
                    r => return Err(WireError::UnknownReason(r)),
                };
                Message::Refuse {
                    epoch: Epoch(be32(&body, 0)),
                    reason,
                }
            }
        };
        Ok((msg, total))
    }
}

/// A message as a frame in (at most) two parts, as the transports write
/// it: a header (or the whole frame) and a shared body. An Append's record
/// (also inside a channel frame) is the shared body, never copied.
pub fn encode_parts(message: &Message) -> Result<(Bytes, Bytes), WireError> {
    match message {
        Message::Append(record) => Ok(encode_append(&record.bytes)),
        Message::Mux(frame) => mux_wire::encode_parts(frame),
        other => Ok((other.encode()?, Bytes::new())),
    }
}

/// The frame header for an Append of an already-encoded record, to be sent
/// followed by the record's own bytes: every destination shares the same
/// record buffer, no per-destination copy.
pub fn encode_append(record: &Bytes) -> (Bytes, Bytes) {
    let mut head = BytesMut::with_capacity(FRAME_HEADER_BYTES);
    head.put_u32((2 + record.len()) as u32);
    head.put_u8(VERSION);
    head.put_u8(APPEND);
    (head.freeze(), record.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::Sequence;

    fn b(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    /// `WALRELAY_WRITE_SEEDS=<dir>` writes one fuzz seed per message kind
    /// (and one stream of all of them) so the corpus follows the format.
    #[test]
    fn fuzz_seeds_follow_the_format() {
        let Ok(dir) = std::env::var("WALRELAY_WRITE_SEEDS") else {
            return;
        };
        let dir = std::path::Path::new(&dir);
        std::fs::create_dir_all(dir).expect("seed dir");
        let mut stream = Vec::new();
        for (i, m) in all().iter().enumerate() {
            let frame = m.encode().expect("encode");
            std::fs::write(dir.join(format!("kind_{i}")), &frame).expect("write seed");
            stream.extend_from_slice(&frame);
        }
        std::fs::write(dir.join("stream_all_kinds"), &stream).expect("write seed");
    }

    fn runs() -> History {
        History::from_runs(vec![(Epoch(1), Sequence(5)), (Epoch(3), Sequence(9))]).expect("runs")
    }

    fn all() -> Vec<Message> {
        vec![
            Message::Handshake {
                database: DatabaseId(0xfeed),
                epoch: Epoch(3),
                role: Role::Follower,
                last_durable: b(3, 9),
                node: crate::ids::NodeId(0x0102_0304_0506_0708),
                last_chain: crate::chain::ChainHash::over(&[b"x"]),
                confirmed: b(3, 7),
                history: runs(),
            },
            Message::Append(
                crate::record::Record {
                    bookmark: b(3, 10),
                    previous: b(3, 9),
                    prev_chain: crate::chain::ChainHash::GENESIS,
                    commit_us: 0,
                    page_size: 512,
                    db_pages: 2,
                    pages: vec![(2, Bytes::from(vec![7u8; 512]))],
                }
                .to_encoded()
                .expect("valid record"),
            ),
            Message::Ack {
                durable: b(3, 10),
                chain: crate::chain::ChainHash::GENESIS,
            },
            Message::Confirm {
                confirmed: b(3, 10),
                confirmed_us: 1_700_000_000_000_000,
            },
            Message::CatchUp { from: b(2, 5) },
            Message::CatchUpDone { upto: b(3, 10) },
            Message::Heartbeat {
                epoch: Epoch(3),
                confirmed: b(3, 10),
                sent_us: 123_456,
            },
            Message::Refuse {
                epoch: Epoch(4),
                reason: RefuseReason::StaleEpoch,
            },
            Message::Truncate { history: runs() },
            Message::Archived {
                start: b(3, 9),
                chain: crate::chain::ChainHash::over(&[b"y"]),
                history: runs(),
            },
            Message::Mux(MuxFrame {
                channel: mux_wire::ChannelId(3),
                database: DatabaseId(0xfeed),
                op: mux_wire::MuxOp::Data(Box::new(Message::CatchUp { from: b(2, 5) })),
            }),
        ]
    }

    #[test]
    fn every_message_round_trips_and_reports_its_length() {
        for m in all() {
            let bytes = m.encode().expect("encode");
            let (back, used) = Message::decode(&bytes).expect("decode");
            assert_eq!(back, m);
            assert_eq!(used, bytes.len());
        }
    }

    #[test]
    fn a_stream_split_anywhere_decodes_after_more_bytes_arrive() {
        let stream: Vec<u8> = all()
            .iter()
            .flat_map(|m| m.encode().expect("encode").to_vec())
            .collect();
        for cut in 0..stream.len() {
            let head = Bytes::copy_from_slice(&stream[..cut]);
            let mut at = 0;
            loop {
                match Message::decode(&head.slice(at..)) {
                    Ok((_, used)) => at += used,
                    Err(WireError::Incomplete { .. }) => break,
                    Err(e) => panic!("cut {cut}: {e}"),
                }
            }
        }
    }

    #[test]
    fn corrupt_frames_are_typed_errors() {
        let ack = Message::Ack {
            durable: b(1, 1),
            chain: crate::chain::ChainHash::GENESIS,
        }
        .encode()
        .expect("encode")
        .to_vec();
        let mut bad = ack.clone();
        bad[4] = 9;
        assert_eq!(
            Message::decode(&Bytes::from(bad)),
            Err(WireError::UnsupportedVersion(9))
        );
        let mut bad = ack.clone();
        bad[5] = 99;
        assert_eq!(
            Message::decode(&Bytes::from(bad)),
            Err(WireError::UnknownKind(99))
        );
        let mut bad = ack.clone();
        bad[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Message::decode(&Bytes::from(bad)),
            Err(WireError::TooLarge(_))
        ));
        let mut bad = ack;
        bad[3] -= 1; // one byte short of an Ack body
        bad.pop();
        assert!(matches!(
            Message::decode(&Bytes::from(bad)),
            Err(WireError::BodySize { .. })
        ));
    }

    #[test]
    fn an_archived_answer_carries_its_prefix_history_and_a_body_short_of_its_runs_is_refused() {
        let m = Message::Archived {
            start: b(3, 9),
            chain: crate::chain::ChainHash::over(&[b"z"]),
            history: runs(),
        };
        let frame = m.encode().expect("encode").to_vec();
        assert_eq!(frame.len(), FRAME_HEADER_BYTES + 30 + 12 * 2);
        assert_eq!(
            Message::decode(&Bytes::from(frame.clone())),
            Ok((m, frame.len()))
        );
        // One run fewer than the count says.
        let mut short = frame[..frame.len() - 12].to_vec();
        let len = (short.len() - 4) as u32;
        short[..4].copy_from_slice(&len.to_be_bytes());
        assert!(matches!(
            Message::decode(&Bytes::from(short)),
            Err(WireError::BodySize { kind: 10, .. })
        ));
        // Runs out of order are not a history.
        let mut unordered = frame;
        unordered[FRAME_HEADER_BYTES + 30..FRAME_HEADER_BYTES + 34]
            .copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(
            Message::decode(&Bytes::from(unordered)),
            Err(WireError::History(2))
        );
    }

    #[test]
    fn appends_share_the_encoded_record() {
        let rec = match &all()[1] {
            Message::Append(r) => r.bytes.clone(),
            _ => unreachable!("the second message is an append"),
        };
        let (_, body) = encode_append(&rec);
        assert_eq!(body.as_ptr(), rec.as_ptr(), "no copy per destination");
    }
}
