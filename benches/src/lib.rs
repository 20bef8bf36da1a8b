//! Shared helpers for the walrelay benchmarks.

pub mod append;
pub mod cluster;
pub mod floor;
pub mod pages;
