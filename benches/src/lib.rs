//! Shared helpers for the walrelay benchmarks.

/// The `walrelay` binary's allocator, so that an in-process cluster here
/// allocates as the shipped processes do.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod append;
pub mod cluster;
pub mod floor;
pub mod pages;
pub mod steady;
