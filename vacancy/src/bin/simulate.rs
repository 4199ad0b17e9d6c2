//! `vacancy-simulate [SEED] [STEPS]`: one deterministic simulation of a
//! lender (see `vacancy::simulation`); `scripts/simulate` runs it.
//!
//! `VACANCY_SIM_TRACE=1` prints every event as it happens. Prints what the run did and exits 0, or prints the broken invariant with
//! the last events and how to replay it, and exits 1.

use std::process::ExitCode;

use vacancy::simulation::{self, Mutation, Settings};

fn number(arg: Option<String>, what: &str, default: u64) -> Result<u64, String> {
    match arg {
        None => Ok(default),
        Some(s) => s
            .replace('_', "")
            .parse()
            .map_err(|_| format!("{what} must be a whole number, not {s:?}")),
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let parsed = number(args.next(), "SEED", 1)
        .and_then(|seed| number(args.next(), "STEPS", 10_000).map(|steps| (seed, steps)));
    let (seed, steps) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("vacancy-simulate: {e}\nusage: vacancy-simulate [SEED] [STEPS]");
            return ExitCode::from(2);
        }
    };
    match simulation::run(Settings {
        seed,
        steps,
        mutation: Mutation::None,
        verbose: std::env::var_os("VACANCY_SIM_TRACE").is_some(),
    }) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(violation) => {
            eprintln!("{violation}");
            ExitCode::FAILURE
        }
    }
}
