//! The `vacancyd` command line: its subcommands, run with one adapter registry.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use vacancy::registry::AdapterRegistry;

use crate::{admin, calibrate, check_config, daemon, logging, status, usage};

/// Lend idle AI hardware without getting in its owner's way.
#[derive(Debug, Parser)]
#[command(name = "vacancyd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: one proxy listener per upstream and the control plane.
    Run {
        /// The configuration file; without it, the embedded default: system
        /// memory (4096 MiB reserve), a llama-server at 127.0.0.1:8080 lent at
        /// 127.0.0.1:8081 (2048 MiB a job), an Ollama at 127.0.0.1:11434 lent
        /// at 127.0.0.1:11435 (4096 MiB a job), presence auto (logind on a
        /// desktop: work is refused while its owner is logged in).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Show what the daemon is doing: resources, upstreams, work, held entries.
    Status {
        /// Print the raw `/status` JSON.
        #[arg(long)]
        json: bool,
        /// The control listener's base URL.
        #[arg(long, default_value = "http://127.0.0.1:7480")]
        url: String,
    },
    /// Ask the running daemon to do something (needs a token with the right
    /// scope; on Windows, without a token, it goes over the local
    /// administration pipe, which admits only administrators).
    AdminRequest {
        /// The control listener's base URL.
        #[arg(long, default_value = "http://127.0.0.1:7480")]
        url: String,
        /// A file holding the token; else $VACANCYD_TOKEN.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// release_work ID | lending on|off | resource NAME on|off | presence present|away
        #[arg(required = true, num_args = 1..)]
        action: Vec<String>,
    },
    /// Named borrowers' keys (issue 34): add, remove, list.
    Borrower {
        #[command(subcommand)]
        command: crate::borrower_cmd::BorrowerCommand,
    },
    /// Tokens for the control plane.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Validate a configuration: print every problem at once with its line,
    /// then sample each resource once and warn about what looks wrong.
    CheckConfig {
        /// The configuration file; without it, the embedded default is checked.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Skip sampling the resources (validate the file only).
        #[arg(long)]
        no_sample: bool,
    },
    /// Measure a GPU's normal owner load for a while and save it as its
    /// attended or unattended GPU pressure baseline.
    CalibratePressure(calibrate::Args),
    /// The owner's record of who used the machine: reservations, reserved
    /// seconds, waits and refusals by borrower, day or resource (read-only:
    /// it runs while the daemon writes).
    Usage(usage::Args),
    /// The Windows service: install, uninstall, start, stop, status.
    #[cfg(windows)]
    Service {
        #[command(subcommand)]
        command: crate::service::ServiceCommand,
    },
    /// The notification-area icon for the owner at a Windows desktop: the
    /// console's sign in its words, and a menu to open the console, pause or
    /// resume lending, and quit (the installer starts it at every sign-in).
    #[cfg(windows)]
    Tray {
        /// The control listener's base URL.
        #[arg(long, default_value = "http://127.0.0.1:7480")]
        url: String,
        /// Seal the owner's token (from --token-file, else $VACANCYD_TOKEN)
        /// for this user with the Windows data-protection API, for the
        /// menu's pause and resume, and exit.
        #[arg(long)]
        save_token: bool,
        /// With --save-token: a file holding the token.
        #[arg(long, requires = "save_token")]
        token_file: Option<PathBuf>,
    },
    /// What the Windows service control manager starts (not for a console:
    /// use `run`).
    #[cfg(windows)]
    #[command(hide = true)]
    ServiceRun {
        /// The configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a new token once, and the `[[server.token]]` lines that store its hash.
    New {
        /// The token's name (it appears in the audit log).
        #[arg(long)]
        name: String,
        /// read | owner | admin (admin implies owner implies read).
        #[arg(long, value_parser = ["read", "owner", "admin"])]
        scope: String,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("vacancyd: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// Parse the command line and run its subcommand with `registry`'s adapter kinds.
// Long: the CLI's dispatch, one match arm a subcommand.
pub(crate) fn main(registry: Arc<AdapterRegistry>) -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        #[cfg(windows)]
        Command::Service { command } => crate::service::run(&command),
        #[cfg(windows)]
        Command::Tray {
            url,
            save_token,
            token_file,
        } => {
            if !save_token {
                return crate::tray::run(url);
            }
            match admin::token(token_file.as_deref()) {
                Ok(token) => match crate::tray::token::save(&token) {
                    Ok(path) => {
                        println!(
                            "The owner's token is sealed for this user in {}; the tray's pause and resume use it.",
                            path.display()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("vacancyd tray: {e}");
                        ExitCode::FAILURE
                    }
                },
                Err(e) => {
                    eprintln!("vacancyd tray: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        #[cfg(windows)]
        Command::ServiceRun { config } => crate::service::dispatch(config, registry),
        Command::CalibratePressure(args) => calibrate::run(&args, &registry),
        Command::Borrower { command } => crate::borrower_cmd::run(&command),
        Command::Usage(args) => usage::run(&args, &registry),
        Command::CheckConfig { config, no_sample } => {
            check_config::run(config.as_deref(), !no_sample, &registry)
        }
        Command::Run { config } => {
            match logging::from_env() {
                Ok(format) => logging::init(format),
                Err(e) => {
                    eprintln!("vacancyd: not started: {e}");
                    return ExitCode::FAILURE;
                }
            }
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(daemon::run(config.as_deref(), registry)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("vacancyd: not started: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Token {
            command: TokenCommand::New { name, scope },
        } => match admin::new_token_text(&name, &scope) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("vacancyd token new: {e}");
                ExitCode::FAILURE
            }
        },
        Command::AdminRequest {
            url,
            token_file,
            action,
        } => {
            let parsed = admin::Action::parse(&action)
                .and_then(|a| admin::credential(token_file.as_deref()).map(|t| (a, t)));
            let (action, credential) = match parsed {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("vacancyd admin-request: {e}");
                    return ExitCode::from(2);
                }
            };
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(admin::send_with(&url, &credential, &action)) {
                Ok(body) => {
                    println!("{body}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("vacancyd admin-request: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Status { json, url } => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(status::fetch(&url)) {
                Ok(v) if json => {
                    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(v) => {
                    print!("{}", status::render(&v));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("vacancyd status: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
