//! The fault layer (`store/fault.rs`) behaves as a production Redis and network do: a call is applied when it
//! reaches the store whatever its caller does, a frozen store runs its queue in order at the thaw, a lost reply
//! or a black hole ends in the caller's timeout, a killed process's calls stop, a rollback loses what came after
//! the copy, a stepped clock refills. Paused tokio time throughout.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::TokioClock;
use crate::error::StoreErrorKind;
use crate::store::fault::{Faults, LinkFault, StoreFault};
use crate::store::{Call, Store};

const TIMEOUT: Duration = Duration::from_millis(50);

fn faults() -> Faults {
    Faults::new(Arc::new(TokioClock::new()), Duration::from_millis(2), TIMEOUT)
}

/// One token of a fixed window of 100 a minute on key `k`.
fn take() -> Call {
    Call::fixed_window("k", (60_000, 100), 1, 0, None)
}

/// Tokens the window of `k` has granted, read straight from the store.
fn granted(faults: &Faults) -> u64 {
    let peek = Call::fixed_window("k", (60_000, 100), 0, 0, None);
    100 - faults.store().run_sync(&peek).expect("peek").remaining
}

#[tokio::test(start_paused = true)]
async fn a_healthy_link_applies_and_answers_after_the_round_trip() {
    let faults = faults();
    let link = faults.link(0);
    let sent = tokio::time::Instant::now();
    let reply = link.run(&take()).await.expect("answered");
    assert_eq!((reply.granted, reply.remaining), (1, 99));
    assert_eq!(sent.elapsed(), Duration::from_millis(2));
    assert_eq!(granted(&faults), 1);
}

#[tokio::test(start_paused = true)]
async fn a_frozen_store_applies_its_queue_in_order_at_the_thaw_though_its_callers_timed_out() {
    let faults = faults();
    let (a, b) = (faults.link(0), faults.link(1));
    faults.set_store(StoreFault::Frozen);
    let first = a.run(&take()).await.expect_err("frozen");
    assert_eq!(first.kind, StoreErrorKind::Timeout);
    let second = b.run(&Call::fixed_window("k", (60_000, 100), 5, 0, None)).await;
    assert_eq!(second.expect_err("frozen").kind, StoreErrorKind::Timeout);
    assert_eq!(granted(&faults), 0, "nothing runs while frozen");
    faults.set_store(StoreFault::Healthy);
    assert_eq!(granted(&faults), 6, "both ran at the thaw, whoever waited");
    assert_eq!(a.run(&take()).await.expect("thawed").remaining, 93);
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_times_out_though_the_store_moved_and_a_black_hole_moves_nothing() {
    let faults = faults();
    let link = faults.link(0);
    faults.set_store(StoreFault::LosingReplies);
    assert_eq!(link.run(&take()).await.expect_err("lost").kind, StoreErrorKind::Timeout);
    assert_eq!(granted(&faults), 1);
    faults.set_store(StoreFault::Hanging);
    let sent = tokio::time::Instant::now();
    assert_eq!(link.run(&take()).await.expect_err("hung").kind, StoreErrorKind::Timeout);
    assert_eq!(sent.elapsed(), TIMEOUT, "the store's own timeout");
    assert_eq!(granted(&faults), 1);
    faults.set_store(StoreFault::Refusing);
    assert_eq!(link.run(&take()).await.expect_err("refused").kind, StoreErrorKind::Io);
    assert_eq!(granted(&faults), 1);
}

#[tokio::test(start_paused = true)]
async fn a_partition_cuts_one_process_off_while_the_others_reach_the_store() {
    let faults = faults();
    let (cut, other) = (faults.link(0), faults.link(1));
    faults.set_link(0, LinkFault::Partitioned);
    assert_eq!(
        cut.run(&take()).await.expect_err("cut off").kind,
        StoreErrorKind::Timeout
    );
    assert_eq!(other.run(&take()).await.expect("reaches").remaining, 99);
    faults.set_link(0, LinkFault::Refused);
    assert_eq!(cut.run(&take()).await.expect_err("refused").kind, StoreErrorKind::Io);
    faults.set_link(0, LinkFault::Up);
    assert_eq!(cut.run(&take()).await.expect("healed").remaining, 98);
}

#[tokio::test(start_paused = true)]
async fn a_killed_process_sends_nothing_more_but_what_it_sent_is_applied() {
    let faults = faults();
    let link = faults.link(0);
    faults.set_latency(0, Duration::from_millis(20));
    // On its way (10 ms out) when the process dies.
    let in_flight = tokio::spawn({
        let link = faults.link(0);
        async move { link.run(&take()).await }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    faults.kill(0);
    let _ = in_flight.await;
    assert_eq!(granted(&faults), 1, "sent before the kill: applied");
    assert!(link.run(&take()).await.is_err());
    assert_eq!(granted(&faults), 1, "sent after: never");
}

#[tokio::test(start_paused = true)]
async fn a_paused_process_sends_when_it_goes_on() {
    let faults = faults();
    let link = faults.link(0);
    faults.set_paused(0, true);
    let waiting = tokio::spawn({
        let link = faults.link(0);
        async move { link.run(&take()).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(granted(&faults), 0, "not sent while stopped");
    faults.set_paused(0, false);
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(granted(&faults), 1, "sent once it went on");
    assert!(link.run(&take()).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_rollback_loses_what_came_after_the_copy_and_says_how_much() {
    let faults = faults();
    let link = faults.link(0);
    link.run(&take()).await.expect("first");
    faults.snapshot();
    link.run(&Call::fixed_window("k", (60_000, 100), 7, 0, None))
        .await
        .expect("lost later");
    assert_eq!(granted(&faults), 8);
    assert_eq!(faults.rollback(), 7, "the grants of the lost span");
    assert_eq!(granted(&faults), 1);
    assert_eq!(faults.rollback(), 0, "no copy kept: nothing changes");
}

#[tokio::test(start_paused = true)]
async fn a_clock_step_ends_a_window_early() {
    let faults = faults();
    let link = faults.link(0);
    link.run(&Call::fixed_window("k", (60_000, 100), 100, 0, None))
        .await
        .expect("all");
    assert_eq!(link.run(&take()).await.expect("refused").granted, 0);
    faults.step_clock(Duration::from_secs(60));
    assert_eq!(link.run(&take()).await.expect("a new window").granted, 1);
}
