//! `vacancyd check-config`: validate a configuration and report every problem.

use std::path::Path;
use std::process::ExitCode;

use vacancy::config::{
    Config, ConfigErrors, EMBEDDED_DEFAULT, EMBEDDED_ORIGIN, LoadedConfig, ResourceConfig,
    SamplerKind,
};
use vacancy::engine::{Engine, EngineSpec};
use vacancy::gpu_pressure::CalibrationFile;
use vacancy::ledger::{LocationInput, recovery_path};
use vacancy::registry::AdapterRegistry;
use vacancy::{MonotonicClock, ResourceKind};

/// Exit status for a configuration with errors.
const EXIT_INVALID: u8 = 1;

/// Validate `path` (or the embedded default) against `registry`'s adapter
/// kinds, print every error or warning, and with `sample` read each resource once.
pub fn run(path: Option<&Path>, sample: bool, registry: &AdapterRegistry) -> ExitCode {
    let loaded = match load(path, registry).and_then(|loaded| {
        let origin = path.map_or_else(
            || vacancy::config::EMBEDDED_ORIGIN.to_owned(),
            |p| p.display().to_string(),
        );
        engine_accepts(loaded, &origin)
    }) {
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
    for w in &loaded.warnings {
        println!("warning: {origin}: {w}");
    }
    if sample {
        for warning in sample_resources(&loaded.config) {
            println!("warning: {origin}: {warning}");
        }
        for warning in calibration_warnings(&loaded.config, path) {
            println!("warning: {origin}: {warning}");
        }
    }
    let c = &loaded.config;
    // SCOPE-18: the line the daemon logs at startup.
    if let Some(line) = c.exemption_line() {
        println!("{line}");
    }
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

/// Validate a configuration text exactly as `check-config` does: the
/// parser's and validator's every problem, then what the engine refuses.
/// The console's settings editor saves nothing this rejects.
pub fn validate(
    text: &str,
    origin: &str,
    registry: &AdapterRegistry,
) -> Result<LoadedConfig, ConfigErrors> {
    engine_accepts(Config::parse_with(text, origin, registry)?, origin)
}

fn engine_accepts(loaded: LoadedConfig, origin: &str) -> Result<LoadedConfig, ConfigErrors> {
    match Engine::new(EngineSpec::from(&loaded.config)) {
        Ok(_) => Ok(loaded),
        Err(e) => Err(ConfigErrors {
            origin: origin.to_owned(),
            errors: vec![vacancy::config::ConfigError {
                path: String::new(),
                line: None,
                message: e.to_string(),
            }],
        }),
    }
}

/// Load `path` (or the embedded default), checking its adapter kinds against `registry`.
pub fn load(path: Option<&Path>, registry: &AdapterRegistry) -> Result<LoadedConfig, ConfigErrors> {
    match path {
        Some(p) => Config::load_with(p, registry),
        None => Config::parse_with(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN, registry),
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

/// With GPU pressure enabled, every NVIDIA GPU needs an attended and an
/// unattended baseline in the recovery directory the daemon would use: a
/// missing one makes its readings uncalibrated, which refuses and reclaims
/// its work (PRES-03). The daemon logs the same at startup.
fn calibration_warnings(config: &Config, path: Option<&Path>) -> Vec<String> {
    if !config.owner.gpu_pressure.enabled {
        return Vec::new();
    }
    let gpus: Vec<&ResourceConfig> = config
        .resources
        .iter()
        .filter(|r| r.kind == ResourceKind::Gpu && r.sampler == SamplerKind::Nvml)
        .collect();
    if gpus.is_empty() {
        return Vec::new();
    }
    // Only where the daemon would look: checking never creates the directory.
    let input = LocationInput::from_env(path, &config.server.admission_state_dir);
    let dir = match recovery_path(&input) {
        Ok(dir) => dir,
        Err(e) => {
            return vec![format!(
                "cannot find the recovery directory to read the GPU pressure calibration from ({e})"
            )];
        }
    };
    let file = CalibrationFile::path_in(&dir);
    let calibration = match CalibrationFile::load(&file) {
        Ok(c) => c,
        Err(e) => {
            return vec![format!(
                "{e}; vacancyd would read every GPU as uncalibrated, refusing and reclaiming its work"
            )];
        }
    };
    let mut warnings = Vec::new();
    for r in gpus {
        let baseline = calibration.baseline(&r.name);
        for (attendance, missing, when) in [
            ("attended", baseline.attended.is_none(), "present"),
            ("unattended", baseline.unattended.is_none(), "away"),
        ] {
            if missing {
                warnings.push(format!(
                    "resource {:?}: GPU pressure has no {attendance} baseline in {}; while the owner is {when}, vacancyd would refuse and reclaim its work until you run `vacancyd calibrate-pressure --resource {} --{attendance}`",
                    r.name,
                    file.display(),
                    r.name
                ));
            }
        }
    }
    warnings
}
