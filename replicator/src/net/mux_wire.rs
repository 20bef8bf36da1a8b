//! The multiplexed channel frame: the one module that reads or writes the
//! body of a [`crate::wire`] frame of kind 11 (`Mux`), which carries the
//! replication of many databases over one connection between two nodes
//! ([`super::mux`]).
//!
//! ```text
//! frame (big-endian), after the usual 6-byte header of `wire`
//! (length u32, version u8 = 2, kind u8 = 11):
//!  6  op        u8: 1 Open, 2 Data, 3 Close, 4 Credit
//!  7  channel   u64: chosen by the side that dialed the connection,
//!                    unique on it, never reused
//! 15  database  u64: the database the channel was opened for; every
//!                    frame of the channel names it (checked)
//! 23  by op:
//!     1 Open    nothing: the dialer opens the channel      = 17 + 0
//!     2 Data    one whole inner `wire` frame (its own length,
//!               version, kind and body) of any kind but Mux  = 17 + frame
//!     3 Close   reason u8 (0 closed, 1 wrong database, 2 queue full,
//!               3 credit exceeded, 4 refused: nobody accepts) = 17 + 1
//!     4 Credit  bytes u32: the receiver handed that many more bytes of
//!               the channel's Data to its handler; the sender may send
//!               that many more (channel and connection window)  = 17 + 4
//! ```
//!
//! A Data frame costs its sender credit of [`charge`] bytes: an Append's
//! record plus its inner header, or a flat [`SMALL_CHARGE`] for any other
//! message (both sides compute it from the message alone).
//!
//! An Append inside Data stays zero-copy: [`encode_parts`] returns the
//! outer header, the channel header and the inner header as one small
//! buffer and the record's shared bytes as the second part. Decoding slices
//! the input (no copy of page images); the inner frame's length is checked
//! against what the outer frame holds before anything is decoded, and a
//! Mux frame inside a Mux frame is refused ([`MuxWireError::Nested`]).

use crate::ids::DatabaseId;
use crate::wire::{FRAME_HEADER_BYTES, Message, VERSION, WireError, encode_append};
use bytes::{BufMut, Bytes, BytesMut};

/// The wire kind of a channel frame.
pub const KIND: u8 = 11;
/// Op + channel + database.
pub const HEADER_BYTES: usize = 17;
/// What a Data frame of anything but an Append costs in credit.
pub const SMALL_CHARGE: u64 = 64;

/// A channel on one multiplexed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u64);

impl std::fmt::Display for ChannelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ch{}", self.0)
    }
}

/// Why a channel was closed, as sent to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    Closed,
    WrongDatabase,
    QueueFull,
    CreditExceeded,
    Refused,
}

impl CloseReason {
    fn code(self) -> u8 {
        match self {
            CloseReason::Closed => 0,
            CloseReason::WrongDatabase => 1,
            CloseReason::QueueFull => 2,
            CloseReason::CreditExceeded => 3,
            CloseReason::Refused => 4,
        }
    }
    fn from_code(c: u8) -> Option<CloseReason> {
        Some(match c {
            0 => CloseReason::Closed,
            1 => CloseReason::WrongDatabase,
            2 => CloseReason::QueueFull,
            3 => CloseReason::CreditExceeded,
            4 => CloseReason::Refused,
            _ => return None,
        })
    }
}

/// What a channel frame says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MuxOp {
    Open,
    Data(Box<Message>),
    Close(CloseReason),
    Credit(u32),
}

/// One channel frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MuxFrame {
    pub channel: ChannelId,
    pub database: DatabaseId,
    pub op: MuxOp,
}

/// Why a channel frame's body is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxWireError {
    #[error("channel frame body of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown channel op {0}")]
    UnknownOp(u8),
    #[error("channel op {op} needs a {want}-byte body, got {got}")]
    BodySize { op: u8, want: usize, got: usize },
    #[error("unknown channel close reason {0}")]
    UnknownReason(u8),
    #[error("a channel frame inside a channel frame")]
    Nested,
    #[error("inner frame: {0}")]
    Inner(Box<WireError>),
}

