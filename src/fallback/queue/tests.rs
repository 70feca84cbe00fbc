//! The local queues of `fail_mode = "local"` on a fake clock: pacing at the process's share after the slots the
//! store booked, and the charge to the shared queue before the next store call and at shutdown.

use std::sync::Arc;
use std::time::Duration;

use super::super::{Fallback, Unsettled};
use super::*;
use crate::background::Background;
use crate::clock::{Clock, FakeClock};
use crate::fleet::Fleet;
use crate::rule::{Algorithm, FailMode};
use crate::store::call::Call;
use crate::store::call::Members;
use crate::store::guarded::{Guarded, Timeouts};
use crate::store::MemoryStore;

/// 100 per second: 10 ms apart in the shared queue; 21.25 per second in each of 4 processes' local queues
/// ([`local_pace`]: 85 per second in all, 15 given up for the phases nobody aligns), 800 000 / 17 000 ≈ 47.06 ms
/// apart.
const QUEUE: LeakyBucket = LeakyBucket {
    rate: 100,
    per_ms: 1000,
};
const KEY: &str = "tl:{jobs:t}";

fn reserve(queues: &Queues, member: &str, now_ms: u64) -> Reply {
    queues
        .reserve(KEY, (QUEUE, 4), (1, 2_000), member, now_ms)
        .expect("room")
}

#[test]
fn the_local_queue_paces_at_its_share_after_the_end_of_the_shared_schedule() {
    let queues = Queues::new(10);
    // The store last said its schedule ends 1.5 s after 10 s: those slots run at the whole rate first.
    queues.seen(KEY, QUEUE, 1_500, 10_000);
    let first = reserve(&queues, "m0", 10_000);
    assert_eq!(first.granted, 1);
    // It starts 4 slots of the shared queue (40 ms) after that end: the processes saw ends a few slots apart.
    assert_eq!(first.retry_after_ms, 1_540, "{first:?}");
    // Then ≈ 47.06 ms apart: 21.25 per second.
    for i in 1..=5 {
        let next = reserve(&queues, &format!("m{i}"), 10_000);
        let expected = 1_540 + (i * 800_000_u64).div_ceil(17_000);
        assert!(
            (expected - 1..=expected).contains(&u64::try_from(next.retry_after_ms).expect("a wait")),
            "slot {i}: {next:?}"
        );
    }
    // Up to max_wait (2 s) ahead: slots 6 to 9 (at 1.82 s to 1.96 s), then refused.
    let granted = (6..20)
        .filter(|i| reserve(&queues, &format!("m{i}"), 10_000).granted > 0)
        .count();
    assert_eq!(granted, 4);
    // What it booked is owed until its end, and charged from there.
    let (queue, until) = queues.take_owed(KEY, 10_000).expect("not busy").expect("owed");
    assert_eq!(queue, QUEUE);
    assert!((11_980..=12_040).contains(&until), "{until}");
}

#[test]
fn a_key_the_store_never_reported_or_whose_schedule_has_run_starts_now() {
    let queues = Queues::new(10);
    assert_eq!(reserve(&queues, "a", 5_000).retry_after_ms, 0);
    assert_eq!(reserve(&queues, "b", 5_000).retry_after_ms, 48);
    let other = "tl:{jobs:u}";
    queues.seen(other, QUEUE, 100, 1_000);
    let late = queues.reserve(other, (QUEUE, 4), (1, 2_000), "c", 5_000).expect("room");
    assert_eq!((late.granted, late.retry_after_ms), (1, 0));
}

#[test]
fn owed_slots_are_charged_once_and_slots_already_run_need_no_charge() {
    let queues = Queues::new(10);
    assert!(!queues.any_owed());
    reserve(&queues, "a", 0);
    reserve(&queues, "b", 0);
    assert!(queues.any_owed());
    assert_eq!(queues.take_owed(KEY, 0), Ok(Some((QUEUE, 95))));
    // While the charge is in flight, the key's other callers know it.
    assert_eq!(queues.take_owed(KEY, 0), Err(Busy));
    // A failed charge keeps the slots owed.
    queues.settled(KEY, 95, false);
    assert_eq!(queues.take_owed(KEY, 10), Ok(Some((QUEUE, 95))));
    // A slot booked while the charge was in flight stays owed after it.
    reserve(&queues, "c", 10);
    queues.settled(KEY, 95, true);
    assert_eq!(queues.take_owed(KEY, 10), Ok(Some((QUEUE, 142))));
    queues.settled(KEY, 142, true);
    assert!(!queues.any_owed());
    // Slots that have run by the time the store answers are behind its schedule's end: nothing to charge.
    reserve(&queues, "d", 1_000);
    assert!(queues.any_owed());
    assert_eq!(queues.take_owed(KEY, 1_048), Ok(None));
    assert!(!queues.any_owed());
}

