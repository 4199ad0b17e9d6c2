//! `vacancyd usage --since`: a span back from now, or a UTC date.

use std::str::FromStr;

/// Where a report starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// This many milliseconds before now (`12h`, `7d`, `2w`).
    Ago(i64),
    /// This UTC date's midnight, Unix milliseconds (`2026-11-01`).
    At(i64),
}

impl Since {
    /// The start in Unix milliseconds, with `now_unix_ms` the present.
    pub fn start_unix_ms(self, now_unix_ms: i64) -> i64 {
        match self {
            Since::Ago(ms) => now_unix_ms.saturating_sub(ms),
            Since::At(ms) => ms,
        }
    }
}

impl FromStr for Since {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || format!("{s:?} is not Nh, Nd, Nw (hours, days, weeks ago) or a date YYYY-MM-DD");
        let s = s.trim();
        if let Some(unit) = s.chars().last().filter(|c| matches!(c, 'h' | 'd' | 'w')) {
            let n: i64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
            if n < 0 {
                return Err(bad());
            }
            let hour = 3_600_000_i64;
            let per = match unit {
                'h' => hour,
                'd' => 24 * hour,
                _ => 7 * 24 * hour,
            };
            return n.checked_mul(per).map(Since::Ago).ok_or_else(bad);
        }
        if s.len() != 10 {
            return Err(bad());
        }
        let date: jiff::civil::Date = s.parse().map_err(|_| bad())?;
        date.to_zoned_datetime(jiff::tz::TimeZone::UTC)
            .map(|z| Since::At(z.timestamp().as_millisecond()))
            .map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // issue 34 item 4
    #[test]
    fn since_accepts_hours_days_weeks_and_a_utc_date() {
        let now = 1_796_083_200_000;
        assert_eq!(
            "12h".parse::<Since>().map(|s| s.start_unix_ms(now)),
            Ok(now - 12 * 3_600_000)
        );
        assert_eq!(
            "7d".parse::<Since>().map(|s| s.start_unix_ms(now)),
            Ok(now - 7 * 86_400_000)
        );
        assert_eq!(
            "2w".parse::<Since>().map(|s| s.start_unix_ms(now)),
            Ok(now - 14 * 86_400_000)
        );
        assert_eq!(
            "2026-12-01".parse::<Since>(),
            Ok(Since::At(1_796_083_200_000))
        );
    }

    // issue 34 item 4
    #[test]
    fn since_refuses_other_values_saying_what_it_accepts() {
        for bad in [
            "",
            "7",
            "d",
            "-1d",
            "7m",
            "1.5d",
            "2026-13-01",
            "2026-1-1",
            "yesterday",
            "99999999999999999d",
        ] {
            let e = bad.parse::<Since>().err();
            assert!(
                e.as_deref().is_some_and(|e| e.contains("YYYY-MM-DD")),
                "{bad:?}: {e:?}"
            );
        }
    }
}
