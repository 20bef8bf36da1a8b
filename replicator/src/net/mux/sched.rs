//! The channels of one multiplexed connection, sans IO: what each may
//! send (credit), what waits (bounded queues), in which order it goes
//! (round-robin over the channels with something sendable), and the
//! receiving side's accounting (credit to return, windows the peer must
//! keep).
//!
//! # Flow control
//!
//! Each channel may have at most `channel_window` bytes ([`charge`]) sent
//! and not yet handed to the peer's handler; the connection as a whole
//! `connection_window`. The receiver returns credit (a Credit frame of the
//! channel, which also returns it to the connection) after its handler took
//! the messages. A frame larger than a window goes when nothing of that
//! window is outstanding, so no record is too large to send.
//!
//! # Fairness
//!
//! [`Sched::next_out`] takes one frame from the first channel in the ring that
//! may send, then moves that channel to the back: a channel flooding the
//! connection gets one frame per turn like every other, and at most
//! `channel_window` of its bytes can sit ahead of another channel's frame
//! in the connection's queue.

use super::error::MuxError;
use crate::ids::DatabaseId;
use crate::net::mux_wire::{ChannelId, charge};
use crate::wire::Message;
use std::collections::{HashMap, VecDeque};

/// Windows and queue bounds of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub channel_window: u64,
    pub connection_window: u64,
    /// Bytes queued (not yet sendable) per channel.
    pub max_channel_queued: u64,
    /// Bytes queued over all channels of the connection.
    pub max_connection_queued: u64,
    /// Channels a peer may have open on one connection.
    pub max_channels: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            channel_window: 4 << 20,
            connection_window: 16 << 20,
            max_channel_queued: 64 << 20,
            max_connection_queued: crate::net::MAX_QUEUED_BYTES,
            max_channels: 1 << 16,
        }
    }
}

struct Chan {
    database: DatabaseId,
    credit: i64,
    queue: VecDeque<(Message, u64)>,
    queued: u64,
    in_ring: bool,
    /// Close once the queue is empty.
    closing: bool,
    /// Received and not yet returned as credit.
    outstanding: u64,
    /// Handed to the handler, to return at the next `take_credit`.
    to_return: u64,
}

/// What the connection should send next.
#[derive(Debug, PartialEq, Eq)]
pub enum Out {
    Data {
        channel: ChannelId,
        database: DatabaseId,
        message: Message,
    },
    /// The channel's last queued frame went out after `close`: send its
    /// Close; the channel is gone.
    Close {
        channel: ChannelId,
        database: DatabaseId,
    },
}

/// See the module docs.
pub struct Sched {
    limits: Limits,
    chans: HashMap<ChannelId, Chan>,
    ring: VecDeque<ChannelId>,
    /// Closing channels whose last frame went out: their Close is next.
    closed: VecDeque<ChannelId>,
    conn_credit: i64,
    queued: u64,
}

impl std::fmt::Debug for Sched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sched")
            .field("channels", &self.chans.len())
            .field("queued", &self.queued)
            .field("conn_credit", &self.conn_credit)
            .finish()
    }
}

