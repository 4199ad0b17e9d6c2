//! `vacancyd`: the reference daemon and CLI of vacancy.

mod check_config;
mod control;
mod daemon;
mod status_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
        /// The configuration file; without it, the embedded default (system
        /// memory, a llama-server at 127.0.0.1:8080 lent at 127.0.0.1:8081).
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
}

fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VACANCYD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config, no_sample } => {
            check_config::run(config.as_deref(), !no_sample)
        }
        Command::Run { config } => {
            init_logging();
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(daemon::run(config.as_deref())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("vacancyd: not started: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Status { json, url } => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(status_cmd::fetch(&url)) {
                Ok(v) if json => {
                    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(v) => {
                    print!("{}", status_cmd::render(&v));
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
