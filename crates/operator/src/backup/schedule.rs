//! The backup schedule: a standard five-field cron expression (minute, hour, day of month,
//! month, day of week; numbers, `*`, lists, ranges and steps) read in an IANA time zone,
//! UTC by default. Pure: the next time it fires after a given instant.
//!
//! As in cron, when both day fields are restricted a day matches if either does; `7` is
//! Sunday like `0`. A local time skipped by a daylight-saving change fires at the first
//! instant after the gap; a repeated one fires once, at its first occurrence.

use k8s_openapi::jiff::civil::{Date, DateTime, Time};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Timestamp, ToSpan};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{field} {schedule:?}: {reason}")]
    Schedule {
        field: &'static str,
        schedule: String,
        reason: String,
    },
    #[error("spec.backup.timezone {timezone:?} is not a known IANA time zone")]
    TimeZone { timezone: String },
}

/// The field of a base backup's schedule, which [`Schedule::parse`]'s errors name.
pub const BASE_FIELD: &str = "spec.backup.base.schedule";
/// The field of a logical backup's schedule.
pub const LOGICAL_FIELD: &str = "spec.backup.logical.schedule";

impl Error {
    /// The error naming `field` as the schedule's (a schedule error; others as they are).
    pub fn at(self, field: &'static str) -> Self {
        match self {
            Error::Schedule {
                schedule, reason, ..
            } => Error::Schedule {
                field,
                schedule,
                reason,
            },
            other => other,
        }
    }
}

/// A parsed schedule: the allowed values of each field, as bit sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_restricted: bool,
    weekdays_restricted: bool,
    tz: TimeZone,
}

fn field(text: &str, min: u32, max: u32, name: &str) -> Result<(u64, bool), String> {
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or(format!("{name}: bad step in {item:?}"))?,
            ),
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let a: u32 = a.parse().map_err(|_| format!("{name}: bad value {a:?}"))?;
            let b: u32 = b.parse().map_err(|_| format!("{name}: bad value {b:?}"))?;
            (a, b)
        } else {
            let v: u32 = range
                .parse()
                .map_err(|_| format!("{name}: bad value {range:?}"))?;
            // `5/15` means from 5 to the end, every 15.
            (v, if step > 1 { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{name}: {item:?} is outside {min}-{max}"));
        }
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            v += step;
        }
    }
    Ok((set, text != "*"))
}

