//! One harness for every table of exact `now_ms` cases: each step is a call and the reply every store must
//! give, replayed against the in-process store and a real `redis-server` that the test starts.

use std::time::Duration;

use super::common::RedisServer;
use crate::algorithm::Reply;
use crate::store::{Call, MemoryStore, RedisStore, Store};

/// The four integers every script replies: `{ granted, remaining, retry_after_ms, reset_after_ms }`.
pub(super) fn r(granted: u64, remaining: u64, retry_after_ms: i64, reset_after_ms: i64) -> Reply {
    Reply {
        granted,
        remaining,
        retry_after_ms,
        reset_after_ms,
        stamp: 0,
        held: 0,
    }
}

/// A step of a table: what it checks, the call (at its `now_ms`) and the reply every store must give.
pub(super) type Step = (String, Call, Reply);

/// Builds a step.
pub(super) fn step(what: impl Into<String>, call: Call, reply: Reply) -> Step {
    (what.into(), call, reply)
}

/// Both stores: the in-process one and a real Redis, started for the test and stopped with it.
pub(super) struct EveryStore {
    pub(super) server: RedisServer,
    pub(super) memory: MemoryStore,
    pub(super) redis: RedisStore,
}

impl EveryStore {
    /// Starts a `redis-server` on a free loopback port and connects to it.
    pub(super) fn start() -> Self {
        let server = RedisServer::start();
        let redis = RedisStore::connect(&server.url(), Duration::from_secs(2)).expect("store");
        Self {
            server,
            memory: MemoryStore::new(),
            redis,
        }
    }

    /// The stores with a key prefix of their own.
    pub(super) fn each(&self) -> [(&'static str, &dyn Store); 2] {
        [("memory", &self.memory), ("redis", &self.redis)]
    }

    /// Replays the table `table(prefix)` on each store, asserting every reply.
    pub(super) async fn replay(&self, table: impl Fn(&str) -> Vec<Step>) {
        for (prefix, store) in self.each() {
            replay(store, prefix, &table(prefix)).await;
        }
    }
}

/// Replays `steps` on `store`, asserting every reply (a lease's stamp only where the step expects one: stamps are
/// compared between the stores by `mirror.rs`).
pub(super) async fn replay(store: &dyn Store, name: &str, steps: &[Step]) {
    for (i, (what, call, expected)) in steps.iter().enumerate() {
        let mut got = store
            .run(call)
            .await
            .unwrap_or_else(|e| panic!("{name}, step {i} ({what}): {e}"));
        if expected.stamp == 0 {
            got.stamp = 0;
        }
        assert_eq!(got, *expected, "{name}, step {i} ({what}): {call:?}");
    }
}
