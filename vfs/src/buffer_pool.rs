//! Recycled capture buffers.
//!
//! Each captured transaction's frames live in one buffer that the page set
//! shares (as `Bytes`) until every consumer has dropped it. Handing the
//! buffer back here instead of to the allocator keeps a commit from paying
//! for a fresh multi-kilobyte allocation (and its cold cache lines) every
//! time; measured with callgrind, malloc and free were the largest cost of
//! capture after the checksum and the copy.

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// Buffers kept for reuse, at most.
const MAX_POOLED: usize = 16;
/// Larger buffers (big transactions) go back to the allocator.
const MAX_POOLED_CAPACITY: usize = 256 * 1024;

#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// An empty buffer with at least `capacity` bytes reserved.
    pub(crate) fn take(&self, capacity: usize) -> Vec<u8> {
        let mut buf = self.free.lock().pop().unwrap_or_default();
        buf.clear();
        buf.reserve(capacity);
        buf
    }

    /// Shares `buf` as `Bytes`; when the last clone drops, the buffer comes
    /// back to this pool (if the pool still exists).
    pub(crate) fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: Arc::downgrade(self),
        })
    }

    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() <= MAX_POOLED_CAPACITY {
            let mut free = self.free.lock();
            if free.len() < MAX_POOLED {
                free.push(buf);
            }
        }
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_page_buffer_is_reused_by_the_next_capture() {
        let pool = Arc::new(BufferPool::default());
        let mut buf = pool.take(4096);
        buf.extend_from_slice(&[1, 2, 3]);
        let ptr = buf.as_ptr();
        let bytes = pool.freeze(buf);
        let page = bytes.slice(1..3);
        drop(bytes);
        assert_eq!(&page[..], &[2, 3], "slices keep the buffer alive");
        drop(page);
        let again = pool.take(16);
        assert_eq!(again.as_ptr(), ptr, "the same allocation came back");
        assert!(again.is_empty());
    }

    #[test]
    fn buffers_outliving_their_pool_are_freed_normally() {
        let pool = Arc::new(BufferPool::default());
        let bytes = pool.freeze(pool.take(8));
        drop(pool);
        drop(bytes);
    }
}
