//! Shared helpers for the walrelay benchmarks.

pub mod floor;
