//! A hosted database's log: its share of the host's shared log (every
//! database by default), or a segment log of its own (the legacy
//! single-database layout, or a host configured with
//! `per_database_logs`). The same calls either way.

use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::history::History;
use crate::record::Encoded;
use crate::segments::{ReadPlan, Released, SegmentError, SegmentLog};
use crate::shared_log::DbLog;
use crate::unlink::Unlink;
use bytes::Bytes;

/// See the module docs.
#[derive(Debug)]
pub(super) enum HostedLog {
    Own(Box<SegmentLog>),
    Shared(DbLog),
}

macro_rules! both {
    ($self:ident, $l:ident => $e:expr) => {
        match $self {
            HostedLog::Own($l) => $e,
            HostedLog::Shared($l) => $e,
        }
    };
}

impl HostedLog {
    pub(super) fn last(&self) -> Bookmark {
        both!(self, l => l.last())
    }
    pub(super) fn last_chain(&self) -> Option<ChainHash> {
        both!(self, l => l.last_chain())
    }
    pub(super) fn chain_at(&self, at: Bookmark) -> Option<ChainHash> {
        both!(self, l => l.chain_at(at))
    }
    pub(super) fn history(&self) -> History {
        both!(self, l => l.history())
    }
    pub(super) fn start(&self) -> Bookmark {
        both!(self, l => l.start())
    }
    pub(super) fn durable(&self) -> Bookmark {
        both!(self, l => l.durable())
    }
    pub(super) fn has_staged(&self) -> bool {
        both!(self, l => l.has_staged())
    }
    pub(super) fn disk_bytes(&self) -> u64 {
        both!(self, l => l.disk_bytes())
    }
    pub(super) fn release_point(&self, keep_bytes: u64) -> Bookmark {
        both!(self, l => l.release_point(keep_bytes))
    }
    pub(super) fn append_encoded(&mut self, r: &Encoded) -> Result<(), SegmentError> {
        both!(self, l => l.append_encoded(r))
    }
    pub(super) fn truncate_after(&mut self, keep: Bookmark) -> Result<u64, SegmentError> {
        both!(self, l => l.truncate_after(keep))
    }
    pub(super) fn reset_to(
        &mut self,
        start: Bookmark,
        chain: ChainHash,
        history: History,
    ) -> Result<u64, SegmentError> {
        both!(self, l => l.reset_to(start, chain, history))
    }
    /// Releases through `upto`; the caller unlinks the freed segments
    /// once it holds no lock (see [`crate::unlink`]).
    pub(super) fn release_deferred(
        &mut self,
        upto: Bookmark,
    ) -> Result<(Released, Unlink), SegmentError> {
        both!(self, l => l.release_deferred(upto))
    }
    pub(super) fn plan_batch(
        &self,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<ReadPlan, SegmentError> {
        both!(self, l => l.plan_batch(after, upto, max_bytes))
    }
    pub(super) fn bytes_between(
        &self,
        after: Bookmark,
        upto: Bookmark,
    ) -> Result<u64, SegmentError> {
        both!(self, l => l.bytes_between(after, upto))
    }
    pub(super) fn read_batch(
        &self,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>, SegmentError> {
        both!(self, l => l.read_batch(after, upto, max_bytes))
    }
}
