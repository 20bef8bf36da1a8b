//! Why the multiplexer refused a frame, a send or a channel.

use crate::ids::DatabaseId;
use crate::net::mux_wire::{ChannelId, CloseReason};

/// A refusal of the multiplexer. Each is logged where it happens and
/// counted ([`super::MuxStats::refusals`]); a channel it closes reports it
/// to its handler as the reason (`NetHandler::closed`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    #[error(
        "channel {channel} (database {database}): {queued} bytes queued, over its limit of {limit}"
    )]
    ChannelQueueFull {
        channel: ChannelId,
        database: DatabaseId,
        queued: u64,
        limit: u64,
    },
    #[error(
        "channel {channel} (database {database}): the connection has {queued} bytes queued over all channels, over its limit of {limit}"
    )]
    ConnectionQueueFull {
        channel: ChannelId,
        database: DatabaseId,
        queued: u64,
        limit: u64,
    },
    #[error("a frame for channel {channel}, which was never opened on this connection")]
    UnknownChannel { channel: ChannelId },
    #[error("channel {channel} was opened for database {expected}, a frame names {got}")]
    WrongDatabase {
        channel: ChannelId,
        expected: DatabaseId,
        got: DatabaseId,
    },
    #[error(
        "channel {channel} (database {database}): the peer sent {outstanding} bytes past the window of {window} it was granted"
    )]
    CreditExceeded {
        channel: ChannelId,
        database: DatabaseId,
        outstanding: u64,
        window: u64,
    },
    #[error("channel {channel} opened twice, or out of order")]
    DuplicateChannel { channel: ChannelId },
    #[error("channel {channel} opened by the peer on a connection this side dialed")]
    OpenOnDialed { channel: ChannelId },
    #[error(
        "the first message on a channel must be a Handshake naming its database (got another kind)"
    )]
    NotIntroduced,
    #[error("channel {channel} for database {database}: nothing here accepts channels")]
    NoAcceptor {
        channel: ChannelId,
        database: DatabaseId,
    },
    #[error("a channel frame on an unmultiplexed connection, or the reverse")]
    Unmultiplexed,
    #[error(
        "channel {channel} for database {database}: {limit} channels are open on the connection, its limit"
    )]
    TooManyChannels {
        channel: ChannelId,
        database: DatabaseId,
        limit: usize,
    },
    #[error("the peer closed the channel: {0:?}")]
    PeerClosed(CloseReason),
    #[error("the shared connection was lost: {0}")]
    ConnectionLost(String),
}

impl MuxError {
    /// The channel a queue refusal closes.
    pub fn channel(&self) -> Option<ChannelId> {
        match self {
            MuxError::ChannelQueueFull { channel, .. }
            | MuxError::ConnectionQueueFull { channel, .. }
            | MuxError::UnknownChannel { channel }
            | MuxError::WrongDatabase { channel, .. }
            | MuxError::CreditExceeded { channel, .. }
            | MuxError::DuplicateChannel { channel }
            | MuxError::OpenOnDialed { channel }
            | MuxError::NoAcceptor { channel, .. }
            | MuxError::TooManyChannels { channel, .. } => Some(*channel),
            _ => None,
        }
    }

    /// What the peer is told when this closes a channel.
    pub fn close_reason(&self) -> CloseReason {
        match self {
            MuxError::ChannelQueueFull { .. } | MuxError::ConnectionQueueFull { .. } => {
                CloseReason::QueueFull
            }
            MuxError::WrongDatabase { .. } => CloseReason::WrongDatabase,
            MuxError::CreditExceeded { .. } => CloseReason::CreditExceeded,
            MuxError::NoAcceptor { .. } | MuxError::TooManyChannels { .. } => CloseReason::Refused,
            _ => CloseReason::Closed,
        }
    }
}
