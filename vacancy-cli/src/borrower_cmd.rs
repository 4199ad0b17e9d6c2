//! `vacancyd borrower add|remove|list` (issue 34): the keys file edited in
//! place, comments kept, checked before it is written; a new key is printed
//! once and only its hash is stored. The running daemon picks the change up
//! within seconds (`borrowers::keys_loop`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use vacancy::auth::{hash_borrower_key, new_borrower_key};
use vacancy::config::{
    BorrowerEntry, BudgetEntry, Config, KeysFile, keys_file_with, keys_file_without,
};
use vacancy::engine::{BudgetPeriod, Priority};

/// Where the keys file is.
#[derive(Debug, Args)]
pub struct KeysFileArgs {
    /// The daemon's configuration: its `[borrowers] keys_file` is edited.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The keys file itself (instead of --config).
    #[arg(long, conflicts_with = "config")]
    keys_file: Option<PathBuf>,
}

/// The borrower subcommands.
#[derive(Debug, Subcommand)]
pub enum BorrowerCommand {
    /// Add a borrower and print its key once (only its hash is stored).
    Add {
        /// Its name: up to 64 letters, digits, '-', '_' or '.'.
        name: String,
        /// interactive (ahead in line) | batch.
        #[arg(long, default_value = "interactive")]
        priority: String,
        /// Its weight in the line's turns, 1 to 1000.
        #[arg(long, default_value_t = 1)]
        share: u32,
        /// At most this many jobs at once.
        #[arg(long)]
        max_running: Option<u32>,
        /// At most this many requests waiting at once.
        #[arg(long)]
        max_waiting: Option<u32>,
        /// A budget of reservation time, KIND:PERIOD:SECONDS (gpu:day:3600,
        /// memory:week:36000); repeat for more.
        #[arg(long)]
        budget: Vec<String>,
        #[command(flatten)]
        file: KeysFileArgs,
    },
    /// Remove a borrower: its key stops working within seconds; its running
    /// jobs run to their end and are accounted to it.
    Remove {
        /// Its name.
        name: String,
        #[command(flatten)]
        file: KeysFileArgs,
    },
    /// List the borrowers: name, class, share, limits and budgets (never keys).
    List {
        #[command(flatten)]
        file: KeysFileArgs,
    },
}

