//! A fixed window's calendar in config.toml: `reset` with `utc_offset` (a fixed offset) or `timezone` (an IANA
//! time zone, DST-correct), never both.

use serde::Deserialize;

use crate::rule::FieldError;
use crate::rule::{parse_utc_offset, Calendar, Zone};

/// `reset`: what a calendar window's length is a whole number of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Reset {
    Midnight,
    Hour,
    Minute,
}

/// The calendar of a fixed window of `window_ms`: `None` (rolling) without `reset`; else the fixed offset
/// `utc_offset` (UTC when neither is given) or the zone `timezone`.
pub(super) fn calendar(
    window_ms: u64,
    reset: Option<Reset>,
    utc_offset: Option<&str>,
    timezone: Option<&str>,
) -> Result<Option<Calendar>, FieldError> {
    if utc_offset.is_some() && timezone.is_some() {
        return Err((
            "timezone",
            "and `utc_offset` exclude each other: `timezone` follows daylight-saving time, `utc_offset` is fixed"
                .into(),
        ));
    }
    let Some(reset) = reset else {
        return match (utc_offset, timezone) {
            (Some(_), _) => Err(("utc_offset", "needs `reset` (midnight, hour or minute)".into())),
            (_, Some(_)) => Err(("timezone", "needs `reset` (midnight, hour or minute)".into())),
            (None, None) => Ok(None),
        };
    };
    let period: u64 = match reset {
        Reset::Midnight => 86_400_000,
        Reset::Hour => 3_600_000,
        Reset::Minute => 60_000,
    };
    if !window_ms.is_multiple_of(period) {
        return Err((
            "window",
            format!("must be a whole number of {reset:?}s to reset at one (got {window_ms} ms)").to_lowercase(),
        ));
    }
    if let Some(name) = timezone {
        return Ok(Some(Calendar::Zone(Zone::parse(name)?)));
    }
    // Windows start where (now_ms + offset) is a multiple of the window: local midnight.
    let offset = parse_utc_offset(utc_offset.unwrap_or("Z"))?;
    let w = i64::try_from(window_ms).map_err(|_| ("window", "is too long".to_owned()))?;
    let align_ms = u64::try_from(offset.rem_euclid(w)).unwrap_or(0);
    Ok(Some(Calendar::Offset { align_ms }))
}
