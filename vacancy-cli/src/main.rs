//! `vacancyd`: the reference daemon and CLI of vacancy.
//!
//! This release has `check-config`; `run`, `status`, `admin-request` and
//! `token` follow with the proxy and the admin API (DESIGN §5).

mod check_config;

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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VACANCYD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config, no_sample } => {
            check_config::run(config.as_deref(), !no_sample)
        }
    }
}
