//! `vacancyd service install | uninstall | start | stop | status` and the
//! service itself, on Windows.
//!
//! The service runs `vacancyd.exe service-run --config
//! %ProgramData%\vacancyd\vacancyd.toml` as LocalSystem, started at boot. A
//! stop from the service control manager (or the system shutting down) is
//! the graceful shutdown SIGTERM is on Linux: no new connections, open
//! exchanges finish or are held, never forgotten. Its log goes to
//! `%ProgramData%\vacancyd\logs\vacancyd.log.<date>`, one file a day, the
//! last 14 kept, without colour codes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::Subcommand;
use vacancy::platform::windows::{create_private_dirs, service_base};
use vacancy::registry::AdapterRegistry;
use vacancy_win32::windows_service::service::{
    ServiceAccess, ServiceControl, ServiceControlAccept, ServiceErrorControl, ServiceExitCode,
    ServiceInfo, ServiceStartType, ServiceState, ServiceStatus, ServiceType,
};
use vacancy_win32::windows_service::service_control_handler::{
    self, ServiceControlHandlerResult, ServiceStatusHandle,
};
use vacancy_win32::windows_service::service_manager::{ServiceManager, ServiceManagerAccess};

use crate::daemon;

/// The service's name in the service control manager.
pub const SERVICE_NAME: &str = "vacancyd";
/// How long a stop may take: the daemon's shutdown grace and its margin.
const STOP_WAIT: Duration = Duration::from_secs(40);
/// `ERROR_SERVICE_ALREADY_RUNNING`.
const ERROR_SERVICE_ALREADY_RUNNING: i32 = 1056;
/// Daily log files kept.
const LOG_FILES_KEPT: usize = 14;

/// What `vacancyd service` does.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Register vacancyd as a service that runs as LocalSystem and starts at
    /// boot, with the configuration given or
    /// %ProgramData%\vacancyd\vacancyd.toml (written from the built-in
    /// default when missing). Run as an administrator.
    Install {
        /// The configuration file the service runs with.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Stop the service if it runs, and remove it (the configuration and the
    /// recovery directory stay, REC-07).
    Uninstall,
    /// Start the service.
    Start,
    /// Stop the service gracefully (as SIGTERM does on Linux).
    Stop,
    /// Say whether the service is installed and running.
    Status,
}

/// `%ProgramData%\vacancyd\vacancyd.toml`.
pub fn default_config() -> PathBuf {
    service_base().join("vacancyd.toml")
}

/// Run `command`, printing what was done or why not.
pub fn run(command: &ServiceCommand) -> ExitCode {
    let done = match command {
        ServiceCommand::Install { config } => install(config.as_deref()),
        ServiceCommand::Uninstall => uninstall(),
        ServiceCommand::Start => start(),
        ServiceCommand::Stop => stop(),
        ServiceCommand::Status => status(),
    };
    match done {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vacancyd service: {e}");
            ExitCode::FAILURE
        }
    }
}

fn scm_error(what: &str, e: &vacancy_win32::windows_service::Error) -> String {
    let detail = match e {
        vacancy_win32::windows_service::Error::Winapi(io) => io.to_string(),
        other => other.to_string(),
    };
    if detail.contains("os error 5") {
        format!("cannot {what}: {detail} (run it as an administrator)")
    } else {
        format!("cannot {what}: {detail}")
    }
}

fn manager(access: ServiceManagerAccess) -> Result<ServiceManager, String> {
    ServiceManager::local_computer(None::<&str>, access)
        .map_err(|e| scm_error("connect to the service control manager", &e))
}

