//! Unit tests of `fleet.rs`: the count and the first answer, on the in-process store and a fake clock.
use std::sync::Arc;
use std::time::Duration;

use super::{Fleet, Heard};
use crate::clock::{Clock, FakeClock};
use crate::store::guarded::Guarded;
use crate::store::MemoryStore;
use crate::timings::Timings;

/// Four members beating one rule's roster in a shared in-process store, on one fake clock.
fn fleet_of_four(clock: &FakeClock) -> Vec<Fleet> {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let shared = Arc::new(MemoryStore::with_clock(clock.clone()));
    let store = Arc::new(Guarded::new(
        shared,
        clock.clone(),
        Timings::from_call(Duration::from_millis(50)),
    ));
    (0..4)
        .map(|i| Fleet::new((format!("m{i}"), "tl".to_owned()), 4, store.clone(), clock.clone()))
        .collect()
}

async fn beat(fleet: &Fleet) -> u64 {
    let count = fleet
        .beat(&fleet.seen("sale"))
        .await
        .expect("the in-process store answers");
    count.processes
}

#[tokio::test]
async fn a_lower_count_is_taken_only_once_the_answers_showed_it_for_live() {
    let clock = FakeClock::starting_at(Duration::from_secs(100));
    let fleet = fleet_of_four(&clock);
    for member in fleet.iter().chain(&fleet) {
        beat(member).await;
    }
    assert!(fleet.iter().all(|m| m.processes("sale") == 4));
    // An outage of 5 s: nobody is heard. The first member back finds the others unheard for longer than the
    // live window and is answered a count of one; dividing its fair share by one would let its first lease take
    // the whole burst.
    clock.advance(Duration::from_secs(5));
    assert_eq!(beat(&fleet[0]).await, 1, "the roster's answer");
    assert_eq!(fleet[0].processes("sale"), 4, "a lower count is not taken at once");
    // The others are back within a beat: four again, and the lower answer is forgotten.
    clock.advance(Duration::from_millis(100));
    for member in &fleet[1..] {
        beat(member).await;
    }
    assert_eq!(beat(&fleet[0]).await, 4);
    // m3 is gone for good: once it is unheard for the live window the others are answered three, which they
    // take only after answers counted three for the live window too.
    let mut taken_after = None;
    for second in 1..=10 {
        clock.advance(Duration::from_secs(1));
        for member in &fleet[..3] {
            beat(member).await;
        }
        if taken_after.is_none() && fleet[0].processes("sale") == 3 {
            taken_after = Some(second);
        }
    }
    // Last heard 0.1 s in: answered three from 3 s on (unheard for the whole live window), taken from 6 s on.
    assert_eq!(
        taken_after,
        Some(6),
        "m3 dropped 3 s after the answers first counted three"
    );
    assert!(fleet[..3].iter().all(|m| m.processes("sale") == 3));
}

#[tokio::test]
async fn lower_answers_before_and_after_an_outage_do_not_add_up() {
    let clock = FakeClock::starting_at(Duration::from_secs(100));
    let fleet = fleet_of_four(&clock);
    for member in fleet.iter().chain(&fleet) {
        beat(member).await;
    }
    // Everyone stalls past the live window; m0 is answered first, a count of one, and keeps four.
    clock.advance(Duration::from_millis(3_100));
    assert_eq!(beat(&fleet[0]).await, 1);
    assert_eq!(fleet[0].processes("sale"), 4);
    // Then a 5 s outage. m0 is back first and answered one again: the two lower answers are 5 s apart but
    // not a run of them, so the count stays four.
    clock.advance(Duration::from_secs(5));
    assert_eq!(beat(&fleet[0]).await, 1);
    assert_eq!(
        fleet[0].processes("sale"),
        4,
        "a lower count before an outage does not count after it"
    );
}

#[tokio::test]
async fn a_rule_whose_roster_never_answered_fails_to_join_until_a_beat_is() {
    let clock = FakeClock::starting_at(Duration::from_secs(100));
    let fleet = fleet_of_four(&clock);
    // Its first beat came and went unanswered: it does not know the count, and beats soon.
    let _ = fleet[0].seen("sale").joined.set(());
    assert!(fleet[0].join("sale").await.is_err());
    assert!(fleet[0].is_urgent(&fleet[0].seen("sale")));
    beat(&fleet[0]).await;
    assert!(fleet[0].join("sale").await.is_ok());
    assert!(!fleet[0].is_urgent(&fleet[0].seen("sale")));
}

#[tokio::test]
async fn no_beat_puts_a_member_back_on_a_roster_it_left() {
    let clock = FakeClock::starting_at(Duration::from_secs(100));
    let fleet = fleet_of_four(&clock);
    for member in &fleet[..2] {
        member.join("sale").await.expect("answered");
    }
    assert_eq!(beat(&fleet[1]).await, 2);
    fleet[0].leave(Duration::from_secs(1)).await;
    assert_eq!(beat(&fleet[1]).await, 1, "m0 left");
    // A beat of m0's that comes after (a pass of the beats loop still under way at shutdown) is not sent: it
    // would count m0 again for the live window.
    let late = fleet[0].beat(&fleet[0].seen("sale")).await;
    assert!(late.is_err(), "{late:?}");
    assert_eq!(beat(&fleet[1]).await, 1, "m0 is not back");
}

#[test]
fn each_answer_steps_the_count_by_name() {
    let counted = |processes, at_ms| Heard::Counted { processes, at_ms };
    let fewer = |processes, at_ms, since_ms| Heard::Fewer {
        processes,
        at_ms,
        since_ms,
    };
    // Answers arrive about every second (a gap is more than two beats: 2 000 ms).
    let table = [
        (Heard::Unanswered, 1, 0, counted(1, 0)),
        (counted(4, 0), 5, 1_000, counted(5, 1_000)),
        (counted(4, 0), 3, 1_000, fewer(4, 1_000, 1_000)),
        (fewer(4, 1_000, 1_000), 3, 2_000, fewer(4, 2_000, 1_000)),
        (fewer(4, 3_000, 1_000), 3, 4_000, counted(3, 4_000)),
        (fewer(4, 3_000, 1_000), 4, 3_500, counted(4, 3_500)),
        // After a gap the fewer answers start over.
        (fewer(4, 1_000, 1_000), 3, 4_000, fewer(4, 4_000, 4_000)),
    ];
    for (heard, answered, now, expected) in table {
        assert_eq!(
            heard.answered(answered, now),
            expected,
            "{heard:?} answered {answered} at {now}"
        );
    }
    assert_eq!(Heard::Unanswered.processes(), None);
    assert_eq!(fewer(4, 1_000, 1_000).processes(), Some(4), "fewer are not taken yet");
}
