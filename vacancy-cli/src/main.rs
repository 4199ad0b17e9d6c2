//! `vacancyd`: the reference daemon and CLI of vacancy, with the five
//! built-in adapter kinds.

use std::process::ExitCode;

fn main() -> ExitCode {
    vacancy_cli::Vacancyd::with_builtin_adapters().main()
}
