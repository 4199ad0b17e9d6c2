//! Lending hours: the weekly windows in which the owner lends, in the
//! machine's local time zone (`[lending] hours`, issue 35 item 1).
//!
//! A schedule is a list of windows such as `"Mon-Fri 19:00-08:00"` or
//! `"Sat-Sun"`. Whether lending is open is a function of the local *civil*
//! time, so a window opens at 19:00 on the wall clock whatever the offset
//! that day; [`Schedule::outlook`] turns it into the instants where lending
//! opens or closes, with the time zone's own transitions (DST) among the
//! candidates, and [`Outlook::project`] puts those instants on the engine's
//! timeline ([`LendingHours`]). Nothing here reads a clock: `now` is an
//! argument, so the same code runs under simulated time in tests.

use std::fmt;

use jiff::civil::{Date, DateTime, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use crate::engine::{HoursChange, LendingHours};
use crate::time::Moment;

/// How far ahead [`Schedule::outlook`] looks: more than a week, so a weekly
/// schedule always shows its next opening and closing.
pub const OUTLOOK_DAYS: i64 = 8;

/// Minutes in a day.
const DAY_MINUTES: u16 = 24 * 60;

/// Days as written in a window, Monday first.
const DAY_NAMES: [(&str, &str); 7] = [
    ("mon", "monday"),
    ("tue", "tuesday"),
    ("wed", "wednesday"),
    ("thu", "thursday"),
    ("fri", "friday"),
    ("sat", "saturday"),
    ("sun", "sunday"),
];

/// One weekly window: the days it starts on and its start and end time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    /// The days the window starts on, Monday first.
    days: [bool; 7],
    /// Minute of the day it opens.
    start: u16,
    /// Minute of the day it closes (1..=1440); at or before `start` it
    /// closes on the next day (`19:00-08:00`).
    end: u16,
}

impl Window {
    fn crosses_midnight(&self) -> bool {
        self.end <= self.start
    }

    /// Whether the window is open at minute `minute` of weekday `day`
    /// (Monday 0), counting a window that started the day before and runs
    /// past midnight.
    fn open_at(&self, day: usize, minute: u16) -> bool {
        if self.crosses_midnight() {
            let yesterday = (day + 6) % 7;
            (self.days[day] && minute >= self.start) || (self.days[yesterday] && minute < self.end)
        } else {
            self.days[day] && minute >= self.start && minute < self.end
        }
    }
}

/// A schedule entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {index} ({entry:?}): {why}")]
pub struct HoursError {
    /// 1-based position of the entry in the list.
    pub index: usize,
    /// The entry as written.
    pub entry: String,
    /// What is wrong, and what is accepted.
    pub why: String,
}

/// The owner's lending hours: open while any window is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    windows: Vec<Window>,
    written: Vec<String>,
}

/// What the schedule says from one instant on: open or not, and each
/// instant it opens or closes up to [`OUTLOOK_DAYS`] ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlook {
    /// Open at the instant the outlook was taken.
    pub open: bool,
    /// Each change after it, earliest first: `(instant, opens)`.
    pub changes: Vec<(Timestamp, bool)>,
}

