//! `vacancyd calibrate-pressure`: measure a GPU's normal owner load and store it as its baseline.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::ArgGroup;
use thiserror::Error;
use vacancy::ResourceKind;
use vacancy::config::{Config, LOOPBACK, LoadedConfig, SamplerKind, same_server_key};
use vacancy::gpu_pressure::{
    Attendance, CalibrationError, CalibrationFile, NvmlPressureReader, OwnerLoad, PressureError,
    PressureReader, calibrate, server_pids,
};
use vacancy::ledger::{LocationInput, resolve_location};
use vacancy::registry::AdapterRegistry;

/// `vacancyd calibrate-pressure`'s arguments.
#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("attendance").required(true).args(["attended", "unattended"])))]
pub struct Args {
    /// The GPU resource to calibrate (a `[[resource]]` with kind = "gpu", sampler = "nvml").
    #[arg(long)]
    pub resource: String,
    /// Calibrate the baseline for while the owner is present: use the machine
    /// as usual while it samples.
    #[arg(long)]
    pub attended: bool,
    /// Calibrate the baseline for while the owner is away: leave it as it is
    /// when nobody uses it.
    #[arg(long)]
    pub unattended: bool,
    /// How long to sample, in seconds (one sample every owner.gpu_pressure.poll_ms).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// The configuration file; without it, the embedded default.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The admission state directory to write the calibration to; without it,
    /// the directory the daemon would use with this configuration.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl Args {
    fn attendance(&self) -> Attendance {
        if self.attended {
            Attendance::Attended
        } else {
            Attendance::Unattended
        }
    }
}