impl Schedule {
    pub fn parse(schedule: &str, timezone: Option<&str>) -> Result<Self, Error> {
        let bad = |reason: String| Error::Schedule {
            field: BASE_FIELD,
            schedule: schedule.to_string(),
            reason,
        };
        let parts: Vec<&str> = schedule.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = parts.as_slice() else {
            return Err(bad(format!(
                "needs 5 fields (minute hour day-of-month month day-of-week), has {}",
                parts.len()
            )));
        };
        let (minutes, _) = field(minute, 0, 59, "minute").map_err(bad)?;
        let (hours, _) = field(hour, 0, 23, "hour").map_err(bad)?;
        let (days, days_restricted) = field(day, 1, 31, "day of month").map_err(bad)?;
        let (months, _) = field(month, 1, 12, "month").map_err(bad)?;
        let (mut weekdays, weekdays_restricted) =
            field(weekday, 0, 7, "day of week").map_err(bad)?;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        let tz = match timezone {
            None | Some("UTC") | Some("") => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| Error::TimeZone {
                timezone: name.to_string(),
            })?,
        };
        Ok(Self {
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_restricted,
            weekdays_restricted,
            tz,
        })
    }

    fn day_matches(&self, date: Date) -> bool {
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => dom || dow,
            (true, false) => dom,
            (false, true) => dow,
            (false, false) => true,
        }
    }

    /// The first time strictly after `after` the schedule fires; `None` if it never does
    /// within five years (e.g. `0 0 31 2 *`).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let local = self.tz.to_datetime(after);
        // Start at the next whole minute.
        let mut t = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = local.checked_add(5.years()).ok()?;
        while t < limit {
            let date = t.date();
            if self.months & (1 << date.month()) == 0 {
                let first = date.first_of_month().checked_add(1.month()).ok()?;
                t = DateTime::from_parts(first, Time::midnight());
                continue;
            }
            if !self.day_matches(date) {
                t = DateTime::from_parts(date.tomorrow().ok()?, Time::midnight());
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let zoned = self.tz.to_ambiguous_zoned(t).compatible().ok()?;
            let at = zoned.timestamp();
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn next(schedule: &str, tz: Option<&str>, after: &str) -> String {
        Schedule::parse(schedule, tz)
            .expect("schedule")
            .next_after(ts(after))
            .expect("fires")
            .to_string()
    }

    #[test]
    fn daily_hourly_and_every_minute() {
        assert_eq!(
            next("0 2 * * *", None, "2026-11-29T17:00:00Z"),
            "2026-11-30T02:00:00Z"
        );
        assert_eq!(
            next("0 2 * * *", None, "2026-11-29T01:59:59Z"),
            "2026-11-29T02:00:00Z"
        );
        assert_eq!(
            next("0 2 * * *", None, "2026-11-29T02:00:00Z"),
            "2026-11-30T02:00:00Z"
        );
        assert_eq!(
            next("* * * * *", None, "2026-11-29T17:00:30Z"),
            "2026-11-29T17:01:00Z"
        );
        assert_eq!(
            next("*/15 * * * *", None, "2026-11-29T17:01:00Z"),
            "2026-11-29T17:15:00Z"
        );
        assert_eq!(
            next("5/20 * * * *", None, "2026-11-29T17:26:00Z"),
            "2026-11-29T17:45:00Z"
        );
        assert_eq!(
            next("0 9-17/4 * * *", None, "2026-11-29T10:00:00Z"),
            "2026-11-29T13:00:00Z"
        );
    }

    #[test]
    fn days_months_and_weekdays() {
        // 2026-11-29 is a Sunday.
        assert_eq!(
            next("0 0 * * 1", None, "2026-11-29T12:00:00Z"),
            "2026-11-30T00:00:00Z"
        );
        assert_eq!(
            next("0 0 * * 7", None, "2026-11-30T12:00:00Z"),
            "2026-12-06T00:00:00Z"
        );
        assert_eq!(
            next("0 0 1 1 *", None, "2026-11-29T12:00:00Z"),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(
            next("0 0 29 2 *", None, "2026-11-29T12:00:00Z"),
            "2028-02-29T00:00:00Z"
        );
        // Both day fields restricted: either matches (the 1st, or a Monday).
        assert_eq!(
            next("0 0 1 * 1", None, "2026-11-29T12:00:00Z"),
            "2026-11-30T00:00:00Z"
        );
        assert_eq!(
            next("0 0 1 * 1", None, "2026-11-30T12:00:00Z"),
            "2026-12-01T00:00:00Z"
        );
        assert!(
            Schedule::parse("0 0 31 2 *", None)
                .expect("parses")
                .next_after(ts("2026-01-01T00:00:00Z"))
                .is_none()
        );
    }

    #[test]
    fn time_zones_and_daylight_saving() {
        assert_eq!(
            next("0 2 * * *", Some("Europe/Berlin"), "2026-11-29T17:00:00Z"),
            "2026-11-30T01:00:00Z"
        );
        // 2027-03-28 02:30 does not exist in Berlin: it fires right after the gap.
        assert_eq!(
            next("30 2 * * *", Some("Europe/Berlin"), "2027-03-27T12:00:00Z"),
            "2027-03-28T01:30:00Z"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let e = Schedule::parse("0 2 * *", None).expect_err("four fields");
        assert!(e.to_string().contains("spec.backup.base.schedule"), "{e}");
        let e = e.at(LOGICAL_FIELD);
        assert!(
            e.to_string().starts_with("spec.backup.logical.schedule "),
            "{e}"
        );
        let e = Schedule::parse("61 2 * * *", None).expect_err("minute");
        assert!(e.to_string().contains("minute"), "{e}");
        let e = Schedule::parse("0 2 * * *", Some("Mars/Olympus")).expect_err("tz");
        assert!(e.to_string().contains("spec.backup.timezone"), "{e}");
    }
}
