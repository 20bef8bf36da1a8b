//! The durable queue databases' size changes ride to the catalog (D1's
//! step 4: "an internal, Kafka-like queue").
//!
//! # Contract
//!
//! - [`SizeQueue::push`] appends reports durably, up to a bound
//!   ([`MAX_QUEUE_ENTRIES`]); past it reports are dropped, which costs
//!   only staleness: every size is sent again when it changes, and the
//!   newest wins.
//! - [`SizeQueue::take`] hands a consumer a batch, oldest first;
//!   [`SizeQueue::ack`] is called once the catalog has it. A queue that
//!   can redeliver (the broker) keeps unacknowledged entries for the next
//!   consumer; the local one removes a batch when it is taken (a lost
//!   batch is, again, only staleness).
//! - Consumers are capped in number by the caller
//!   ([`super::control::LimitsService`]), so a burst cannot overload the
//!   catalog.
//!
//! Two implementations: [`LocalSizeQueue`] (a SQLite file on the control
//! plane's node, the default) and [`RedisSizeQueue`] (a stream on an
//! existing Redis broker, for a real deployment: `--size-queue
//! redis://host:port/`).

mod local;
mod redis_stream;

pub use local::LocalSizeQueue;
pub use redis_stream::RedisSizeQueue;

use super::limits::{LimitsError, SizeReport};

/// Most entries a queue holds.
pub const MAX_QUEUE_ENTRIES: u64 = 1_000_000;

/// A batch a consumer took, with what its queue needs to acknowledge it.
#[derive(Debug, Default)]
pub struct Taken {
    pub reports: Vec<SizeReport>,
    /// The broker's entry ids (empty for the local queue).
    pub(super) ids: Vec<String>,
}

/// See the module docs.
pub trait SizeQueue: Send + Sync + std::fmt::Debug {
    /// Appends reports durably; returns how many were kept.
    fn push(&self, reports: &[SizeReport]) -> Result<usize, LimitsError>;
    /// Up to `max` entries, oldest first.
    fn take(&self, max: usize) -> Result<Taken, LimitsError>;
    /// The catalog has `taken`: it is not handed out again.
    fn ack(&self, taken: &Taken) -> Result<(), LimitsError>;
    /// Entries held (taken but unacknowledged ones included).
    fn len(&self) -> Result<u64, LimitsError>;
    fn is_empty(&self) -> Result<bool, LimitsError> {
        Ok(self.len()? == 0)
    }
}

/// Opens the queue a `--size-queue` value names: `local` (a SQLite file at
/// `local_path`) or a `redis://` URL.
pub fn open(spec: &str, local_path: &std::path::Path) -> Result<Box<dyn SizeQueue>, LimitsError> {
    if spec == "local" {
        return Ok(Box::new(LocalSizeQueue::open(local_path)?));
    }
    if spec.starts_with("redis://") {
        return Ok(Box::new(RedisSizeQueue::open(
            spec,
            redis_stream::DEFAULT_STREAM,
        )?));
    }
    Err(LimitsError::QueueSpec(spec.chars().take(200).collect()))
}
