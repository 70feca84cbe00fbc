//! Leasing: tokens leased in batches from the shared bucket into local buckets, one per hot key, so a hot key
//! is decided in process and the store sees one call per batch.
//!
//! `bucket.rs` is one key's leased tokens (the hot path); `engine.rs` decides from them, leases, expires, gives
//! back, sweeps and evicts.

mod book;
pub(crate) mod bucket;
pub(crate) mod engine;
pub(crate) mod heat;
pub(crate) mod reserve;
pub(crate) mod schedule;
pub(crate) mod shards;
pub(crate) mod wait;

// The hot path's races under the loom model checker: built only with `--cfg tokenlease_loom` (scripts/test.sh).
#[cfg(all(test, tokenlease_loom))]
mod loom_tests;
