//! The lending-hours loop (issue 35 item 1): projects the owner's weekly
//! windows onto the engine's timeline, at start, every minute and right
//! after each opening or closing.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use tokio::sync::watch;
use tracing::info;

use crate::engine::LendingHours;
use crate::hours::{Schedule, zone_name};
use crate::shell::state::lender::Lender;
use crate::shell::state::shutdown::stopped;

/// How often the projection is made again when no change is due sooner:
/// a wall clock set by NTP or a changed time zone is followed within it.
pub const HOURS_EVERY: Duration = Duration::from_secs(60);

/// The lending hours now, in the machine's time zone (`TZ`, else
/// `/etc/localtime`), on `lender`'s timeline.
pub fn project(schedule: &Schedule, lender: &Lender) -> LendingHours {
    let tz = TimeZone::system();
    let (wall, now) = (Timestamp::now(), lender.clock().now());
    let described = format!(
        "{}; time zone {}",
        schedule.describe(),
        zone_name(&tz, wall)
    );
    schedule
        .outlook(&tz, wall)
        .project(&described, &tz, wall, now)
}

/// Give the engine the lending hours until `shutdown`: again every
/// [`HOURS_EVERY`] and just after each change, and log each opening and
/// closing with the next one.
pub async fn hours_loop(
    lender: Arc<Lender>,
    schedule: Schedule,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last_open: Option<bool> = None;
    loop {
        let hours = project(&schedule, &lender);
        let now = lender.clock().now();
        let open = hours.open_at(now);
        let next = hours.next_change(now).cloned();
        if last_open != Some(open) {
            let next_text = next
                .as_ref()
                .map(|c| c.local.clone())
                .unwrap_or_else(|| "not within a week".to_owned());
            info!(schedule = %hours.schedule, open, next_change = %next_text, "lending hours {}", if open { "open" } else { "closed" });
            last_open = Some(open);
        }
        lender.set_lending_hours(Some(hours));
        let mut sleep = HOURS_EVERY;
        if let Some(c) = next {
            // Just after the change, so the projection shows the next one.
            sleep = sleep.min(c.at.since(now) + Duration::from_millis(10));
        }
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}