const OPEN: u8 = 1;
const DATA: u8 = 2;
const CLOSE: u8 = 3;
const CREDIT: u8 = 4;

/// The credit a Data frame carrying `message` costs.
pub fn charge(message: &Message) -> u64 {
    match message {
        Message::Append(r) => r.bytes.len() as u64 + FRAME_HEADER_BYTES as u64,
        _ => SMALL_CHARGE,
    }
}

fn head(frame: &MuxFrame, op: u8, body_len: usize) -> BytesMut {
    let mut b = BytesMut::with_capacity(FRAME_HEADER_BYTES + HEADER_BYTES + 8);
    b.put_u32((2 + HEADER_BYTES + body_len) as u32);
    b.put_u8(VERSION);
    b.put_u8(KIND);
    b.put_u8(op);
    b.put_u64(frame.channel.0);
    b.put_u64(frame.database.0);
    b
}

/// The whole frame in (at most) two parts: headers, then a shared body
/// (an inner Append's record bytes, never copied; empty otherwise).
pub fn encode_parts(frame: &MuxFrame) -> Result<(Bytes, Bytes), WireError> {
    match &frame.op {
        MuxOp::Open => Ok((head(frame, OPEN, 0).freeze(), Bytes::new())),
        MuxOp::Close(reason) => {
            let mut b = head(frame, CLOSE, 1);
            b.put_u8(reason.code());
            Ok((b.freeze(), Bytes::new()))
        }
        MuxOp::Credit(n) => {
            let mut b = head(frame, CREDIT, 4);
            b.put_u32(*n);
            Ok((b.freeze(), Bytes::new()))
        }
        MuxOp::Data(inner) => match inner.as_ref() {
            Message::Mux(_) => Err(WireError::Mux(MuxWireError::Nested)),
            Message::Append(record) => {
                let (inner_head, body) = encode_append(&record.bytes);
                let mut b = head(frame, DATA, inner_head.len() + body.len());
                b.put_slice(&inner_head);
                Ok((b.freeze(), body))
            }
            other => {
                let inner = other.encode()?;
                let mut b = head(frame, DATA, inner.len());
                b.put_slice(&inner);
                Ok((b.freeze(), Bytes::new()))
            }
        },
    }
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(raw)
}

/// Decodes a channel frame's body (what follows the 6-byte header; the
/// caller checked the outer frame's length).
pub fn decode_body(body: &Bytes) -> Result<MuxFrame, MuxWireError> {
    if body.len() < HEADER_BYTES {
        return Err(MuxWireError::Short(body.len()));
    }
    let op = body[0];
    let channel = ChannelId(be64(body, 1));
    let database = DatabaseId(be64(body, 9));
    let rest = body.slice(HEADER_BYTES..);
    let fixed = |want: usize| {
        if rest.len() == want {
            Ok(())
        } else {
            Err(MuxWireError::BodySize {
                op,
                want,
                got: rest.len(),
            })
        }
    };
    let op = match op {
        OPEN => {
            fixed(0)?;
            MuxOp::Open
        }
        CLOSE => {
            fixed(1)?;
            MuxOp::Close(
                CloseReason::from_code(rest[0]).ok_or(MuxWireError::UnknownReason(rest[0]))?,
            )
        }
        CREDIT => {
            fixed(4)?;
            MuxOp::Credit(u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]))
        }
        DATA => {
            if rest.len() >= FRAME_HEADER_BYTES && rest[5] == KIND {
                return Err(MuxWireError::Nested);
            }
            let (inner, used) =
                Message::decode(&rest).map_err(|e| MuxWireError::Inner(Box::new(e)))?;
            if used != rest.len() {
                return Err(MuxWireError::BodySize {
                    op,
                    want: used,
                    got: rest.len(),
                });
            }
            MuxOp::Data(Box::new(inner))
        }
        other => return Err(MuxWireError::UnknownOp(other)),
    };
    Ok(MuxFrame {
        channel,
        database,
        op,
    })
}

#[cfg(test)]
#[path = "mux_wire_tests.rs"]
mod tests;
