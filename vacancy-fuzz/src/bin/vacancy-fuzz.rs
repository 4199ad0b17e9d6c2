//! One fuzz input on stdin, checked by the target named first:
//! `vacancy-fuzz TARGET < input`. AFL++ runs it (`scripts/fuzz`); a broken
//! invariant panics, which AFL++ records as a crash.

use std::io::Read;

fn main() {
    // A broken invariant must end the process by a signal, which is what
    // AFL++ counts as a crash (an unwinding panic only exits with 101).
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{info}");
        std::process::abort();
    }));
    let Some(target) = std::env::args().nth(1) else {
        eprintln!(
            "usage: vacancy-fuzz TARGET < input; targets: {}",
            vacancy_fuzz::TARGETS.join(", ")
        );
        std::process::exit(2);
    };
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("vacancy-fuzz: cannot read stdin: {e}");
        std::process::exit(2);
    }
    if !vacancy_fuzz::run(&target, &input) {
        eprintln!(
            "vacancy-fuzz: unknown target {target}; targets: {}",
            vacancy_fuzz::TARGETS.join(", ")
        );
        std::process::exit(2);
    }
}
