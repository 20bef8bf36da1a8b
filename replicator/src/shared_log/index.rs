//! A database's index into the shared log: where each of its records is
//! (segment, offset, length, lsn), with its bookmark and chain, and the
//! database's base (where its log starts). Pure bookkeeping, no I/O: the
//! same operations serve live appends and recovery's replay.

use super::format::{self, Base};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::history::History;

/// Where an entry is in the shared log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) segment: u64,
    /// Of the entry's first byte (its header).
    pub(super) offset: u64,
    /// The whole entry's bytes.
    pub(super) len: u64,
    pub(super) lsn: u64,
}

impl Loc {
    /// Where the payload starts and how long it is.
    pub(super) fn payload(&self) -> (u64, u64) {
        (
            self.offset + format::HEADER_BYTES as u64,
            self.len - format::OVERHEAD as u64,
        )
    }
}

/// One record of a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecEntry {
    pub(super) bookmark: Bookmark,
    pub(super) chain: ChainHash,
    pub(super) loc: Loc,
}

/// A database's index.
#[derive(Debug, Clone)]
pub(super) struct DbIndex {
    /// The bookmark before the first record (ZERO, or the last released
    /// record, or a reset's start).
    pub(super) base: Bookmark,
    pub(super) base_chain: Option<ChainHash>,
    pub(super) base_history: History,
    /// The newest release or reset entry: kept live (compaction carries
    /// it forward) since it is where the base is written down.
    pub(super) base_entry: Option<Loc>,
    pub(super) entries: Vec<RecEntry>,
    /// The newest bookmark a completed sync covers.
    pub(super) durable: Bookmark,
}

impl Default for DbIndex {
    fn default() -> DbIndex {
        DbIndex {
            base: Bookmark::ZERO,
            base_chain: Some(ChainHash::GENESIS),
            base_history: History::new(),
            base_entry: None,
            entries: Vec::new(),
            durable: Bookmark::ZERO,
        }
    }
}

impl DbIndex {
    pub(super) fn last(&self) -> Bookmark {
        self.entries.last().map_or(self.base, |e| e.bookmark)
    }

    pub(super) fn last_chain(&self) -> Option<ChainHash> {
        self.entries
            .last()
            .map_or(self.base_chain, |e| Some(e.chain))
    }

    pub(super) fn chain_at(&self, at: Bookmark) -> Option<ChainHash> {
        if at == self.base {
            return self.base_chain;
        }
        let i = self
            .entries
            .binary_search_by(|e| e.bookmark.cmp(&at))
            .ok()?;
        Some(self.entries[i].chain)
    }

    pub(super) fn history(&self) -> History {
        let mut h = self.base_history.clone();
        for e in &self.entries {
            h.record(e.bookmark);
        }
        h
    }

    /// Whether a record after `previous` with `prev_chain` follows.
    pub(super) fn follows(&self, previous: Bookmark, prev_chain: ChainHash) -> bool {
        previous == self.last() && self.last_chain().is_none_or(|c| c == prev_chain)
    }

    pub(super) fn push(&mut self, e: RecEntry) {
        assert!(
            e.bookmark > self.last(),
            "a database's index only grows forward"
        );
        self.entries.push(e);
    }

    /// Drops every record after `keep`; returns them.
    pub(super) fn cut_after(&mut self, keep: Bookmark) -> Vec<RecEntry> {
        let first = self.entries.partition_point(|e| e.bookmark <= keep);
        let cut = self.entries.split_off(first);
        self.durable = self.durable.min(self.last());
        cut
    }

    /// Makes `base` the start, dropping the records at or before it
    /// (release) or every record (reset). Returns the records dropped and
    /// the base entry it replaces.
    pub(super) fn rebase(
        &mut self,
        base: Base,
        at: Loc,
        reset: bool,
    ) -> (Vec<RecEntry>, Option<Loc>) {
        let keep_from = if reset {
            self.entries.len()
        } else {
            self.entries.partition_point(|e| e.bookmark <= base.start)
        };
        let dropped: Vec<RecEntry> = self.entries.drain(..keep_from).collect();
        self.base = base.start;
        self.base_chain = Some(base.chain);
        self.base_history = base.history;
        if reset {
            self.durable = base.start;
        } else {
            self.durable = self.durable.max(base.start);
        }
        (dropped, self.base_entry.replace(at))
    }

    /// Bytes of the shared log this database keeps live.
    pub(super) fn live_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.loc.len).sum::<u64>() + self.base_entry.map_or(0, |l| l.len)
    }

    /// The newest durable record such that the records after it hold at
    /// least `keep_bytes`; the base if there is none.
    pub(super) fn release_point(&self, keep_bytes: u64) -> Bookmark {
        let mut newer = 0u64;
        for e in self.entries.iter().rev() {
            if newer >= keep_bytes && e.bookmark <= self.durable {
                return e.bookmark;
            }
            newer += e.loc.payload().1;
        }
        self.base
    }

    /// The newest record at or before `limit`.
    pub(super) fn newest_at_or_before(&self, limit: Bookmark) -> Option<RecEntry> {
        let n = self.entries.partition_point(|e| e.bookmark <= limit);
        n.checked_sub(1).map(|i| self.entries[i])
    }
}
