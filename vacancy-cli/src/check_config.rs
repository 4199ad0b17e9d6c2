//! `vacancyd check-config`: validate a configuration and report every problem.

use std::path::Path;
use std::process::ExitCode;

use vacancy::config::{Config, ConfigErrors, LoadedConfig, ResourceConfig};
use vacancy::engine::{Engine, EngineSpec};
use vacancy::{MonotonicClock, ResourceKind};

/// Exit status for a configuration with errors.
const EXIT_INVALID: u8 = 1;

/// Validate `path` (or the embedded default), print every error or warning,
/// and with `sample` read each resource once.
pub fn run(path: Option<&Path>, sample: bool) -> ExitCode {
    let loaded = match load(path) {
        Ok(loaded) => loaded,
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!(
                "{} problem{} found; nothing was started.",
                errors.errors.len(),
                if errors.errors.len() == 1 { "" } else { "s" }
            );
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let origin = path.map_or_else(
        || vacancy::config::EMBEDDED_ORIGIN.to_owned(),
        |p| p.display().to_string(),
    );
    if let Err(e) = Engine::new(EngineSpec::from(&loaded.config)) {
        eprintln!("{origin}: {e}");
        return ExitCode::from(EXIT_INVALID);
    }
    for w in &loaded.warnings {
        println!("warning: {origin}: {w}");
    }
    if sample {
        for warning in sample_resources(&loaded.config) {
            println!("warning: {origin}: {warning}");
        }
    }
    let c = &loaded.config;
    println!(
        "ok: {origin}: {} resource{}, {} upstream{}",
        c.resources.len(),
        plural(c.resources.len()),
        c.upstreams.len(),
        plural(c.upstreams.len())
    );
    ExitCode::SUCCESS
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn load(path: Option<&Path>) -> Result<LoadedConfig, ConfigErrors> {
    match path {
        Some(p) => Config::load(p),
        None => Config::embedded_default(),
    }
}

/// Sample each resource once; a reserve above the total is a warning, as is a
/// resource that cannot be sampled here (the daemon would refuse its work with
/// `capacity_unknown`).
fn sample_resources(config: &Config) -> Vec<String> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return vec![format!("cannot start the sampling runtime: {e}")],
    };
    let clock = MonotonicClock::new();
    runtime.block_on(async {
        let mut warnings = Vec::new();
        for r in &config.resources {
            if let Some(w) = sample_one(r, clock).await {
                warnings.push(w);
            }
        }
        warnings
    })
}

async fn sample_one(r: &ResourceConfig, clock: MonotonicClock) -> Option<String> {
    let sampler = match vacancy::sample::from_config(r, clock) {
        Ok(s) => s,
        Err(e) => {
            return Some(format!(
                "resource {:?}: cannot sample it here ({e}); vacancyd would refuse its work with capacity_unknown",
                r.name
            ));
        }
    };
    match sampler.sample().await {
        Err(e) => Some(format!(
            "resource {:?}: sampling failed ({e}); vacancyd would refuse its work with capacity_unknown",
            r.name
        )),
        Ok(s) if r.kind != ResourceKind::Cpu && r.reserve_mib > s.total_mib => Some(format!(
            "resource {:?}: reserve_mib = {} is larger than its total of {} MiB, so nothing will ever be lent on it",
            r.name, r.reserve_mib, s.total_mib
        )),
        Ok(_) => None,
    }
}
