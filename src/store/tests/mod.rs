//! Store tests that need the crate's internals (typed calls, replies): every table of exact `now_ms` cases
//! runs against both stores through one harness. They start their own `redis-server`, with the helper the
//! integration tests use.

#[path = "../../../tests/common/server.rs"]
mod common;
mod faults;
mod fleet;
mod harness;
mod latency;
mod marks;
mod mirror;
mod peek;
mod queue;
mod token_bucket;
mod windows;
mod zones;