fn install(config: Option<&Path>) -> Result<String, String> {
    let mut said = Vec::new();
    let config = match config {
        Some(c) => {
            std::path::absolute(c).map_err(|e| format!("cannot resolve {}: {e}", c.display()))?
        }
        None => {
            let path = default_config();
            if !path.exists() {
                let base = service_base();
                create_private_dirs(&base, &base)
                    .map_err(|e| format!("cannot create {}: {e:?}", base.display()))?;
                std::fs::write(&path, vacancy::config::EMBEDDED_DEFAULT)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                said.push(format!(
                    "wrote the built-in default configuration to {}: edit it, then start the service",
                    path.display()
                ));
            }
            path
        }
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find vacancyd.exe: {e}"))?;
    let info = ServiceInfo {
        name: OsString::from(SERVICE_NAME),
        display_name: OsString::from("vacancy lending daemon"),
        service_type: ServiceType::OWN_PROCESS,
        start_type: ServiceStartType::AutoStart,
        error_control: ServiceErrorControl::Normal,
        executable_path: exe,
        launch_arguments: vec![
            OsString::from("service-run"),
            OsString::from("--config"),
            config.clone().into_os_string(),
        ],
        dependencies: vec![],
        // LocalSystem.
        account_name: None,
        account_password: None,
    };
    let scm = manager(ServiceManagerAccess::CONNECT | ServiceManagerAccess::CREATE_SERVICE)?;
    let service = scm
        .create_service(&info, ServiceAccess::CHANGE_CONFIG)
        .map_err(|e| scm_error("create the service", &e))?;
    let _ = service.set_description(
        "Lends this machine's idle GPUs and memory to borrowers through its inference servers.",
    );
    said.push(format!(
        "installed service {SERVICE_NAME} (LocalSystem, starts at boot) with {}; start it with \
         `vacancyd service start`; its log is in {}",
        config.display(),
        log_dir().display()
    ));
    Ok(said.join("\n"))
}

fn uninstall() -> Result<String, String> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(
            SERVICE_NAME,
            ServiceAccess::QUERY_STATUS | ServiceAccess::STOP | ServiceAccess::DELETE,
        )
        .map_err(|e| scm_error("open the service", &e))?;
    if let Ok(s) = service.query_status()
        && s.current_state != ServiceState::Stopped
    {
        let _ = service.stop();
        wait_for(&|| service.query_status().ok(), ServiceState::Stopped);
    }
    service
        .delete()
        .map_err(|e| scm_error("delete the service", &e))?;
    Ok(format!(
        "removed service {SERVICE_NAME}; the configuration and the recovery directory in {} are \
         kept",
        service_base().display()
    ))
}

fn start() -> Result<String, String> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(
            SERVICE_NAME,
            ServiceAccess::START | ServiceAccess::QUERY_STATUS,
        )
        .map_err(|e| scm_error("open the service", &e))?;
    match service.start::<&str>(&[]) {
        Ok(()) => {}
        // Started already (at boot, say): nothing to do but say so.
        Err(vacancy_win32::windows_service::Error::Winapi(e))
            if e.raw_os_error() == Some(ERROR_SERVICE_ALREADY_RUNNING) => {}
        Err(e) => return Err(scm_error("start the service", &e)),
    }
    match wait_for(&|| service.query_status().ok(), ServiceState::Running) {
        Some(s) if s.current_state == ServiceState::Running => Ok(describe(&s)),
        Some(_) => Err(format!(
            "the service stopped while starting; its log in {} says why",
            log_dir().display()
        )),
        None => Err(format!(
            "the service did not report running within {STOP_WAIT:?}; see its log in {}",
            log_dir().display()
        )),
    }
}

fn stop() -> Result<String, String> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(
            SERVICE_NAME,
            ServiceAccess::STOP | ServiceAccess::QUERY_STATUS,
        )
        .map_err(|e| scm_error("open the service", &e))?;
    service
        .stop()
        .map_err(|e| scm_error("stop the service", &e))?;
    match wait_for(&|| service.query_status().ok(), ServiceState::Stopped) {
        Some(s) => Ok(describe(&s)),
        None => Err(format!(
            "the service did not stop within {STOP_WAIT:?}; see its log in {}",
            log_dir().display()
        )),
    }
}

fn status() -> Result<String, String> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(SERVICE_NAME, ServiceAccess::QUERY_STATUS)
        .map_err(|e| scm_error("open the service (is it installed?)", &e))?;
    let s = service
        .query_status()
        .map_err(|e| scm_error("query the service", &e))?;
    Ok(describe(&s))
}

/// `vacancyd: running (pid 4242)`.
fn describe(s: &ServiceStatus) -> String {
    let state = match s.current_state {
        ServiceState::Stopped => "stopped",
        ServiceState::StartPending => "starting",
        ServiceState::StopPending => "stopping",
        ServiceState::Running => "running",
        ServiceState::ContinuePending => "resuming",
        ServiceState::PausePending => "pausing",
        ServiceState::Paused => "paused",
    };
    match s.process_id {
        Some(pid) if s.current_state != ServiceState::Stopped => {
            format!("{SERVICE_NAME}: {state} (pid {pid})")
        }
        _ => format!("{SERVICE_NAME}: {state}"),
    }
}

