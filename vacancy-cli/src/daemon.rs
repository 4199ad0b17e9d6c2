//! `vacancyd run`: assemble the engine, samplers, adapters and listeners from
//! a configuration, serve until SIGTERM/SIGINT, then shut down gracefully.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{error, info, warn};
use vacancy::config::{Config, ConfigErrors, LoadedConfig, SamplerKind, UpstreamConfig};
use vacancy::engine::{Engine, EngineSpec, SpecError};
use vacancy::gpu_pressure::{
    CalibrationFile, NvmlPressureReader, PressureParams, PressureReader, PressureTracker,
    UnavailableReader,
};
use vacancy::ledger::{Ledger, LedgerError, LocationInput, resolve_location};
use vacancy::registry::{AdapterContext, AdapterRegistry, BuildError};
use vacancy::shell::loops::observation::{self, HealthCell};
use vacancy::shell::loops::pressure_watch::PressureGpu;
use vacancy::shell::loops::reclaim::ReclaimTimes;
use vacancy::shell::loops::{presence_watch, sampling};
use vacancy::shell::proxy::conn::{self, ConnLimits};
use vacancy::shell::state::post_job::PostJobSampler;
use vacancy::shell::{Lender, Listening, Target, UpstreamRoute};
use vacancy::traits::Adapter;
use vacancy::{MonotonicClock, ResourceKind};

use crate::control::{ControlState, UpstreamInfo};

/// How long open exchanges may finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Descriptors kept for the ledger, samplers and observation; the control
/// plane's share and the borrowers' come from the rest ([`conn::budgets`]),
/// after each upstream's idle read-pool connections ([`descriptor_reserve`]).
const DESCRIPTOR_RESERVE: u64 = 64;
/// How often upstreams are observed (fresh enough for RES-02's 4 s).
const OBSERVE_EVERY: Duration = Duration::from_secs(2);
/// Where login seats are listed on a systemd machine.
const SEATS_DIR: &str = "/run/systemd/seats";

