//! Tests of the shared log.