/// Run one borrower subcommand.
pub fn run(command: &BorrowerCommand) -> ExitCode {
    match dispatch(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vacancyd borrower: {e}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(command: &BorrowerCommand) -> Result<(), String> {
    match command {
        BorrowerCommand::Add {
            name,
            priority,
            share,
            max_running,
            max_waiting,
            budget,
            file,
        } => {
            let path = keys_path(file)?;
            let priority: Priority = priority.parse().map_err(|e| format!("--priority: {e}"))?;
            let budgets = budget
                .iter()
                .map(|b| parse_budget(b))
                .collect::<Result<Vec<_>, _>>()?;
            let key = new_borrower_key()
                .map_err(|e| format!("the system's random source failed: {e}"))?;
            let entry = BorrowerEntry {
                name: name.clone(),
                key_sha256: hash_borrower_key(&key),
                priority,
                share: *share,
                max_running: *max_running,
                max_waiting: *max_waiting,
                budgets,
            };
            let text = read_keys(&path)?;
            let out = keys_file_with(&text, &entry).map_err(|e| {
                format!(
                    "borrower {name:?} was not added, {} is unchanged:\n{e}",
                    path.display()
                )
            })?;
            write_keys(&path, &out)?;
            println!("{key}");
            eprintln!(
                "added borrower {name:?} to {}: the line above is its key, shown this once; give it to {name} (their client's api_key, or Authorization: Bearer <key>)",
                path.display()
            );
            Ok(())
        }
        BorrowerCommand::Remove { name, file } => {
            let path = keys_path(file)?;
            let text = read_keys(&path)?;
            match keys_file_without(&text, name).map_err(|e| e.to_string())? {
                Some(out) => {
                    write_keys(&path, &out)?;
                    eprintln!("removed borrower {name:?} from {}", path.display());
                    Ok(())
                }
                None => Err(format!("{} has no borrower {name:?}", path.display())),
            }
        }
        BorrowerCommand::List { file } => {
            let path = keys_path(file)?;
            let keys = KeysFile::load(&path).map_err(|e| e.to_string())?;
            if keys.borrowers.is_empty() {
                eprintln!("no borrowers in {}", path.display());
            }
            for b in &keys.borrowers {
                let limit = |n: Option<u32>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
                let budgets: Vec<String> = b
                    .budgets
                    .iter()
                    .map(|t| format!("{}:{}:{}", t.kind.as_str(), t.per.as_str(), t.seconds))
                    .collect();
                println!(
                    "{}\t{}\tshare {}\tmax_running {}\tmax_waiting {}\t{}",
                    b.name,
                    b.priority,
                    b.share,
                    limit(b.max_running),
                    limit(b.max_waiting),
                    budgets.join(" ")
                );
            }
            Ok(())
        }
    }
}

/// The keys file the arguments name.
fn keys_path(file: &KeysFileArgs) -> Result<PathBuf, String> {
    if let Some(p) = &file.keys_file {
        return Ok(p.clone());
    }
    let Some(config_path) = &file.config else {
        return Err(
            "say which keys file: --config PATH (the daemon's configuration) or --keys-file PATH"
                .to_owned(),
        );
    };
    let loaded = Config::load(config_path).map_err(|e| e.to_string())?;
    let borrowers = loaded.config.borrowers.unwrap_or_else(|| {
        eprintln!(
            "note: {} has no [borrowers] table: the keys are written, but the daemon lends to anonymous borrowers until it has one",
            config_path.display()
        );
        vacancy::config::BorrowersConfig::default()
    });
    Ok(crate::borrowers::keys_path(&borrowers, Some(config_path)))
}

/// `KIND:PERIOD:SECONDS`.
fn parse_budget(text: &str) -> Result<BudgetEntry, String> {
    let bad = || format!("--budget {text:?}: expected KIND:PERIOD:SECONDS, e.g. gpu:day:3600");
    let mut parts = text.split(':');
    let (Some(kind), Some(per), Some(seconds), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let kind = match kind {
        "gpu" => vacancy::ResourceKind::Gpu,
        "memory" => vacancy::ResourceKind::Memory,
        "cpu" => vacancy::ResourceKind::Cpu,
        _ => return Err(format!("--budget {text:?}: the kind is gpu, memory or cpu")),
    };
    let per = match per {
        "day" => BudgetPeriod::Day,
        "week" => BudgetPeriod::Week,
        _ => return Err(format!("--budget {text:?}: the period is day or week")),
    };
    let seconds = seconds.parse().map_err(|_| bad())?;
    Ok(BudgetEntry { kind, per, seconds })
}

/// The keys file's text; empty if it does not exist yet.
fn read_keys(path: &Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Replace the keys file as the ledger replaces its files, so a crash
/// leaves the old file or the new one.
fn write_keys(path: &Path, text: &str) -> Result<(), String> {
    vacancy::ledger::write_atomically(&vacancy::ledger::RealDisk, path, text.as_bytes())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn budgets_are_kind_period_seconds() {
        let b = parse_budget("gpu:week:600").unwrap();
        assert_eq!(
            (b.kind, b.per, b.seconds),
            (vacancy::ResourceKind::Gpu, BudgetPeriod::Week, 600)
        );
        for bad in [
            "gpu:day",
            "disk:day:1",
            "gpu:month:1",
            "gpu:day:x",
            "gpu:day:1:2",
        ] {
            assert!(parse_budget(bad).is_err(), "{bad}");
        }
    }
}
