//! The power loop (issue 35 item 2): with `[owner] on_battery = "pause"`,
//! what the machine runs on, read every [`POWER_EVERY`] and given to the
//! engine; leaving mains wakes the reclaim loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::engine::PowerSource;
use crate::sample::PowerSupply;
use crate::shell::state::lender::Lender;
use crate::shell::state::shutdown::stopped;

/// How often the power supply is read.
pub const POWER_EVERY: Duration = Duration::from_secs(1);

/// How long one read may take before the supply counts as unknown.
const READ_BOUND: Duration = Duration::from_secs(5);

/// Read `supply` once, on a blocking thread, within a bound.
pub async fn read_once(supply: &Arc<dyn PowerSupply>) -> PowerSource {
    let reader = Arc::clone(supply);
    match tokio::time::timeout(
        READ_BOUND,
        tokio::task::spawn_blocking(move || reader.read()),
    )
    .await
    {
        Ok(Ok(source)) => source,
        Ok(Err(e)) => PowerSource::Unknown(format!("the read failed: {e}")),
        Err(_) => PowerSource::Unknown(format!("no answer within {} s", READ_BOUND.as_secs())),
    }
}

/// Read the power supply every `every` and give the engine each reading
/// (each one is a fresh sample: back on mains, lending resumes with it);
/// log each change.
pub async fn power_loop(
    lender: Arc<Lender>,
    supply: Arc<dyn PowerSupply>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<PowerSource> = None;
    loop {
        let source = read_once(&supply).await;
        if last.as_ref() != Some(&source) {
            match &source {
                PowerSource::Unknown(why) => {
                    warn!(supply = %supply.name(), reason = %why, "power supply unknown: borrowed work is refused and reclaimed as on battery");
                }
                PowerSource::Battery => {
                    info!(supply = %supply.name(), "on battery: borrowed work is refused and reclaimed (on_battery = \"pause\")");
                }
                PowerSource::Mains => info!(supply = %supply.name(), "on mains power"),
            }
            last = Some(source.clone());
        }
        lender.set_power(Some(source));
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}
