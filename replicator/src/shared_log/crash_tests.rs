//! Crash tests of the shared log.
