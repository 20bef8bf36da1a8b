//! How many reader connections of this process may map their database
//! file at once ([`crate::Options::reader_mmap_bytes`]).
//!
//! Each mapping is one of the kernel's memory areas, of which a process
//! may hold `vm.max_map_count` (65,530 by default) in all, the allocator's
//! included; a fleet node may hold many thousands of databases open, each
//! with readers. So mapping is a budget: a reader takes a [`MapSlot`] when
//! it is configured, or reads through `pread` as before if none is left,
//! and gives the slot back when it closes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Reader connections of this process that may map at once: a sixteenth
/// of the kernel's default `vm.max_map_count`.
pub(crate) const MAX_MAPPED_READERS: usize = 4096;

/// A bounded count of mapped readers.
pub(crate) struct MapBudget {
    used: AtomicUsize,
    limit: usize,
}

/// The process's budget.
pub(crate) static READERS: MapBudget = MapBudget::new(MAX_MAPPED_READERS);

impl MapBudget {
    pub(crate) const fn new(limit: usize) -> MapBudget {
        MapBudget {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// A slot, if one is left.
    pub(crate) fn take(&'static self) -> Option<MapSlot> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| MapSlot(self))
    }

    /// Slots taken now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// One reader's permission to map; given back when dropped (after its
/// connection closed: declared after it in [`crate::database::Conn`]).
pub(crate) struct MapSlot(&'static MapBudget);

impl Drop for MapSlot {
    fn drop(&mut self) {
        let before = self.0.used.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a map slot given back twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_its_limit_the_budget_refuses_and_a_returned_slot_is_taken_again() {
        let budget: &'static MapBudget = Box::leak(Box::new(MapBudget::new(2)));
        let a = budget.take().expect("first");
        let b = budget.take().expect("second");
        assert!(budget.take().is_none(), "the limit is 2");
        assert_eq!(budget.used(), 2);
        drop(a);
        assert_eq!(budget.used(), 1);
        let c = budget.take().expect("a returned slot");
        assert!(budget.take().is_none());
        drop((b, c));
        assert_eq!(budget.used(), 0);
    }
}
