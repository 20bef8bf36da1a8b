//! walrelay-vfs: everything that touches SQLite's files.
//!
//! The `walrelay` VFS wraps SQLite's `unix-excl` VFS and captures every
//! committed write transaction of an attached database as a [`PageSet`]: the
//! final image of each page it wrote plus the database size after commit.
//!
//! # Contract
//!
//! - [`attach`] a database path to a [`CaptureSink`] before opening it with
//!   `vfs=walrelay`; opening an unattached database through the VFS fails.
//! - The sink receives each committed transaction exactly once, in commit
//!   order, on the committing thread, before SQLite releases the WAL write
//!   lock. A rolled-back transaction reaches nobody.
//! - Applying the page sets in order to a copy of the database taken before
//!   the first of them reproduces the database after each one, page for page.
//! - What would let a write escape capture is refused with an error:
//!   `locking_mode=EXCLUSIVE`, journal modes other than WAL, automatic or
//!   pragma-driven checkpoints, and any write to the WAL outside the WAL
//!   write lock or to the database file outside a checkpoint. `PERSIST_WAL`
//!   is forced on. Checkpoints belong to the embedding engine
//!   (`sqlite3_wal_checkpoint_v2`).
//! - A capture that fails (sink refusal, invariant violation) poisons the
//!   database: [`Attachment::poisoned`] says why and every later WAL write
//!   fails, so nothing commits uncaptured.
//! - A committed transaction's frames are all in the WAL file when its
//!   commit returns (SQLite's own recovery finds it after a crash), though
//!   they reach the file as one write when the commit frame is complete,
//!   not as SQLite's two calls a frame (`write_behind`).
//! - All access to an attached database must go through this VFS in this
//!   process; the VFS never opens sockets.
//!
//! - A replica database is written only by its [`ReplicaWal`]: `append`
//!   writes a transaction's frames past the wal-index watermark (invisible),
//!   `confirm` moves the watermark so the whole transaction becomes visible
//!   to new read transactions at once, `discard_unconfirmed` drops what was
//!   never confirmed. SQLite connections on a replica may only read. On
//!   open, the WAL is cut back to the persisted watermark before SQLite
//!   reads it.
//!
//! No panic crosses the FFI boundary.

mod attach;
mod buffer_pool;
mod capture;
pub mod owner_lock;
mod page_set;
mod replica;
mod shim;
pub mod wal_format;
pub mod wal_index;
pub mod watermark;
mod write_behind;

pub use attach::{AttachError, Attachment, CaptureSink, SinkError, attach, attach_replica};
pub use capture::{CaptureError, CaptureStats};
pub use page_set::{CapturedTransaction, FrameNo, PageNo, PageSet, PageSetError, WalPosition};
pub use replica::{
    Appended, ApplyError, ReplicaInit, ReplicaOpenError, ReplicaWal, closed_replica_files,
    replica_files, rollback_journal,
};
pub use shim::{RegisterError, VFS_NAME, register};