impl Sched {
    pub fn new(limits: Limits) -> Sched {
        Sched {
            limits,
            chans: HashMap::new(),
            ring: VecDeque::new(),
            closed: VecDeque::new(),
            conn_credit: limits.connection_window as i64,
            queued: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Adds a channel (false: it exists already).
    pub fn open(&mut self, channel: ChannelId, database: DatabaseId) -> bool {
        if self.chans.contains_key(&channel) {
            return false;
        }
        self.chans.insert(
            channel,
            Chan {
                database,
                credit: self.limits.channel_window as i64,
                queue: VecDeque::new(),
                queued: 0,
                in_ring: false,
                closing: false,
                outstanding: 0,
                to_return: 0,
            },
        );
        true
    }

    pub fn database(&self, channel: ChannelId) -> Option<DatabaseId> {
        self.chans.get(&channel).map(|c| c.database)
    }

    pub fn is_closing(&self, channel: ChannelId) -> bool {
        self.chans.get(&channel).is_some_and(|c| c.closing)
    }

    pub fn channels(&self) -> Vec<ChannelId> {
        self.chans.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.chans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chans.is_empty()
    }

    /// Bytes queued over all channels.
    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// Bytes the connection may still send (negative after an oversize
    /// frame).
    pub fn connection_credit(&self) -> i64 {
        self.conn_credit
    }

    /// Bytes `channel` may still send.
    pub fn channel_credit(&self, channel: ChannelId) -> Option<i64> {
        self.chans.get(&channel).map(|c| c.credit)
    }

    /// Queues `message` on `channel`. Refused (nothing queued) past the
    /// channel's bound (the error names `channel`) or the connection's
    /// (it names the channel holding the most bytes, to be closed before
    /// trying again); a channel, or connection, with nothing queued always
    /// takes one message, however large. A closing or unknown channel
    /// drops it silently (Ok).
    pub fn enqueue(&mut self, channel: ChannelId, message: Message) -> Result<(), MuxError> {
        let Some(c) = self.chans.get_mut(&channel) else {
            return Ok(());
        };
        if c.closing {
            return Ok(());
        }
        let n = charge(&message);
        if c.queued > 0 && c.queued + n > self.limits.max_channel_queued {
            return Err(MuxError::ChannelQueueFull {
                channel,
                database: c.database,
                queued: c.queued + n,
                limit: self.limits.max_channel_queued,
            });
        }
        if self.queued > 0 && self.queued + n > self.limits.max_connection_queued {
            // The refusal names the channel holding the most, which is
            // the one to close: a flood must not get another database's
            // small commit refused.
            let own = c.database;
            let (worst, w) = self
                .chans
                .iter()
                .max_by_key(|(_, c)| c.queued)
                .map_or((channel, own), |(id, c)| (*id, c.database));
            return Err(MuxError::ConnectionQueueFull {
                channel: worst,
                database: w,
                queued: self.queued + n,
                limit: self.limits.max_connection_queued,
            });
        }
        c.queue.push_back((message, n));
        c.queued += n;
        self.queued += n;
        if !c.in_ring {
            c.in_ring = true;
            self.ring.push_back(channel);
        }
        Ok(())
    }

    /// Asks to close `channel` after what it has queued: Some(database)
    /// if nothing is queued (the channel is gone now; send its Close),
    /// None if it closes later through [`Out::Close`] (or is unknown).
    pub fn close(&mut self, channel: ChannelId) -> Option<DatabaseId> {
        let c = self.chans.get_mut(&channel)?;
        if c.queue.is_empty() {
            return self.remove(channel);
        }
        c.closing = true;
        None
    }

    /// Drops `channel` and whatever it queued at once, giving its
    /// outstanding bytes back to the connection.
    pub fn remove(&mut self, channel: ChannelId) -> Option<DatabaseId> {
        let c = self.chans.remove(&channel)?;
        self.queued -= c.queued;
        let outstanding = self.limits.channel_window as i64 - c.credit;
        self.conn_credit += outstanding.max(0);
        Some(c.database)
    }

    /// The peer returned `bytes` of `channel`'s credit (false: no such
    /// channel, e.g. closed meanwhile: ignored).
    pub fn credit(&mut self, channel: ChannelId, bytes: u32) -> bool {
        let Some(c) = self.chans.get_mut(&channel) else {
            return false;
        };
        c.credit += i64::from(bytes);
        self.conn_credit += i64::from(bytes);
        true
    }

    fn fits(credit: i64, window: u64, n: u64) -> bool {
        credit >= n as i64 || credit >= window as i64
    }

    /// The next frame to send, round-robin over the channels that may.
    pub fn next_out(&mut self) -> Option<Out> {
        while let Some(channel) = self.closed.pop_front() {
            if let Some(database) = self.remove(channel) {
                return Some(Out::Close { channel, database });
            }
        }
        for _ in 0..self.ring.len() {
            let channel = self.ring.pop_front()?;
            let Some(c) = self.chans.get_mut(&channel) else {
                continue;
            };
            let Some(&(_, n)) = c.queue.front() else {
                c.in_ring = false;
                continue;
            };
            let sendable = Self::fits(c.credit, self.limits.channel_window, n)
                && Self::fits(self.conn_credit, self.limits.connection_window, n);
            if !sendable {
                self.ring.push_back(channel);
                continue;
            }
            let Some((message, n)) = c.queue.pop_front() else {
                continue;
            };
            c.queued -= n;
            self.queued -= n;
            c.credit -= n as i64;
            self.conn_credit -= n as i64;
            let database = c.database;
            if !c.queue.is_empty() {
                self.ring.push_back(channel);
            } else {
                c.in_ring = false;
                if c.closing {
                    // Its last frame goes out now; the Close follows.
                    self.closed.push_back(channel);
                }
            }
            return Some(Out::Data {
                channel,
                database,
                message,
            });
        }
        None
    }

    /// A Data frame of `charge` bytes arrived on `channel`: refused if the
    /// peer sent past the window it was granted.
    pub fn received(&mut self, channel: ChannelId, charge: u64) -> Result<(), MuxError> {
        let window = self.limits.channel_window;
        let Some(c) = self.chans.get_mut(&channel) else {
            return Err(MuxError::UnknownChannel { channel });
        };
        if c.outstanding > 0 && c.outstanding + charge > window {
            return Err(MuxError::CreditExceeded {
                channel,
                database: c.database,
                outstanding: c.outstanding + charge,
                window,
            });
        }
        c.outstanding += charge;
        Ok(())
    }

    /// The handler took `charge` bytes of `channel`'s messages.
    pub fn handed(&mut self, channel: ChannelId, charge: u64) {
        if let Some(c) = self.chans.get_mut(&channel) {
            c.to_return += charge;
        }
    }

    /// The credit to return for `channel` now (a Credit frame), if any.
    pub fn take_credit(&mut self, channel: ChannelId) -> Option<u32> {
        let c = self.chans.get_mut(&channel)?;
        let n = c.to_return.min(u64::from(u32::MAX));
        if n == 0 {
            return None;
        }
        c.to_return -= n;
        c.outstanding = c.outstanding.saturating_sub(n);
        Some(n as u32)
    }
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