#[test]
fn a_local_slot_handed_back_is_not_charged() {
    let queues = Queues::new(10);
    reserve(&queues, "a", 0);
    reserve(&queues, "b", 0);
    let back = queues.give_back(KEY, (QUEUE, 4), 1, "b", 0);
    assert_eq!(back.granted, 1);
    assert_eq!(queues.take_owed(KEY, 0), Ok(Some((QUEUE, 48))));
}

#[test]
fn a_full_map_books_nothing_for_a_new_key_and_the_sweep_keeps_what_is_owed() {
    let queues = Queues::new(1);
    reserve(&queues, "a", 0);
    assert!(queues
        .reserve("tl:{jobs:new}", (QUEUE, 4), (1, 2_000), "b", 0)
        .is_none());
    queues.sweep(600_000, 60_000);
    assert_eq!(queues.owing_keys(), [KEY]);
}

/// A fallback over an in-process shared store, 4 processes, on `clock`.
fn fallback(clock: &FakeClock) -> (Arc<Fallback>, Arc<MemoryStore>) {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let shared = Arc::new(MemoryStore::with_clock(clock.clone()));
    let store = Arc::new(Guarded::new(
        shared.clone(),
        clock.clone(),
        Timeouts::from_call(Duration::from_millis(50)),
    ));
    let members = Arc::new(Members::new());
    let fleet = Fleet::new(
        (members.name().to_owned(), "tl".to_owned()),
        4,
        store.clone(),
        clock.clone(),
    );
    fleet.joined_as("jobs", 4);
    let fallback = Fallback::new(
        (store, clock.clone()),
        Arc::new(Background::default()),
        (members, Arc::new(fleet)),
        MemoryStore::with_clock(clock),
        100,
    );
    (Arc::new(fallback), shared)
}

const RULE: Algorithm = Algorithm::LeakyBucket {
    rate: 100,
    per_ms: 1000,
    max_wait_ms: 2_000,
};

fn reservation(member: &str) -> Call {
    Call::reserve(KEY, QUEUE, 1, 2_000, member)
}

/// The shared queue's end as the store sees it now (a peek).
fn shared_end_ms(shared: &MemoryStore) -> i64 {
    let peek = Call::reserve(KEY, QUEUE, 0, 2_000, "peek");
    shared.run_sync(&peek).expect("peek").reset_after_ms
}

#[tokio::test]
async fn what_the_local_queue_booked_is_charged_before_the_next_store_call_then_the_key_is_held() {
    let clock = FakeClock::starting_at(Duration::from_secs(100));
    let (fallback, shared) = fallback(&clock);
    let local = (FailMode::Local, &RULE);
    // The store books 100 slots: its schedule ends 1 s ahead.
    for i in 0..100 {
        let reply = fallback
            .run(local, KEY, &reservation(&format!("s{i}")))
            .await
            .expect("booked");
        assert_eq!(reply.granted, 1);
    }
    // The store fails: ten slots in the local queue, ≈ 47 ms apart from 40 ms after that second.
    let mut last = 0;
    for i in 0..10 {
        let reply = fallback.run_local(&reservation(&format!("l{i}"))).expect("local");
        assert_eq!(reply.granted, 1);
        last = reply.retry_after_ms;
    }
    assert!((1_463..=1_464).contains(&last), "{last}");
    // 300 ms later the store answers again: the next call charges first, and the key is held.
    clock.advance(Duration::from_millis(300));
    match fallback.run(local, KEY, &reservation("n1")).await {
        Err(Unsettled::Held(hold)) => assert_eq!(hold, Duration::from_millis(600)),
        other => panic!("{other:?}"),
    }
    // The shared schedule now ends where the local one does: after its last slot.
    let local_end = last - 300 + 47;
    assert!((local_end..=local_end + 1).contains(&shared_end_ms(&shared)));
    // Held for the recovery spread, then the next slot comes after the local ones.
    clock.advance(Duration::from_millis(599));
    assert!(matches!(
        fallback.run(local, KEY, &reservation("n2")).await,
        Err(Unsettled::Held(_))
    ));
    clock.advance(Duration::from_millis(1));
    let next = fallback.run(local, KEY, &reservation("n3")).await.expect("booked");
    let waited = next.retry_after_ms;
    assert!((local_end - 600..=local_end - 599).contains(&waited), "{next:?}");
    assert!(!fallback.queues.any_owed());
}

#[tokio::test]
async fn shutdown_charges_what_the_local_queues_owe() {
    let clock = FakeClock::starting_at(Duration::from_secs(100));
    let (fallback, shared) = fallback(&clock);
    for i in 0..5 {
        fallback.run_local(&reservation(&format!("l{i}"))).expect("local");
    }
    assert_eq!(shared_end_ms(&shared), 0);
    fallback.settle_all_queues(Duration::from_secs(1)).await;
    assert!(!fallback.queues.any_owed());
    assert_eq!(shared_end_ms(&shared), 236);
}