impl Schedule {
    /// Parse `[lending] hours`: every entry is `DAYS [HH:MM-HH:MM]`.
    ///
    /// `DAYS` is `daily`, `weekdays` (Mon-Fri), `weekends` (Sat-Sun), a day
    /// (`Mon` or `Monday`), a range (`Mon-Fri`, `Fri-Mon` wraps) or a list
    /// (`Sat,Sun`); without times the window is the whole day. An end at or
    /// before the start closes on the next day (`19:00-08:00`); `24:00` is
    /// the end of the day. Days name the day a window opens.
    ///
    /// # Errors
    ///
    /// The first entry that does not parse, or an empty list.
    pub fn parse(entries: &[String]) -> Result<Schedule, HoursError> {
        if entries.is_empty() {
            return Err(HoursError {
                index: 0,
                entry: String::new(),
                why:
                    "the list is empty, which would never lend; remove the key to lend at all hours"
                        .to_owned(),
            });
        }
        let windows = entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                parse_window(entry).map_err(|why| HoursError {
                    index: i + 1,
                    entry: entry.clone(),
                    why,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Schedule {
            windows,
            written: entries.to_vec(),
        })
    }

    /// Whether lending is open at local civil time `at`.
    pub fn is_open(&self, at: DateTime) -> bool {
        let day = usize::from(at.weekday().to_monday_zero_offset().unsigned_abs());
        let minute = u16::try_from(i32::from(at.hour()) * 60 + i32::from(at.minute())).unwrap_or(0);
        self.windows.iter().any(|w| w.open_at(day, minute))
    }

    /// Whether lending is open at `now` in `tz`, and each instant it opens or
    /// closes within [`OUTLOOK_DAYS`] after it.
    ///
    /// # Behavior
    ///
    /// Openness follows local civil time. The candidates are every window
    /// boundary of every day in range, each at every instant the wall clock
    /// shows it (twice in a repeated hour, never in a skipped one), and the
    /// time zone's transitions (where the wall clock jumps over or back past
    /// a boundary). Between two consecutive candidates the wall clock runs
    /// without a jump and crosses no boundary, so the state is constant:
    /// only the candidates where it flips are kept.
    pub fn outlook(&self, tz: &TimeZone, now: Timestamp) -> Outlook {
        let end = now
            .checked_add(SignedDuration::from_hours(OUTLOOK_DAYS * 24))
            .unwrap_or(Timestamp::MAX);
        let mut candidates: Vec<Timestamp> = Vec::new();
        let today = tz.to_datetime(now).date();
        for offset in -1..=OUTLOOK_DAYS + 1 {
            let Ok(date) = today.checked_add(jiff::Span::new().days(offset)) else {
                continue;
            };
            for w in &self.windows {
                for minute in [w.start, w.end] {
                    if let Some(dt) = civil(date, minute) {
                        let ambiguous = tz.to_ambiguous_timestamp(dt);
                        candidates.extend(ambiguous.earlier().ok());
                        candidates.extend(ambiguous.later().ok());
                    }
                }
            }
        }
        candidates.extend(
            tz.following(now)
                .map(|t| t.timestamp())
                .take_while(|t| *t <= end),
        );
        candidates.retain(|t| *t > now && *t <= end);
        candidates.sort_unstable();
        candidates.dedup();
        let open = self.is_open(tz.to_datetime(now));
        let mut state = open;
        let mut changes = Vec::new();
        for at in candidates {
            let here = self.is_open(tz.to_datetime(at));
            if here != state {
                changes.push((at, here));
                state = here;
            }
        }
        Outlook { open, changes }
    }

    /// The schedule as written, for logs and status.
    pub fn describe(&self) -> String {
        self.written.join("; ")
    }
}

/// `minute` of `date` as a civil time; 1440 is the next day's midnight.
fn civil(date: Date, minute: u16) -> Option<DateTime> {
    let (date, minute) = if minute >= DAY_MINUTES {
        (date.tomorrow().ok()?, minute - DAY_MINUTES)
    } else {
        (date, minute)
    };
    let hour = i8::try_from(minute / 60).ok()?;
    let min = i8::try_from(minute % 60).ok()?;
    Some(date.to_datetime(Time::new(hour, min, 0, 0).ok()?))
}

impl Outlook {
    /// The outlook on the engine's timeline: `now` (the instant it was
    /// taken) is `at`, and each change lands `change - now` later, labelled
    /// with its local time in `tz` (`Mon 2026-12-07 19:00 CET`).
    pub fn project(
        &self,
        schedule: &str,
        tz: &TimeZone,
        now: Timestamp,
        at: Moment,
    ) -> LendingHours {
        let changes = self
            .changes
            .iter()
            .map(|(when, opens)| {
                let ahead = when.duration_since(now).unsigned_abs();
                HoursChange {
                    at: at.after(ahead),
                    opens: *opens,
                    local: local_label(*when, tz),
                }
            })
            .collect();
        LendingHours {
            schedule: schedule.to_owned(),
            open: self.open,
            as_of: at,
            changes,
        }
    }
}

/// An instant as the owner reads it: `Mon 2026-12-07 19:00 CET`.
pub fn local_label(at: Timestamp, tz: &TimeZone) -> String {
    at.to_zoned_datetime(tz.clone())
        .strftime("%a %Y-%m-%d %H:%M %Z")
        .to_string()
}

/// The time zone's name for the owner: its IANA name where known, else how
/// it was given (a POSIX `TZ` string) or its current abbreviation.
pub fn zone_name(tz: &TimeZone, now: Timestamp) -> String {
    match tz.iana_name() {
        Some(name) => name.to_owned(),
        None => now.to_zoned_datetime(tz.clone()).strftime("%Z").to_string(),
    }
}

fn parse_window(entry: &str) -> Result<Window, String> {
    let mut parts = entry.split_whitespace();
    let days_text = parts.next().ok_or_else(|| {
        "empty; write days and optionally times, e.g. \"Mon-Fri 19:00-08:00\" or \"Sat-Sun\""
            .to_owned()
    })?;
    let days = parse_days(days_text)?;
    let (start, end) = match parts.next() {
        None => (0, DAY_MINUTES),
        Some(times) => parse_times(times)?,
    };
    if let Some(extra) = parts.next() {
        return Err(format!(
            "unexpected {extra:?} after the times; one window per entry, e.g. \"Mon-Fri 19:00-08:00\""
        ));
    }
    Ok(Window { days, start, end })
}

fn parse_day(text: &str) -> Result<usize, String> {
    let lower = text.to_ascii_lowercase();
    DAY_NAMES
        .iter()
        .position(|(short, long)| lower == *short || lower == *long)
        .ok_or_else(|| {
            format!("unknown day {text:?}; use Mon, Tue, Wed, Thu, Fri, Sat, Sun (or full names), daily, weekdays or weekends")
        })
}

fn parse_days(text: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    match text.to_ascii_lowercase().as_str() {
        "daily" => return Ok([true; 7]),
        "weekdays" => return Ok([true, true, true, true, true, false, false]),
        "weekends" => return Ok([false, false, false, false, false, true, true]),
        _ => {}
    }
    for item in text.split(',') {
        match item.split_once('-') {
            Some((from, to)) => {
                let (from, to) = (parse_day(from)?, parse_day(to)?);
                let mut d = from;
                loop {
                    days[d] = true;
                    if d == to {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days[parse_day(item)?] = true,
        }
    }
    Ok(days)
}

fn parse_times(text: &str) -> Result<(u16, u16), String> {
    let (from, to) = text.split_once('-').ok_or_else(|| {
        format!("times {text:?} are not a range; write HH:MM-HH:MM, e.g. 19:00-08:00")
    })?;
    let (start, end) = (parse_time(from, false)?, parse_time(to, true)?);
    if start == end {
        return Err(format!(
            "{text:?} opens and closes at the same time; for the whole day leave the times out (\"Sat-Sun\")"
        ));
    }
    Ok((start, end))
}

fn parse_time(text: &str, is_end: bool) -> Result<u16, String> {
    let bad =
        || format!("{text:?} is not a time; write HH:MM on a 24-hour clock, e.g. 08:00 or 19:30");
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (u16, u16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if is_end && h == 24 && m == 0 {
        return Ok(DAY_MINUTES);
    }
    if h > 23 || m > 59 {
        return Err(if h == 24 {
            format!("{text:?}: 24:00 may only end a window")
        } else {
            bad()
        });
    }
    Ok(h * 60 + m)
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The weekday of `date`, Monday 0 (for tests and callers that count days).
pub fn weekday_index(day: Weekday) -> usize {
    usize::from(day.to_monday_zero_offset().unsigned_abs())
}

#[cfg(test)]
#[path = "hours_tests.rs"]
mod tests;
