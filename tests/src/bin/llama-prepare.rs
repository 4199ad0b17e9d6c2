//! `llama-prepare [--layers N] [--embd N] [--seed N]`: make sure the cached
//! llama venv (PyPI `xllamacpp`) and a tiny generated model exist, and print
//! what a program needs to start llama-server itself, as one JSON object:
//! `{"python": ..., "server_script": ..., "model": ...}`. For tests outside
//! Rust (vacancy-py's slot manager test), so they share the harness's cache
//! and its locking instead of building their own.

use std::process::ExitCode;

use vacancy_test_support::{LLAMA_PACKAGES, LLAMA_VENV, PythonVenv, TinyModel};

fn parse(args: &[String]) -> Result<TinyModel, String> {
    let mut model = TinyModel::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag.as_str() {
            "--layers" => model.layers = u32::try_from(n(value)?).map_err(|e| e.to_string())?,
            "--embd" => model.embd = u32::try_from(n(value)?).map_err(|e| e.to_string())?,
            "--seed" => model.seed = n(value)?,
            other => {
                return Err(format!(
                    "unknown option {other:?}; known: --layers, --embd, --seed"
                ));
            }
        }
    }
    Ok(model)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let prepared = parse(&args).and_then(|model| {
        let venv = PythonVenv::ensure(LLAMA_VENV, LLAMA_PACKAGES).map_err(|e| e.to_string())?;
        let path = model.ensure().map_err(|e| e.to_string())?;
        Ok(serde_json::json!({
            "python": PythonVenv::python(&venv),
            "server_script": std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/llama_server.py"),
            "model": path,
        }))
    });
    match prepared {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llama-prepare: {e}");
            ExitCode::FAILURE
        }
    }
}