/// Why a calibration did not complete.
#[derive(Debug, Error)]
pub enum CalibrateFailure {
    /// The configuration cannot be used.
    #[error("{0}")]
    Config(String),
    /// The GPU cannot be read at all.
    #[error(transparent)]
    Reader(#[from] PressureError),
    /// Every read failed.
    #[error("no good sample of {resource} in {attempts} attempts; nothing was saved")]
    NoSamples {
        /// The GPU resource.
        resource: String,
        /// How many reads were tried.
        attempts: u32,
    },
    /// The calibration file cannot be read or written.
    #[error(transparent)]
    File(#[from] CalibrationError),
    /// The state directory cannot be found.
    #[error("cannot find the admission state directory: {0}")]
    StateDir(String),
    /// Printing the progress failed.
    #[error("cannot print: {0}")]
    Output(#[from] std::io::Error),
}

/// Run the command with `registry`'s adapter kinds (the configuration is
/// loaded as `run` loads it): exit 0 when the baseline was saved.
pub fn run(args: &Args, registry: &AdapterRegistry) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vacancyd calibrate-pressure: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_async(args, registry)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vacancyd calibrate-pressure: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run_async(args: &Args, registry: &AdapterRegistry) -> Result<(), CalibrateFailure> {
    // As `run` and `check-config` load it: the adapter kinds and their own
    // settings are checked against the registry (issue 30).
    let loaded = crate::check_config::load(args.config.as_deref(), registry)
        .map_err(|e| CalibrateFailure::Config(e.to_string()))?;
    let device = gpu_device(&loaded, &args.resource)?;
    let reader = NvmlPressureReader::new(&args.resource, &device)?;
    let dir = match &args.state_dir {
        Some(dir) => dir.clone(),
        None => {
            let input = LocationInput::from_env(
                args.config.as_deref(),
                &loaded.config.server.admission_state_dir,
            );
            resolve_location(&input)
                .map_err(|e| CalibrateFailure::StateDir(e.to_string()))?
                .path
        }
    };
    let plan = Plan {
        attendance: args.attendance(),
        every: Duration::from_millis(loaded.config.owner.gpu_pressure.poll_ms.max(1)),
        samples: samples_in(args.seconds, loaded.config.owner.gpu_pressure.poll_ms),
        exclude: upstream_addrs(&loaded.config),
        state_dir: dir,
    };
    let mut out = std::io::stdout();
    calibrate_into(&reader, &plan, &mut out).await.map(|_| ())
}

/// The `device` of the GPU resource `name`, which must be sampled through NVML.
fn gpu_device(loaded: &LoadedConfig, name: &str) -> Result<String, CalibrateFailure> {
    let r = loaded.config.resource(name).ok_or_else(|| {
        let gpus: Vec<&str> = loaded
            .config
            .resources
            .iter()
            .filter(|r| r.kind == ResourceKind::Gpu)
            .map(|r| r.name.as_str())
            .collect();
        CalibrateFailure::Config(format!(
            "no resource {name:?} in the configuration (GPUs: {})",
            if gpus.is_empty() {
                "none".to_owned()
            } else {
                gpus.join(", ")
            }
        ))
    })?;
    if r.kind != ResourceKind::Gpu || r.sampler != SamplerKind::Nvml {
        return Err(CalibrateFailure::Config(format!(
            "resource {name:?} is not an NVIDIA GPU (kind = \"gpu\", sampler = \"nvml\"); only those have attributed pressure"
        )));
    }
    Ok(r.device.clone())
}

/// How many samples `seconds` hold at one per `poll_ms` (at least one).
fn samples_in(seconds: u64, poll_ms: u64) -> u32 {
    let n = seconds.saturating_mul(1000) / poll_ms.max(1);
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// The addresses of every upstream's server: their processes are not the owner's.
pub(crate) fn upstream_addrs(config: &Config) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    for u in &config.upstreams {
        let Some((host, port)) = same_server_key(&u.target) else {
            continue;
        };
        if host == LOOPBACK {
            addrs.push(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            addrs.push(SocketAddr::new(ip, port));
        } else if let Ok(resolved) = (host.as_str(), port).to_socket_addrs() {
            addrs.extend(resolved);
        }
    }
    addrs
}

/// What to sample and where to save it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Which baseline this is.
    pub attendance: Attendance,
    /// Time between samples.
    pub every: Duration,
    /// How many samples to take.
    pub samples: u32,
    /// The upstream servers' addresses, whose processes are excluded.
    pub exclude: Vec<SocketAddr>,
    /// The admission state directory holding the calibration file.
    pub state_dir: PathBuf,
}

/// Sample `reader` as `plan` says, print what it saw, and save the baseline.
///
/// # Errors
///
/// No good sample at all, or the calibration file cannot be read or written.
pub async fn calibrate_into(
    reader: &dyn PressureReader,
    plan: &Plan,
    out: &mut dyn Write,
) -> Result<OwnerLoad, CalibrateFailure> {
    let gpu = reader.name().to_owned();
    // Read the old file first: a garbage file fails before a minute of sampling.
    let path = CalibrationFile::path_in(&plan.state_dir);
    let mut file = CalibrationFile::load(&path)?;
    writeln!(
        out,
        "calibrating the {} baseline of {gpu}: {} samples, one every {} ms",
        plan.attendance,
        plan.samples,
        plan.every.as_millis()
    )?;
    let mut good: Vec<OwnerLoad> = Vec::new();
    let mut failures = 0u32;
    for i in 0..plan.samples {
        if i > 0 {
            tokio::time::sleep(plan.every).await;
        }
        // Looked up each time: a server may restart during calibration.
        let pids = server_pids(&plan.exclude);
        match reader.read(&pids).await {
            Ok(load) => {
                writeln!(
                    out,
                    "  {:>4}: {load} (excluding {} upstream process{})",
                    i + 1,
                    pids.len(),
                    if pids.len() == 1 { "" } else { "es" }
                )?;
                good.push(load);
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(gpu = %gpu, error = %e, "pressure sample failed during calibration");
                writeln!(out, "  {:>4}: failed: {e}", i + 1)?;
            }
        }
    }
    if good.is_empty() {
        return Err(CalibrateFailure::NoSamples {
            resource: gpu,
            attempts: plan.samples,
        });
    }
    let baseline = calibrate(&good);
    let util_max = good.iter().map(|l| l.util_pct).max().unwrap_or(0);
    let mem_min = good.iter().map(|l| l.memory_mib).min().unwrap_or(0);
    writeln!(
        out,
        "{} good sample{} ({failures} failed): utilization up to {util_max}%, memory {mem_min} to {} MiB",
        good.len(),
        if good.len() == 1 { "" } else { "s" },
        baseline.memory_mib
    )?;
    file.set(&gpu, plan.attendance, baseline);
    file.save(&path)?;
    writeln!(
        out,
        "saved the {} baseline of {gpu}: {baseline} (95th percentile of utilization, most memory) in {}",
        plan.attendance,
        path.display()
    )?;
    if failures > 0 {
        writeln!(
            out,
            "warning: {failures} of {} samples failed; calibrate again if that was not a moment's hiccup",
            plan.samples
        )?;
    }
    Ok(baseline)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use clap::Parser;
    use vacancy::gpu_pressure::ScriptedReader;

    use std::path::Path;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("calibrate-pressure").chain(argv.iter().copied()))
            .map(|c| c.args)
    }

    fn load(util_pct: u8, memory_mib: u64) -> OwnerLoad {
        OwnerLoad {
            util_pct,
            memory_mib,
        }
    }

    #[test]
    fn arguments_parse() {
        let a = parse(&["--resource", "gpu0", "--attended"]).unwrap();
        assert_eq!(
            (a.resource.as_str(), a.attendance(), a.seconds, a.config),
            ("gpu0", Attendance::Attended, 60, None)
        );
        let a = parse(&[
            "--resource",
            "gpu1",
            "--unattended",
            "--seconds",
            "5",
            "--config",
            "/etc/v.toml",
        ])
        .unwrap();
        assert_eq!(a.attendance(), Attendance::Unattended);
        assert_eq!(a.seconds, 5);
        assert_eq!(a.config, Some(PathBuf::from("/etc/v.toml")));
        // Exactly one of --attended and --unattended; a resource; a sane duration.
        assert!(parse(&["--resource", "gpu0"]).is_err());
        assert!(parse(&["--resource", "gpu0", "--attended", "--unattended"]).is_err());
        assert!(parse(&["--attended"]).is_err());
        assert!(parse(&["--resource", "gpu0", "--attended", "--seconds", "0"]).is_err());
    }

    #[test]
    fn sample_count_and_upstream_addresses() {
        assert_eq!(samples_in(60, 2000), 30);
        assert_eq!(samples_in(1, 5000), 1);
        let loaded = Config::parse(
            "[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nsampler = \"nvml\"\n\
             [[upstream]]\nname = \"a\"\nlisten = \"127.0.0.1:9000\"\ntarget = \"http://localhost:11434\"\nresource = \"gpu0\"\n\
             [[upstream]]\nname = \"b\"\nlisten = \"127.0.0.1:9001\"\ntarget = \"http://192.0.2.4:8188/x\"\nresource = \"gpu0\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            upstream_addrs(&loaded.config),
            vec![
                "127.0.0.1:11434".parse::<SocketAddr>().unwrap(),
                "192.0.2.4:8188".parse().unwrap()
            ]
        );
        assert_eq!(gpu_device(&loaded, "gpu0").unwrap(), "0");
        let err = gpu_device(&loaded, "gpu9").unwrap_err().to_string();
        assert!(err.contains("GPUs: gpu0"), "{err}");
    }

    #[test]
    fn only_nvml_gpus_can_be_calibrated() {
        let loaded = Config::embedded_default().unwrap();
        let err = gpu_device(&loaded, "ram").unwrap_err().to_string();
        assert!(err.contains("not an NVIDIA GPU"), "{err}");
    }

    fn plan(dir: &Path, attendance: Attendance, samples: u32) -> Plan {
        Plan {
            attendance,
            every: Duration::from_millis(1),
            samples,
            exclude: Vec::new(),
            state_dir: dir.to_owned(),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn calibration_samples_the_reader_and_saves_the_baseline() {
        let dir = tempfile::tempdir().unwrap();
        let reader = ScriptedReader::new("gpu0");
        for (u, m) in [(10, 900), (12, 950), (90, 1000)] {
            reader.push_load(load(u, m));
        }
        reader.push_failure("driver busy");
        let mut out = Vec::new();
        let b = calibrate_into(
            &reader,
            &plan(dir.path(), Attendance::Attended, 4),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(b, load(90, 1000));
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("3 good samples (1 failed)"), "{text}");
        assert!(text.contains("driver busy"), "{text}");
        assert!(
            text.contains("saved the attended baseline of gpu0"),
            "{text}"
        );
        assert_eq!(reader.calls().len(), 4);

        // The unattended run keeps the attended baseline.
        reader.push_load(load(0, 200));
        let mut out = Vec::new();
        calibrate_into(
            &reader,
            &plan(dir.path(), Attendance::Unattended, 1),
            &mut out,
        )
        .await
        .unwrap();
        let file = CalibrationFile::load(&CalibrationFile::path_in(dir.path())).unwrap();
        let baseline = file.baseline("gpu0");
        assert_eq!(baseline.attended, Some(load(90, 1000)));
        assert_eq!(baseline.unattended, Some(load(0, 200)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn no_good_sample_saves_nothing_and_garbage_fails_first() {
        let dir = tempfile::tempdir().unwrap();
        let reader = ScriptedReader::new("gpu0");
        reader.push_failure("lost");
        let mut out = Vec::new();
        let err = calibrate_into(
            &reader,
            &plan(dir.path(), Attendance::Attended, 2),
            &mut out,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, CalibrateFailure::NoSamples { attempts: 2, .. }),
            "{err}"
        );
        assert!(!CalibrationFile::path_in(dir.path()).exists());

        let garbage = CalibrationFile::path_in(dir.path());
        std::fs::write(&garbage, "garbage").unwrap();
        std::fs::set_permissions(
            &garbage,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        reader.push_load(load(1, 1));
        let err = calibrate_into(
            &reader,
            &plan(dir.path(), Attendance::Attended, 1),
            &mut out,
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("pressure-calibration.json")
                && err.to_string().contains("not valid"),
            "{err}"
        );
        // It failed before sampling.
        assert_eq!(reader.pending(), 1);
    }
}