/// A daemon that could not start, and why.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    /// The engine refused the configuration's resources and upstreams.
    #[error(transparent)]
    Engine(#[from] SpecError),
    /// The recovery directory cannot be found or opened (REC-10..22, REC-25).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// An upstream's adapter kind did not build its adapter.
    #[error(transparent)]
    Adapter(#[from] BuildError),
    /// Something else configured cannot be set up. `message` is what the
    /// operator reads (it already says the source's words); `source` is the
    /// error behind it, for a program that asks what it was.
    #[error("{message}")]
    Setup {
        /// What could not be set up, and why.
        message: String,
        /// The error that stopped it, where there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// Load, assemble and serve with `registry`'s adapter kinds; returns when shut down.
pub async fn run(path: Option<&Path>, registry: Arc<AdapterRegistry>) -> Result<(), StartError> {
    run_until(path, registry, || {}, wait_for_signal()).await
}

/// As [`run`]: `ready` is called once every listener serves, and the
/// daemon shuts down gracefully when `stop` completes (a signal, or the
/// Windows service control manager's stop).
pub(crate) async fn run_until(
    path: Option<&Path>,
    registry: Arc<AdapterRegistry>,
    ready: impl FnOnce(),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let loaded = crate::check_config::load(path, &registry)?;
    let origin = path.map_or_else(
        || vacancy::config::EMBEDDED_ORIGIN.to_owned(),
        |p| p.display().to_string(),
    );
    let (shutdown_tx, shutdown) = watch::channel(false);
    let daemon = start(loaded, path, &origin, shutdown, registry).await?;
    ready();
    stop.await;
    info!("shutting down: no new connections; open exchanges may finish for up to 30 s");
    let _ = shutdown_tx.send(true);
    daemon.join().await;
    info!("stopped");
    Ok(())
}

/// The running daemon's tasks.
pub struct Daemon {
    tasks: JoinSet<()>,
}

impl Daemon {
    async fn join(mut self) {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(5), all)
            .await
            .is_err()
        {
            warn!("tasks still running after the shutdown grace period; exiting anyway");
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(windows)]
    {
        // Ctrl-C or Ctrl-Break in the console, the console closed, the
        // system shutting down: each stops vacancyd gracefully.
        use tokio::signal::windows::{ctrl_break, ctrl_close, ctrl_shutdown};
        match (ctrl_break(), ctrl_close(), ctrl_shutdown()) {
            (Ok(mut brk), Ok(mut close), Ok(mut down)) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = brk.recv() => {}
                    _ = close.recv() => {}
                    _ = down.recv() => {}
                }
            }
            _ => {
                warn!(
                    "cannot listen for console close and shutdown events; stopping on Ctrl-C only"
                );
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A setup error with no error behind it.
fn setup(message: impl Into<String>) -> StartError {
    StartError::Setup {
        message: message.into(),
        source: None,
    }
}

/// A setup error saying `message`, caused by `source`.
fn setup_because(
    message: impl Into<String>,
    source: impl std::error::Error + Send + Sync + 'static,
) -> StartError {
    StartError::Setup {
        message: message.into(),
        source: Some(Box::new(source)),
    }
}

fn read_credential(
    u: &UpstreamConfig,
) -> Result<Option<(http::HeaderName, http::HeaderValue)>, StartError> {
    let Some(c) = &u.credential else {
        return Ok(None);
    };
    let name = http::HeaderName::from_bytes(c.header.as_bytes()).map_err(|e| {
        setup_because(
            format!(
                "upstream {:?}: credential header {:?}: {e}",
                u.name, c.header
            ),
            e,
        )
    })?;
    let raw = std::fs::read_to_string(&c.value_file).map_err(|e| {
        setup_because(
            format!(
                "upstream {:?}: cannot read the credential file {}: {e}",
                u.name, c.value_file
            ),
            e,
        )
    })?;
    // The message names the file, never the value: it is a credential.
    let mut value = http::HeaderValue::from_str(raw.trim()).map_err(|e| {
        setup_because(
            format!(
                "upstream {:?}: the credential in {} is not a valid header value",
                u.name, c.value_file
            ),
            e,
        )
    })?;
    value.set_sensitive(true);
    Ok(Some((name, value)))
}

/// The adapter of `u`, built by its kind's factory with the daemon's clock.
fn build_adapter(
    u: &UpstreamConfig,
    clock: MonotonicClock,
    state_dir: &Path,
    registry: &AdapterRegistry,
) -> Result<Arc<dyn Adapter>, StartError> {
    let target: http::Uri = u.target.parse().map_err(|e| {
        setup_because(
            format!("upstream {:?}: target {:?}: {e}", u.name, u.target),
            e,
        )
    })?;
    let ctx = AdapterContext {
        upstream: u,
        target,
        credential: read_credential(u)?,
        clock,
        state_dir,
    };
    Ok(registry.build(&ctx)?)
}

async fn bind(what: &str, addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| setup_because(format!("cannot listen on {addr} for {what}: {e}"), e))
}

/// The control listener's accept queue: deep enough that a burst of
/// connections opened and closed by a flood does not overflow it, which
/// would drop a health check's SYN and delay it by the client's one-second
/// retransmission (issue 30 item 2). The kernel caps it at somaxconn.
const CONTROL_BACKLOG: u32 = 4096;

/// Bind the control listener with [`CONTROL_BACKLOG`].
fn bind_control(addr: &str) -> Result<TcpListener, StartError> {
    let fail = |e: std::io::Error| {
        setup_because(
            format!("cannot listen on {addr} for the control plane: {e}"),
            e,
        )
    };
    let at: SocketAddr = addr
        .parse()
        .map_err(|e| setup_because(format!("server.listen {addr:?}: {e}"), e))?;
    let socket = if at.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(fail)?;
    // As TcpListener::bind does: a restart may bind while old connections linger.
    socket.set_reuseaddr(true).map_err(fail)?;
    socket.bind(at).map_err(fail)?;
    socket.listen(CONTROL_BACKLOG).map_err(fail)
}

/// Find and open the recovery directory (REC-10..22, REC-25) and return every
/// unresolved record to the engine as held (REC-02): restarting never
/// releases work. A record the configuration no longer maps stops startup (REC-08).
fn open_ledger(
    config: &Config,
    config_path: Option<&Path>,
    engine: &mut Engine,
    clock: MonotonicClock,
) -> Result<(Ledger, std::path::PathBuf), StartError> {
    let input = LocationInput::from_env(config_path, &config.server.admission_state_dir);
    let location = resolve_location(&input)?;
    let (ledger, recovered) = Ledger::open(&location.path)?;
    info!(dir = %location.path.display(), created = location.created, restored = recovered.len(), "recovery directory open");
    // Named borrowers (issue 34): the owner's record, and the entries it
    // shows were released (their row was written, the crash came before the
    // journal's release line): released now, not restored held.
    let mut settled = std::collections::HashSet::new();
    if let Some(b) = &config.borrowers {
        let path = crate::borrowers::usage_path(b, config_path, &location.path);
        let db = crate::usage::UsageDb::open(&path)
            .map_err(|e| setup_because(format!("the usage record: {e}"), e))?;
        let ids: Vec<_> = recovered.iter().map(|e| e.id).collect();
        settled = db
            .recorded(&ids)
            .map_err(|e| setup_because(format!("the usage record: {e}"), e))?;
        ledger
            .set_usage_sink(Box::new(crate::borrowers::UsageRows(db)))
            .map_err(|e| setup_because(format!("the usage record: {e}"), e))?;
        info!(path = %path.display(), "usage record open");
    }
    let (now, wall) = (clock.now(), std::time::SystemTime::now());
    for entry in &recovered {
        if settled.contains(&entry.id) {
            info!(entry = %entry.id, upstream = %entry.upstream, "released before the restart (its use is recorded); its journal record goes now");
            // Queued in order now; a failure brings it back at the next start.
            drop(vacancy::ledger::ReservationStore::forget(&ledger, entry.id));
            continue;
        }
        let reason = entry.held_reason.clone().unwrap_or_else(|| {
            "restored after a restart; the daemon stopped before its end was proven".to_owned()
        });
        let overlaps = engine
            .restore_held(entry.to_restored(now, wall), &reason)
            .map_err(|e| {
                setup_because(
                    format!(
                        "{e} (recovery directory {}); vacancyd does not start rather than forget this work",
                        location.path.display()
                    ),
                    e,
                )
            })?;
        for o in overlaps {
            warn!(entry = %entry.id, other_entry = %o.holder, resource = %o.resource, "two unresolved records name the same resource (a crash came between one job's end and its record); both are held, since either may still run: stop or verify both at the upstream, then release each as an administrator");
        }
        warn!(entry = %entry.id, upstream = %entry.upstream, resources = %entry.resources.join(","), age_s = entry.age(wall).as_secs(), "held work restored: stop or verify it at the upstream, then release it as an administrator");
    }
    Ok((ledger, location.path))
}

/// What tells the presence loop that the console session changed: the
/// Windows service's session-change notifications; nothing elsewhere (and
/// in a console run on Windows, where no service control manager sends any).
fn session_changes() -> Option<Arc<tokio::sync::Notify>> {
    if cfg!(windows) {
        Some(session_changed())
    } else {
        None
    }
}

/// Notified on each session change the Windows service control manager
/// reports (a sign-in, sign-out, lock, unlock or user switch on the
/// console): the presence loop reads the session again at once instead of
/// at its next poll (issue 33 item 2, `SERVICE_CONTROL_SESSIONCHANGE`).
pub(crate) fn session_changed() -> Arc<tokio::sync::Notify> {
    static CHANGES: std::sync::OnceLock<Arc<tokio::sync::Notify>> = std::sync::OnceLock::new();
    Arc::clone(CHANGES.get_or_init(|| Arc::new(tokio::sync::Notify::new())))
}

/// One tracker per NVIDIA GPU when `[owner.gpu_pressure]` is enabled, with
/// its calibrated baselines. A GPU whose reader cannot start reads as
/// unavailable (refusing, PRES-04); a missing baseline as uncalibrated
/// (refusing and reclaiming, PRES-03). Other GPUs have no attributed
/// pressure (SCOPE-09; check-config warns, SCOPE-19).
fn pressure_gpus(
    config: &vacancy::config::Config,
    state_dir: &Path,
    now: vacancy::Moment,
) -> Vec<PressureGpu> {
    let file = CalibrationFile::path_in(state_dir);
    let calibration = CalibrationFile::load(&file).unwrap_or_else(|e| {
        error!(error = %e, "cannot read the pressure calibration; every GPU reads as uncalibrated (vacancyd calibrate-pressure)");
        CalibrationFile::default()
    });
    let params = PressureParams::from_config(&config.owner.gpu_pressure);
    config
        .resources
        .iter()
        .filter(|r| r.kind == ResourceKind::Gpu && r.sampler == SamplerKind::Nvml)
        .map(|r| {
            let reader: Arc<dyn PressureReader> = match NvmlPressureReader::new(&r.name, &r.device) {
                Ok(reader) => Arc::new(reader),
                Err(e) => {
                    error!(resource = %r.name, error = %e, "GPU pressure cannot be read; work on this GPU is refused while pressure is enabled");
                    Arc::new(UnavailableReader::new(e))
                }
            };
            let baseline = calibration.baseline(&r.name);
            if baseline.attended.is_none() || baseline.unattended.is_none() {
                warn!(resource = %r.name, "GPU pressure is not calibrated for both attended and unattended use; uncalibrated readings refuse work (vacancyd calibrate-pressure --resource {} --attended|--unattended)", r.name);
            }
            info!(resource = %r.name, "GPU pressure enabled");
            PressureGpu {
                tracker: PressureTracker::new(r.name.clone(), params, baseline, now),
                reader,
            }
        })
        .collect()
}

/// The descriptors kept out of the connection budgets: [`DESCRIPTOR_RESERVE`]
/// and the idle keep-alive connections of the upstreams' read pools
/// (`pooled`, each pool's `max_idle_total`), which no borrower connection
/// accounts for (a pooled connection in use is the upstream side of a
/// counted borrower connection).
fn descriptor_reserve(pooled: impl IntoIterator<Item = usize>) -> u64 {
    pooled.into_iter().fold(DESCRIPTOR_RESERVE, |sum, idle| {
        sum.saturating_add(u64::try_from(idle).unwrap_or(u64::MAX))
    })
}

/// Assemble everything and start serving; `shutdown` turning true stops it.
/// In order: the engine and its ledger, the samplers and presence, the
/// upstreams' listeners, the control plane; then every listener serves.
// Long: the start sequence in its order, each step one call; the order is the point.
pub async fn start(
    loaded: LoadedConfig,
    config_path: Option<&Path>,
    origin: &str,
    shutdown: watch::Receiver<bool>,
    registry: Arc<AdapterRegistry>,
) -> Result<Daemon, StartError> {
    let config = loaded.config;
    for w in &loaded.warnings {
        warn!(config = %origin, "{w}");
    }
    let clock = MonotonicClock::new();
    let control_addr: SocketAddr =
        config.server.listen.parse().map_err(|e| {
            setup_because(format!("server.listen {:?}: {e}", config.server.listen), e)
        })?;
    if !control_addr.ip().is_loopback() && config.server.tokens.is_empty() {
        warn!(listen = %control_addr, "the control listener is reachable beyond loopback but no [[server.token]] is configured: /status and /metrics answer only loopback clients, and /admin nobody");
    }

    let mut engine = Engine::new(EngineSpec::from(&config))?;
    // Named borrowers (issue 34) before the ledger opens, so that restored
    // entries go back to their borrowers.
    let borrowers = match &config.borrowers {
        None => None,
        Some(b) => {
            let path = crate::borrowers::keys_path(b, config_path);
            let keys = vacancy::auth::BorrowerKeys::load(&path).map_err(|e| {
                setup(format!("{e}\n(the [borrowers] keys file; fix it, or remove [borrowers] to lend anonymously)"))
            })?;
            engine.set_borrowers(Some(keys.spec(b))).map_err(|e| {
                setup_because(format!("borrowers' keys file {}: {e}", path.display()), e)
            })?;
            if keys.is_empty() {
                warn!(path = %path.display(), "[borrowers] is on but no borrower has a key yet: work is refused 401 until `vacancyd borrower add NAME` writes one");
            }
            info!(path = %path.display(), borrowers = keys.len(), require_key = b.require_key, "named borrowers on");
            engine.set_wall_clock(clock.now(), vacancy::time::unix_ms_now());
            Some((b.clone(), path, keys))
        }
    };
    let (ledger, state_dir) = open_ledger(&config, config_path, &mut engine, clock)?;
    let lender = Arc::new(Lender::new(
        engine,
        config.resources.iter().map(|r| r.name.clone()),
        clock,
        Arc::new(ledger),
    ));
    let keys_watch = match borrowers {
        None => None,
        Some((b, path, keys)) => {
            lender.open_borrower_gate(keys, &b);
            Some((b, path))
        }
    };

    let presence = vacancy::presence::from_owner(&config.owner, Path::new(SEATS_DIR));
    info!("{}", presence.line);
    let shown_presence = (presence.shown.clone(), presence.manual.clone());
    // SCOPE-18: the line check-config prints too.
    if let Some(line) = config.exemption_line() {
        info!("{line}");
    }

    let mut tasks = JoinSet::new();
    if let Some((b, path)) = keys_watch {
        let usage_path = crate::borrowers::usage_path(&b, config_path, &state_dir);
        let usage = crate::usage::UsageDb::open(&usage_path)
            .map_err(|e| setup_because(format!("the usage record: {e}"), e))?;
        tasks.spawn(crate::borrowers::keys_loop(
            Arc::clone(&lender),
            path,
            b,
            Some(usage),
            shutdown.clone(),
        ));
    }
    spawn_terms(&config, &lender, &state_dir, &mut tasks, &shutdown).await?;
    spawn_samplers(&config, &lender, &mut tasks, &shutdown).await;
    tasks.spawn(presence_watch::presence_loop(
        Arc::clone(&lender),
        Arc::from(presence.backend),
        presence_watch::PRESENCE_EVERY,
        session_changes(),
        shutdown.clone(),
    ));
    if config.owner.gpu_pressure.enabled {
        tasks.spawn(vacancy::shell::loops::pressure_watch::pressure_loop(
            Arc::clone(&lender),
            pressure_gpus(&config, &state_dir, clock.now()),
            crate::calibrate::upstream_addrs(&config),
            Duration::from_millis(config.owner.gpu_pressure.poll_ms),
            shutdown.clone(),
        ));
    }

    // The open-files limit, raised once: the read pools take their share of
    // it here, and serve_listeners splits the rest into connection budgets.
    let open_files = conn::raise_nofile_limit();
    let read_pool_idle =
        vacancy::shell::upstream::pool::idle_for_descriptors(open_files, config.upstreams.len());
    let (infos, servers) = open_upstreams(
        &config,
        &lender,
        &state_dir,
        &registry,
        read_pool_idle,
        &mut tasks,
        &shutdown,
    )
    .await?;
    tasks.spawn(vacancy::shell::loops::reclaim::reclaim_loop(
        Arc::clone(&lender),
        servers.iter().map(|(_, r)| Arc::clone(r)).collect(),
        ReclaimTimes::default(),
        shutdown.clone(),
    ));
    let control_listener = bind_control(&config.server.listen)?;
    let control = control_listener
        .local_addr()
        .map_err(|e| setup_because(format!("control listener: {e}"), e))?;
    let mut state = control_state(
        &config,
        config_path,
        &lender,
        infos,
        shown_presence,
        &registry,
    );
    // HELD-09: local administration over a named pipe on Windows, whose
    // requests reach the control plane with a token only the pipe holds.
    #[cfg(windows)]
    let pipe = {
        let pipe = crate::admin_pipe::AdminPipe::bind().map_err(setup)?;
        let mut tokens = config.server.tokens.clone();
        tokens.push(pipe.token_entry());
        state.tokens = vacancy::auth::Tokens::new(tokens);
        pipe
    };
    if let Some(b) = &config.borrowers {
        state.usage_db = Some(crate::borrowers::usage_path(b, config_path, &state_dir));
    }
    let state = Arc::new(state);
    serve_listeners(
        &config,
        &lender,
        Listeners {
            upstreams: servers,
            control: control_listener,
            open_files,
        },
        &state,
        &mut tasks,
        &shutdown,
    );
    #[cfg(windows)]
    tasks.spawn(pipe.serve(control, shutdown.clone()));
    state.ready.store(true, Ordering::Release);
    info!(control = %control, "ready");
    Ok(Daemon { tasks })
}

/// The owner's terms beyond presence (issue 35), each with its first
/// reading given to the engine before any listener opens: the lending hours,
/// the power supply with `on_battery = "pause"`, and each GPU's power cap,
/// whose limits a crash left lowered are restored first.
async fn spawn_terms(
    config: &Config,
    lender: &Arc<Lender>,
    state_dir: &Path,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), StartError> {
    if let Some(hours) = &config.lending.hours {
        let schedule = vacancy::hours::Schedule::parse(hours)
            .map_err(|e| setup_because(format!("lending.hours: {e}"), e))?;
        let projected = vacancy::shell::loops::hours_watch::project(&schedule, lender);
        info!(schedule = %projected.schedule, "lending hours in force");
        lender.set_lending_hours(Some(projected));
        tasks.spawn(vacancy::shell::loops::hours_watch::hours_loop(
            Arc::clone(lender),
            schedule,
            shutdown.clone(),
        ));
    }
    if config.owner.on_battery == vacancy::config::OnBattery::Pause {
        let supply: Arc<dyn vacancy::sample::PowerSupply> = Arc::from(
            vacancy::sample::system_power_supply(&config.owner.power_supply_dir),
        );
        let first = vacancy::shell::loops::power_watch::read_once(&supply).await;
        info!(supply = %supply.name(), power = first.as_str(), "on_battery = \"pause\": borrowed work is refused and reclaimed on battery");
        lender.set_power(Some(first));
        tasks.spawn(vacancy::shell::loops::power_watch::power_loop(
            Arc::clone(lender),
            supply,
            vacancy::shell::loops::power_watch::POWER_EVERY,
            shutdown.clone(),
        ));
    }
    let mut caps = Vec::new();
    for r in config
        .resources
        .iter()
        .filter(|r| r.heat_limits().is_some())
    {
        info!(resource = %r.name, limits = %r.heat_limits().map(|l| l.describe()).unwrap_or_default(), "GPU heat and power limits in force");
    }
    for r in &config.resources {
        let Some(cap_w) = r.power_cap_w else { continue };
        match vacancy::sample::power_limit_for(r) {
            Ok(control) => caps.push(vacancy::shell::loops::power_cap::PowerCap::new(
                &r.name,
                cap_w,
                Arc::from(control),
                state_dir,
            )),
            Err(e) => {
                error!(resource = %r.name, error = %e, "power_cap_w cannot be applied to this GPU; borrowed work runs at its own limit");
            }
        }
    }
    vacancy::shell::loops::power_cap::restore_after_crash(&caps, state_dir);
    if !caps.is_empty() {
        tasks.spawn(vacancy::shell::loops::power_cap::power_cap_loop(
            Arc::clone(lender),
            caps,
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// One sampling loop per resource, each after one sample taken before the
/// listeners open, so the first borrower is not refused with
/// capacity_unknown merely because the daemon just started. A failure is
/// recorded (capacity unknown until a success) and logged.
async fn spawn_samplers(
    config: &vacancy::config::Config,
    lender: &Arc<Lender>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) {
    let mut post_job = Vec::new();
    for r in &config.resources {
        let resource = sampling::sampler_for(r, lender.clock());
        let poll = Duration::from_millis(r.poll_ms);
        let timeout = sampling::sample_timeout(poll);
        let _ = sampling::sample_once(&**lender, &*resource, timeout).await;
        post_job.push(PostJobSampler::new(Arc::clone(&resource), timeout));
        tasks.spawn(sampling::sample_loop(
            Arc::clone(lender),
            resource,
            poll,
            timeout,
            shutdown.clone(),
        ));
    }
    // Where each job ends, on its proxy worker: fewer threads crossed
    // before the next request can be decided (ADM-05, ADM-06).
    lender.sample_where_jobs_end(post_job);
}

/// Every lent upstream's listener and route, each with its observation loop.
async fn open_upstreams(
    config: &vacancy::config::Config,
    lender: &Arc<Lender>,
    state_dir: &Path,
    registry: &AdapterRegistry,
    read_pool_idle: usize,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(Vec<UpstreamInfo>, Vec<(TcpListener, Arc<UpstreamRoute>)>), StartError> {
    let mut infos = Vec::new();
    let mut servers = Vec::new();
    for u in &config.upstreams {
        let (listener, route, info) =
            open_upstream(u, config, lender, state_dir, registry, read_pool_idle).await?;
        tasks.spawn(observation::observe_loop(
            Arc::clone(lender),
            Arc::clone(&route),
            Arc::clone(&info.health),
            OBSERVE_EVERY,
            shutdown.clone(),
        ));
        infos.push(info);
        servers.push((listener, route));
    }
    Ok((infos, servers))
}

/// One lent upstream: its adapter and route, its bound listener, and the
/// facts `/status` shows of it.
async fn open_upstream(
    u: &vacancy::config::UpstreamConfig,
    config: &vacancy::config::Config,
    lender: &Lender,
    state_dir: &Path,
    registry: &AdapterRegistry,
    read_pool_idle: usize,
) -> Result<(TcpListener, Arc<UpstreamRoute>, UpstreamInfo), StartError> {
    let max_body_bytes = usize::try_from(config.server.max_body_mib.saturating_mul(1024 * 1024))
        .unwrap_or(usize::MAX);
    let adapter = build_adapter(u, lender.clock(), state_dir, registry)?;
    let id = lender
        .upstream_id(&u.name)
        .ok_or_else(|| setup(format!("upstream {:?} is missing from the engine", u.name)))?;
    let target = Target::parse(&u.target)
        .map_err(|e| setup_because(format!("upstream {:?}: {e}", u.name), e))?;
    // Looked up once now, and again only when connecting fails (issue 31 item 5).
    match tokio::time::timeout(Duration::from_secs(5), target.resolve()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            warn!(upstream = %u.name, target = %u.target, error = %e, "cannot resolve the upstream's host now; it is looked up again at its first connection");
        }
        Err(_) => {
            warn!(upstream = %u.name, target = %u.target, "resolving the upstream's host took over 5 s; it is looked up again at its first connection");
        }
    }
    let route = Arc::new(UpstreamRoute {
        name: u.name.clone(),
        id,
        adapter,
        target,
        management: u.management,
        on_borrower_disconnect: u.on_borrower_disconnect,
        completion_timeout: Duration::from_secs(u.completion_timeout_s),
        stop_proof_timeout: Duration::from_secs(u.stop_proof_timeout_s),
        max_body_bytes,
        connect_timeout: Duration::from_secs(10),
        overhead_header: config.server.overhead_header,
        tunnel_idle: Duration::from_secs(config.server.tunnel_idle_timeout_s),
        credential: read_credential(u)?,
        reads: vacancy::shell::upstream::pool::ReadPool::per_worker(
            Duration::from_secs(10),
            proxy_threads(config),
            read_pool_idle,
        ),
        series: Default::default(),
    });
    let listener = bind(&format!("upstream {:?}", u.name), &u.listen).await?;
    let info = UpstreamInfo {
        adapter: u.adapter.as_str().to_owned(),
        listen: listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| u.listen.clone()),
        target: u.target.clone(),
        health: Arc::new(HealthCell::default()),
    };
    Ok((listener, route, info))
}

/// What the control plane serves from.
fn control_state(
    config: &vacancy::config::Config,
    config_path: Option<&Path>,
    lender: &Arc<Lender>,
    upstreams: Vec<UpstreamInfo>,
    (presence_backend, manual): (String, Option<vacancy::presence::ManualPresence>),
    registry: &Arc<AdapterRegistry>,
) -> ControlState {
    ControlState {
        lender: Arc::clone(lender),
        upstreams,
        presence_backend,
        manual,
        tokens: vacancy::auth::Tokens::new(config.server.tokens.clone()),
        ready: false.into(),
        settings: Arc::new(crate::settings::Settings::new(
            config_path.map(Path::to_path_buf),
            config.clone(),
            Arc::clone(registry),
        )),
        pressure_gpus: measured_gpus(config),
        event_streams: 0.into(),
        hosts: vacancy::shell::proxy::host::HostNames::new(&config.server.allowed_hosts),
        failures: crate::control::failures::AuthFailures::default(),
        usage_db: None,
    }
}

/// The GPUs whose pressure is measured, for `/metrics`.
fn measured_gpus(config: &vacancy::config::Config) -> Vec<String> {
    if !config.owner.gpu_pressure.enabled {
        return Vec::new();
    }
    config
        .resources
        .iter()
        .filter(|r| r.kind == ResourceKind::Gpu && r.sampler == SamplerKind::Nvml)
        .map(|r| r.name.clone())
        .collect()
}

/// The threads serving borrower connections: `[server] proxy_threads`, one
/// per core when 0.
fn proxy_threads(config: &vacancy::config::Config) -> usize {
    vacancy::shell::state::workers::thread_count(
        usize::try_from(config.server.proxy_threads).unwrap_or(1),
    )
}

/// The bound listeners, and the open-files limit their connection budgets
/// split.
struct Listeners {
    upstreams: Vec<(TcpListener, Arc<UpstreamRoute>)>,
    control: TcpListener,
    open_files: u64,
}

/// Every borrower listener and the control listener serve, within the
/// connection budgets the open-files limit allows.
fn serve_listeners(
    config: &vacancy::config::Config,
    lender: &Arc<Lender>,
    listeners: Listeners,
    state: &Arc<ControlState>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) {
    let Listeners {
        upstreams: servers,
        control: control_listener,
        open_files: nofile,
    } = listeners;
    let limits = ConnLimits::from_config(&config.server);
    let workers = match vacancy::shell::state::workers::ProxyWorkers::start(
        proxy_threads(config),
        state.lender.metrics().proxy_cpu_yields(),
    ) {
        Ok(w) => {
            #[cfg(not(windows))]
            w.upkeep(
                crate::allocator::EVERY,
                crate::allocator::return_thread_cache,
            );
            Some(w)
        }
        Err(e) => {
            warn!(error = %e, "cannot start the proxy's worker threads; borrower connections are served on the main runtime");
            None
        }
    };
    let reserve = descriptor_reserve(servers.iter().map(|(_, r)| r.reads.max_idle_total()));
    let (borrowers, control_budget) = conn::budgets(nofile, reserve);
    let control_pools = crate::control::conns::Sizes::from_total(control_budget.size());
    info!(
        open_files = nofile,
        descriptor_reserve = reserve,
        borrower_connections = borrowers.size(),
        control_connections = control_budget.size(),
        control_reserve = control_pools.reserve,
        control_per_peer = control_pools.per_peer,
        proxy_threads = workers.as_ref().map_or(0, |w| w.len()),
        header_timeout_s = limits.header.as_secs(),
        idle_timeout_s = limits.idle.as_secs(),
        body_timeout_s = limits.body.as_secs(),
        tunnel_idle_timeout_s = config.server.tunnel_idle_timeout_s,
        "connection limits"
    );
    for (listener, route) in servers {
        info!(upstream = %route.name, adapter = route.adapter.name(), listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), target = %route.target.authority, "lending upstream");
        tasks.spawn(vacancy::shell::serve(
            listener,
            Arc::clone(lender),
            route,
            Listening {
                limits,
                budget: borrowers.clone(),
                workers: workers.clone(),
            },
            shutdown.clone(),
            SHUTDOWN_GRACE,
        ));
    }
    tasks.spawn(crate::control::serve(
        control_listener,
        Arc::clone(state),
        Listening {
            limits,
            budget: control_budget,
            workers: None,
        },
        shutdown.clone(),
    ));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::error::Error as _;

    #[test]
    fn each_upstreams_idle_read_pool_is_kept_out_of_the_connection_budgets() {
        // A pooled idle connection holds a descriptor no borrower connection
        // counts: with 600 descriptors and one upstream (a pool of 75), 198
        // borrower connections (two descriptors each) instead of 236.
        use vacancy::shell::upstream::pool::{ReadPool, idle_for_descriptors};
        let pool = |nofile, upstreams, workers| {
            ReadPool::per_worker(
                Duration::from_secs(1),
                workers,
                idle_for_descriptors(nofile, upstreams),
            )
            .max_idle_total()
        };
        assert_eq!(descriptor_reserve([]), 64);
        assert_eq!(descriptor_reserve([pool(65_536, 2, 2); 2]), 64 + 2 * 128);
        assert_eq!(pool(600, 1, 2), 75);
        assert_eq!(pool(600, 1, 16), 75);
        let (borrowers, control) = conn::budgets(600, descriptor_reserve([pool(600, 1, 2)]));
        assert_eq!(borrowers.size(), 198);
        assert!(borrowers.size() * 2 + control.size() + 64 + 75 <= 600);
        // Beyond 124 workers each keeps one: the reserve follows.
        assert_eq!(descriptor_reserve([pool(65_536, 1, 256)]), 64 + 1 + 256);
    }

    #[test]
    fn a_setup_error_keeps_its_message_and_carries_its_source() {
        // Issue 32 item 6: the operator's words unchanged, the cause typed.
        let e = bind_control("not an address").unwrap_err();
        assert_eq!(
            e.to_string(),
            "server.listen \"not an address\": invalid socket address syntax"
        );
        assert!(matches!(e, StartError::Setup { .. }), "{e:?}");
        let source = e.source().unwrap();
        assert!(source.is::<std::net::AddrParseError>(), "{source:?}");

        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let e = bind_control(&addr).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("cannot listen on {addr} for the control plane: ")),
            "{e}"
        );
        let io = e
            .source()
            .unwrap()
            .downcast_ref::<std::io::Error>()
            .unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::AddrInUse);
    }

    #[test]
    fn an_adapter_factorys_error_reaches_the_operator_in_its_own_words() {
        let e = StartError::from(BuildError::because(
            "llamacpp adapter: overlap",
            std::io::Error::other("overlap"),
        ));
        assert_eq!(e.to_string(), "llamacpp adapter: overlap");
        assert!(matches!(e, StartError::Adapter(_)), "{e:?}");
    }
}
