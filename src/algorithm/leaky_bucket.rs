//! Leaky-bucket queue (GCRA), mirrored by `lua/leaky_bucket.lua` and `lua/leaky_return.lua`.
//!
//! Callers reserve the next slot of a schedule that leaks `rate` tokens every `per_ms`, and wait for it. The
//! theoretical arrival time (TAT) is kept as whole milliseconds plus a fraction in units of `1 / rate` ms, so
//! the schedule is exact at any rate: a pacer counting in whole milliseconds cannot pace 5000 per second
//! (0.2 ms apart) and drifts at 3 per second (333.3 ms).

use super::{ms, Reply};

/// A schedule of `rate` tokens every `per_ms` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeakyBucket {
    /// Tokens per `per_ms` (≥ 1).
    pub rate: u64,
    /// Period in milliseconds (≥ 1).
    pub per_ms: u64,
}

/// The queue's state: the TAT `ms + frac / rate` milliseconds, and the last reservation's member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Tat {
    /// Whole milliseconds of the TAT.
    pub ms: u64,
    /// Fraction of a millisecond, in units of `1 / rate` ms.
    pub frac: u64,
    /// The rate `frac` was counted in.
    pub rate: u64,
    /// The member of the last reservation (empty once handed back).
    pub tail: String,
}

fn ceil_div_i(a: i128, b: i128) -> i64 {
    i64::try_from((a + b - 1).div_euclid(b)).unwrap_or(i64::MAX)
}

impl LeakyBucket {
    /// Reserves `cost` tokens at `now_ms` when the slot starts within `max_wait_ms`; the reply's
    /// `retry_after_ms` is the wait for the slot (granted) or until the wait would fit (refused). Cost 0 is a
    /// peek: nothing reserved, `retry_after_ms` 0 when a slot would fit now.
    pub fn reserve(&self, state: &mut Option<Tat>, cost: u64, max_wait_ms: u64, member: &str, now_ms: u64) -> Reply {
        let rate = i128::from(self.rate);
        let wait: i128 = match state.as_mut() {
            Some(t) => {
                if t.rate != self.rate && t.rate > 0 {
                    t.frac = u64::try_from(i128::from(t.frac) * rate / i128::from(t.rate)).unwrap_or(0);
                }
                if t.ms > now_ms || (t.ms == now_ms && t.frac > 0) {
                    (i128::from(t.ms) - i128::from(now_ms)) * rate + i128::from(t.frac)
                } else {
                    0
                }
            }
            None => 0,
        };
        let limit = i128::from(max_wait_ms) * rate;
        let step = i128::from(cost) * i128::from(self.per_ms);
        if wait > limit {
            return Reply {
                granted: 0,
                remaining: 0,
                retry_after_ms: ceil_div_i(wait - limit, rate),
                reset_after_ms: ceil_div_i(wait, rate),
                stamp: 0,
                held: 0,
            };
        }
        if cost == 0 {
            // A peek: the queue as it is, nothing reserved.
            return Reply {
                granted: 0,
                remaining: u64::try_from((limit - wait) / i128::from(self.per_ms) + 1).unwrap_or(u64::MAX),
                retry_after_ms: 0,
                reset_after_ms: ceil_div_i(wait, rate),
                stamp: 0,
                held: 0,
            };
        }
        let tat = wait + step;
        *state = Some(Tat {
            ms: now_ms + u64::try_from(tat.div_euclid(rate)).unwrap_or(u64::MAX),
            frac: u64::try_from(tat.rem_euclid(rate)).unwrap_or(0),
            rate: self.rate,
            tail: member.to_owned(),
        });
        let remaining = if tat <= limit {
            u64::try_from((limit - tat) / i128::from(self.per_ms) + 1).unwrap_or(u64::MAX)
        } else {
            0
        };
        Reply {
            granted: cost,
            remaining,
            retry_after_ms: ceil_div_i(wait, rate),
            reset_after_ms: ceil_div_i(tat, rate),
            stamp: 0,
            held: 0,
        }
    }

    /// Hands back the reservation `member` of `cost` tokens if it is still the last one (nobody queued behind
    /// it); otherwise nothing changes. `granted` is `cost` when handed back, else 0.
    pub fn give_back(&self, state: &mut Option<Tat>, cost: u64, member: &str, now_ms: u64) -> Reply {
        let Some(t) = state.as_mut().filter(|t| t.tail == member) else {
            let reset = state.as_ref().filter(|t| t.ms > now_ms).map_or(0, |t| t.ms - now_ms);
            return Reply {
                granted: 0,
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: ms(reset),
                stamp: 0,
                held: 0,
            };
        };
        let rate = i128::from(self.rate);
        let tat = (i128::from(t.ms) - i128::from(now_ms)) * rate + i128::from(t.frac)
            - i128::from(cost) * i128::from(self.per_ms);
        if tat <= 0 {
            *state = None;
            return Reply {
                granted: cost,
                ..Reply::default()
            };
        }
        t.ms = now_ms + u64::try_from(tat.div_euclid(rate)).unwrap_or(u64::MAX);
        t.frac = u64::try_from(tat.rem_euclid(rate)).unwrap_or(0);
        t.tail.clear();
        Reply {
            granted: cost,
            reset_after_ms: ceil_div_i(tat, rate),
            ..Reply::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_thousand_per_second_are_exactly_0_2_ms_apart() {
        let q = LeakyBucket {
            rate: 5000,
            per_ms: 1000,
        };
        let mut s = None;
        let waits: Vec<i64> = (0..11)
            .map(|i| q.reserve(&mut s, 1, 10, &format!("m{i}"), 0).retry_after_ms)
            .collect();
        // Slots at 0, 0.2, 0.4, ... 2.0 ms: waits rounded up to whole ms.
        assert_eq!(waits, [0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
        let t = s.expect("state");
        assert_eq!((t.ms, t.frac), (2, 1000), "TAT = 2.2 ms exactly");
    }
}