/// Poll `query` until the service is in `state` (or, waiting for it to
/// run, has stopped again after it began starting), within [`STOP_WAIT`].
fn wait_for(
    query: &dyn Fn() -> Option<ServiceStatus>,
    state: ServiceState,
) -> Option<ServiceStatus> {
    let until = Instant::now() + STOP_WAIT;
    let mut began = false;
    while Instant::now() < until {
        if let Some(s) = query() {
            if s.current_state == state {
                return Some(s);
            }
            if state == ServiceState::Running {
                match s.current_state {
                    ServiceState::Stopped if began => return Some(s),
                    ServiceState::Stopped => {}
                    _ => began = true,
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

/// `%ProgramData%\vacancyd\logs`.
pub fn log_dir() -> PathBuf {
    service_base().join("logs")
}

/// What the service runs with, set before the dispatcher starts it.
static SERVICE: OnceLock<(Option<PathBuf>, Arc<AdapterRegistry>)> = OnceLock::new();

/// `vacancyd service-run`: connect to the service control manager and run
/// the daemon as the service. Only the service control manager starts it.
pub fn dispatch(config: Option<PathBuf>, registry: Arc<AdapterRegistry>) -> ExitCode {
    let _ = SERVICE.set((config, registry));
    match vacancy_win32::service::dispatch(SERVICE_NAME, service_main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "vacancyd service-run: {} (this command is what the service control manager \
                 starts; to run vacancyd in a console use `vacancyd run`)",
                scm_error("connect to the service control manager", &e)
            );
            ExitCode::FAILURE
        }
    }
}

fn status_of(state: ServiceState, exit: u32, wait: Duration) -> ServiceStatus {
    ServiceStatus {
        service_type: ServiceType::OWN_PROCESS,
        current_state: state,
        controls_accepted: if state == ServiceState::Running {
            ServiceControlAccept::STOP
                | ServiceControlAccept::SHUTDOWN
                | ServiceControlAccept::SESSION_CHANGE
        } else {
            ServiceControlAccept::empty()
        },
        exit_code: ServiceExitCode::Win32(exit),
        checkpoint: 0,
        wait_hint: wait,
        process_id: None,
    }
}

/// The service: log to the file, run the daemon until the control manager
/// says stop, report each state.
fn service_main(_arguments: Vec<OsString>) {
    let Some((config, registry)) = SERVICE.get().cloned() else {
        return;
    };
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let handler = move |control| match control {
        ServiceControl::Stop | ServiceControl::Shutdown | ServiceControl::Preshutdown => {
            let _ = stop_tx.send(true);
            ServiceControlHandlerResult::NoError
        }
        ServiceControl::Interrogate => ServiceControlHandlerResult::NoError,
        ServiceControl::SessionChange(change) => {
            tracing::debug!(reason = ?change.reason, "console session changed");
            crate::daemon::session_changed().notify_one();
            ServiceControlHandlerResult::NoError
        }
        _ => ServiceControlHandlerResult::NotImplemented,
    };
    let Ok(handle) = service_control_handler::register(SERVICE_NAME, handler) else {
        return;
    };
    let report = |h: &ServiceStatusHandle, state, exit, wait| {
        let _ = h.set_service_status(status_of(state, exit, wait));
    };
    if init_file_log().is_err() {
        // Nowhere to say it but the service's exit code.
        report(&handle, ServiceState::Stopped, 1, Duration::ZERO);
        return;
    }
    report(&handle, ServiceState::StartPending, 0, STOP_WAIT);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            report(&handle, ServiceState::Stopped, 1, Duration::ZERO);
            return;
        }
    };
    let stopping = async {
        let _ = stop_rx.wait_for(|stop| *stop).await;
        tracing::info!("the service control manager asked vacancyd to stop");
        report(&handle, ServiceState::StopPending, 0, STOP_WAIT);
    };
    let running = || report(&handle, ServiceState::Running, 0, Duration::ZERO);
    let exit = match runtime.block_on(daemon::run_until(
        config.as_deref(),
        registry,
        running,
        stopping,
    )) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("not started: {e}");
            1
        }
    };
    report(&handle, ServiceState::Stopped, exit, Duration::ZERO);
}

/// The service's log: a file a day under [`log_dir`], without colour codes.
fn init_file_log() -> Result<(), String> {
    let base = service_base();
    let dir = log_dir();
    create_private_dirs(&dir, &base).map_err(|e| format!("{e:?}"))?;
    let appender = tracing_appender::rolling::RollingFileAppender::builder()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("vacancyd")
        .filename_suffix("log")
        .max_log_files(LOG_FILES_KEPT)
        .build(&dir)
        .map_err(|e| e.to_string())?;
    crate::logging::init_to(appender);
    Ok(())
}
