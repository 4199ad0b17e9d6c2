#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn schedule(entries: &[&str]) -> Schedule {
    Schedule::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap()
}

fn err(entries: &[&str]) -> HoursError {
    Schedule::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap_err()
}

fn at(s: &str) -> DateTime {
    s.parse().unwrap()
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Central European time with its DST rules, from a POSIX TZ string, so the
/// tests need no tz database on the machine.
fn berlin() -> TimeZone {
    TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap()
}

#[test]
fn windows_run_past_midnight_on_the_days_they_open() {
    let s = schedule(&["Mon-Fri 19:00-08:00", "Sat-Sun"]);
    // 2026-12-07 is a Monday.
    assert!(
        !s.is_open(at("2026-12-07T07:59")),
        "Monday morning: Sunday's all-day window ended at midnight"
    );
    assert!(!s.is_open(at("2026-12-07T18:59")));
    assert!(s.is_open(at("2026-12-07T19:00")));
    assert!(
        s.is_open(at("2026-12-08T07:59")),
        "Monday's window runs into Tuesday"
    );
    assert!(!s.is_open(at("2026-12-08T08:00")));
    assert!(
        s.is_open(at("2026-12-12T07:00")),
        "Friday's window runs into Saturday"
    );
    assert!(s.is_open(at("2026-12-12T12:00")), "Saturday all day");
    assert!(s.is_open(at("2026-12-13T23:59")), "Sunday all day");
}

#[test]
fn day_lists_ranges_names_and_24_00() {
    let s = schedule(&[
        "sat,Sunday 00:00-24:00",
        "Fri-Mon 22:00-23:00",
        "weekdays 12:00-13:00",
    ]);
    assert!(s.is_open(at("2026-12-12T00:00")));
    assert!(s.is_open(at("2026-12-13T23:59")));
    assert!(
        s.is_open(at("2026-12-07T22:30")),
        "Fri-Mon wraps through the weekend to Monday"
    );
    assert!(!s.is_open(at("2026-12-08T22:30")), "not Tuesday");
    assert!(s.is_open(at("2026-12-09T12:30")));
    assert!(schedule(&["daily"]).is_open(at("2026-12-09T03:00")));
    assert!(schedule(&["weekends"]).is_open(at("2026-12-13T03:00")));
    assert!(!schedule(&["weekends"]).is_open(at("2026-12-14T03:00")));
}

#[test]
fn bad_entries_say_what_is_accepted() {
    let e = err(&["Mon-Fri 19:00-08:00", "Mon-Fry 19:00-08:00"]);
    assert_eq!(e.index, 2);
    assert!(e.why.contains("unknown day \"Fry\""), "{e}");
    assert!(err(&["Mon 7pm-8pm"]).why.contains("HH:MM"));
    assert!(err(&["Mon 19:00"]).why.contains("not a range"));
    assert!(err(&["Mon 25:00-26:00"]).why.contains("not a time"));
    assert!(
        err(&["Mon 24:00-08:00"])
            .why
            .contains("24:00 may only end a window")
    );
    assert!(err(&["Mon 08:00-08:00"]).why.contains("same time"));
    assert!(err(&["Mon 00:00-24:00 extra"]).why.contains("unexpected"));
    assert!(err(&[""]).why.contains("empty"));
    assert!(err(&[]).why.contains("remove the key"));
}

#[test]
fn the_outlook_lists_each_opening_and_closing() {
    let s = schedule(&["Mon-Fri 19:00-08:00"]);
    let utc = TimeZone::UTC;
    // Monday 2026-12-07 12:00 UTC: closed; opens 19:00, closes Tuesday 08:00 ...
    let o = s.outlook(&utc, ts("2026-12-07T12:00:00Z"));
    assert!(!o.open);
    assert_eq!(
        o.changes[..3],
        [
            (ts("2026-12-07T19:00:00Z"), true),
            (ts("2026-12-08T08:00:00Z"), false),
            (ts("2026-12-08T19:00:00Z"), true),
        ]
    );
    // Friday's window closes Saturday 08:00 and the next opens Monday 19:00.
    let o = s.outlook(&utc, ts("2026-12-11T20:00:00Z"));
    assert!(o.open);
    assert_eq!(
        o.changes[..2],
        [
            (ts("2026-12-12T08:00:00Z"), false),
            (ts("2026-12-14T19:00:00Z"), true)
        ]
    );
    // Always open: no change at all.
    assert!(
        schedule(&["daily"])
            .outlook(&utc, ts("2026-12-11T20:00:00Z"))
            .changes
            .is_empty()
    );
}

#[test]
fn a_weekend_across_the_spring_change_opens_at_19_00_on_the_wall_clock() {
    // DST (issue 35 item 1): Saturday 08:00 CET to Monday 19:00 CEST is one
    // hour short of the usual 59 h, and the opening is at 19:00 local time.
    let s = schedule(&["Mon-Fri 19:00-08:00"]);
    let o = s.outlook(&berlin(), ts("2026-03-27T19:30:00Z")); // Friday 20:30 CET
    assert!(o.open);
    let (closes, opens) = (o.changes[0], o.changes[1]);
    assert_eq!(
        closes,
        (ts("2026-03-28T07:00:00Z"), false),
        "Saturday 08:00 CET"
    );
    assert_eq!(
        opens,
        (ts("2026-03-30T17:00:00Z"), true),
        "Monday 19:00 CEST"
    );
    assert_eq!(
        opens.0.duration_since(closes.0),
        SignedDuration::from_hours(58)
    );
    assert_eq!(local_label(opens.0, &berlin()), "Mon 2026-03-30 19:00 CEST");
    // And across the autumn change, one hour longer.
    let o = s.outlook(&berlin(), ts("2026-10-23T18:30:00Z")); // Friday 20:30 CEST
    let (closes, opens) = (o.changes[0], o.changes[1]);
    assert_eq!(
        closes,
        (ts("2026-10-24T06:00:00Z"), false),
        "Saturday 08:00 CEST"
    );
    assert_eq!(
        opens,
        (ts("2026-10-26T18:00:00Z"), true),
        "Monday 19:00 CET"
    );
    assert_eq!(
        opens.0.duration_since(closes.0),
        SignedDuration::from_hours(60)
    );
}

#[test]
fn a_window_opening_in_the_skipped_hour_opens_when_the_clock_jumps_past_it() {
    // 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 never
    // shows on the wall clock, so the window opens at the jump.
    let s = schedule(&["daily 02:30-04:00"]);
    let o = s.outlook(&berlin(), ts("2026-03-28T23:00:00Z")); // 00:00 CET
    assert!(!o.open);
    assert_eq!(
        o.changes[..2],
        [
            (ts("2026-03-29T01:00:00Z"), true),
            (ts("2026-03-29T02:00:00Z"), false)
        ]
    );
}

#[test]
fn a_window_ending_in_the_repeated_hour_follows_the_wall_clock_both_times() {
    // 2026-10-25: 03:00 CEST goes back to 02:00 CET (01:00 UTC); the wall
    // clock shows 02:00-02:30 twice, and the window is open both times.
    let s = schedule(&["daily 01:00-02:30"]);
    let o = s.outlook(&berlin(), ts("2026-10-24T22:00:00Z")); // 00:00 CEST
    assert!(!o.open);
    assert_eq!(
        o.changes[..4],
        [
            (ts("2026-10-24T23:00:00Z"), true),  // 01:00 CEST
            (ts("2026-10-25T00:30:00Z"), false), // 02:30 CEST
            (ts("2026-10-25T01:00:00Z"), true),  // 02:00 CET, again
            (ts("2026-10-25T01:30:00Z"), false), // 02:30 CET
        ]
    );
}

#[test]
fn the_projection_puts_changes_on_the_engines_timeline() {
    let s = schedule(&["Mon-Fri 19:00-08:00"]);
    let now = ts("2026-12-07T18:59:30Z");
    let hours = s.outlook(&TimeZone::UTC, now).project(
        "Mon-Fri 19:00-08:00 (UTC)",
        &TimeZone::UTC,
        now,
        Moment::from_secs(100),
    );
    assert!(!hours.open_at(Moment::from_secs(100)));
    assert!(!hours.open_at(Moment::from_secs(129)));
    assert!(hours.open_at(Moment::from_secs(130)), "19:00 is 30 s later");
    let next = hours.next_opening(Moment::from_secs(100)).unwrap();
    assert_eq!(next.at, Moment::from_secs(130));
    assert_eq!(next.local, "Mon 2026-12-07 19:00 UTC");
    assert_eq!(
        hours.next_change(Moment::from_secs(130)).map(|c| c.opens),
        Some(false)
    );
}

proptest::proptest! {
    /// Between two changes of the outlook the schedule never flips: every
    /// minute boundary in the week ahead agrees with the outlook, in a zone
    /// with DST, from any start.
    #[test]
    fn the_outlook_agrees_with_the_wall_clock_minute_by_minute(
        start in 1_767_225_600i64..1_830_297_600, // 2026..2028
        from_h in 0u16..24, to_h in 0u16..25, days in 1u8..128,
    ) {
        let names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
        let list: Vec<&str> = (0..7).filter(|d| days & (1 << d) != 0).map(|d| names[d]).collect();
        let to_h = if to_h == from_h { (to_h + 1) % 25 } else { to_h };
        let entry = format!("{} {:02}:00-{:02}:00", list.join(","), from_h, to_h);
        let Ok(s) = Schedule::parse(std::slice::from_ref(&entry)) else { return Ok(()); };
        let tz = berlin();
        let now = Timestamp::from_second(start).unwrap();
        let o = s.outlook(&tz, now);
        let mut expect = o.open;
        let mut changes = o.changes.iter().peekable();
        // Minute by minute over four days.
        for m in 1..(4 * 24 * 60) {
            let t = now.checked_add(SignedDuration::from_mins(m)).unwrap();
            while let Some((at, opens)) = changes.peek() {
                if *at <= t { expect = *opens; changes.next(); } else { break; }
            }
            proptest::prop_assert_eq!(s.is_open(tz.to_datetime(t)), expect, "{} at {}", entry, t);
        }
    }
}
