//! `vacancyd usage`: the owner's record summed by borrower, day or resource.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use thiserror::Error;
use vacancy::ledger::{LocationInput, recovery_path};
use vacancy::registry::AdapterRegistry;

use super::db::{UsageDb, UsageError, path_beside};
use super::format;
use super::report::{By, usage, utc_day};
use super::since::Since;

/// The command line of `vacancyd usage`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the report starts: Nh, Nd or Nw back from now (12h, 7d, 2w), or
    /// a UTC date YYYY-MM-DD.
    #[arg(long, default_value = "7d")]
    pub since: Since,
    /// Group by borrower | day | resource. A reservation counts in the UTC
    /// day it was released.
    #[arg(long, default_value = "borrower")]
    pub by: By,
    /// Print JSON: {"since", "since_unix_ms", "by", "rows"}.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (RFC 4180) with a header line.
    #[arg(long)]
    pub csv: bool,
    /// The database; without it, usage.sqlite in the directory holding the
    /// recovery directory the daemon uses with --config (as `run` finds it).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// The daemon's configuration file, to find the database; without it,
    /// the embedded default's location.
    #[arg(long, conflicts_with = "db")]
    pub config: Option<PathBuf>,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Table,
    Json,
    Csv,
}

/// Why `vacancyd usage` printed no report.
#[derive(Debug, Error)]
enum CommandError {
    /// The configuration cannot be loaded.
    #[error("{0}")]
    Config(String),
    /// The recovery directory cannot be located.
    #[error("cannot find the daemon's state directory: {0}")]
    Location(#[from] vacancy::ledger::LedgerError),
    /// The database cannot be read.
    #[error(transparent)]
    Usage(#[from] UsageError),
}

/// A report and what to say about it on stderr.
#[derive(Debug)]
struct Rendered {
    out: String,
    notice: Option<String>,
}

/// Run the command: exit 0 with the report (or with nothing recorded yet).
pub fn run(args: &Args, registry: &AdapterRegistry) -> ExitCode {
    let format = if args.json {
        Format::Json
    } else if args.csv {
        Format::Csv
    } else {
        Format::Table
    };
    let since = args.since.start_unix_ms(vacancy::time::unix_ms_now());
    let result = match &args.db {
        Some(p) => Ok(p.clone()),
        None => default_path(args.config.as_deref(), registry),
    }
    .and_then(|path| render(&path, since, args.by, format).map_err(CommandError::from));
    match result {
        Ok(r) => {
            if let Some(n) = r.notice {
                eprintln!("vacancyd usage: {n}");
            }
            print!("{}", r.out);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vacancyd usage: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `usage.sqlite` beside the recovery directory the daemon finds with
/// `config` (without creating or checking anything, as check-config does).
fn default_path(
    config: Option<&Path>,
    registry: &AdapterRegistry,
) -> Result<PathBuf, CommandError> {
    let loaded = crate::check_config::load(config, registry)
        .map_err(|e| CommandError::Config(e.to_string()))?;
    let input = LocationInput::from_env(config, &loaded.config.server.admission_state_dir);
    let recovery = recovery_path(&input)?;
    Ok(match &loaded.config.borrowers {
        Some(b) => crate::borrowers::usage_path(b, config, &recovery),
        None => path_beside(&recovery),
    })
}

/// The report of the database at `path`; a missing file is an empty report.
fn render(path: &Path, since: i64, by: By, format: Format) -> Result<Rendered, UsageError> {
    let (rows, notice) = if path.exists() {
        let db = UsageDb::open_read_only(path)?;
        let rows = usage(
            &db.reservations_since(since)?,
            &db.refusals_since(since)?,
            by,
        );
        (rows, None)
    } else {
        (
            Vec::new(),
            Some(format!("no usage recorded yet at {}", path.display())),
        )
    };
    let out = match format {
        Format::Json => {
            let v = format::json(&rows, since, by);
            format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
        }
        Format::Csv => format::csv(&rows, by),
        Format::Table if rows.is_empty() => String::new(),
        Format::Table => format::table(&rows, by),
    };
    let notice = notice.or_else(|| {
        (rows.is_empty() && format == Format::Table)
            .then(|| format!("nothing recorded since {}", utc_day(since)))
    });
    Ok(Rendered { out, notice })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // issue 34 item 4
    #[test]
    fn a_missing_database_says_nothing_is_recorded_and_prints_empty_rows_in_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        let r = render(&path, 0, By::Day, Format::Json).unwrap();
        assert!(
            r.notice
                .as_deref()
                .is_some_and(|n| n.starts_with("no usage recorded yet at")),
            "{:?}",
            r.notice
        );
        let v: serde_json::Value = serde_json::from_str(&r.out).unwrap();
        assert_eq!(v["rows"], serde_json::json!([]));
        assert_eq!(v["by"], "day");
        // Reading never creates the file.
        assert!(!path.exists());
    }

    // issue 34 item 4
    #[test]
    fn the_default_database_is_beside_the_recovery_directory() {
        let p = path_beside(Path::new("/etc/vacancyd/vacancyd.admission"));
        assert_eq!(p, Path::new("/etc/vacancyd/usage.sqlite"));
    }
}
