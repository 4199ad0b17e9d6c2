//! `vacancyd check-config` run as a real process.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::{Command, Output};

fn check_config(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vacancyd"))
        .arg("check-config")
        .args(args)
        .output()
        .expect("vacancyd runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_example_configuration_is_valid_once_its_token_is_the_operators() {
    // Issue 30 item 4: as shipped, the example's token placeholder is its
    // one problem; with a hash of the operator's own, it is valid.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/vacancyd.toml");
    let out = check_config(&["--config", example.to_str().unwrap(), "--no-sample"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("1 problem found"), "{err}");
    assert!(
        err.contains("placeholder of examples/vacancyd.toml"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("vacancyd.toml");
    std::fs::write(
        &own,
        std::fs::read_to_string(&example)
            .unwrap()
            .replace(vacancy::config::EXAMPLE_TOKEN_PLACEHOLDER, &"5e".repeat(32)),
    )
    .unwrap();
    let out = check_config(&["--config", own.to_str().unwrap(), "--no-sample"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok: "), "{}", text(&out.stdout));
}

#[test]
fn without_a_file_the_embedded_default_is_checked() {
    let out = check_config(&[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("<embedded default>"));
}

#[test]
fn every_problem_is_listed_at_once_with_its_line_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(
        &path,
        r#"[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/nonexistent.json"

[[upstream]]
name = "native"
adapter = "ollama"
listen = "127.0.0.1:11435"
target = "http://localhost:11434"
resource = "gpu0"
also_requires = ["ram"]

[[upstream]]
name = "compat"
adapter = "openai"
listen = "127.0.0.1:11435"
target = "http://127.0.0.1:11434/v1"
resource = "gpu0"
owner_scope = "resource"
"#,
    )
    .unwrap();
    let out = check_config(&["--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    for expected in [
        "line 13: upstream[0] (\"native\").also_requires: unknown resource \"ram\"",
        "line 18: upstream[1] (\"compat\").listen",
        "line 20: upstream[1] (\"compat\").resource",
        "CFG-01",
        "line 21: upstream[1] (\"compat\").owner_scope",
        "SCOPE-10",
        "4 problems found",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}

// Issue 14 item 11: an unknown key does not hide the semantic problems; one
// run lists them all, each with its line.
#[test]
fn an_unknown_key_does_not_hide_the_semantic_problems() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(
        &path,
        r#"[server]
lisen = "127.0.0.1:7480"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/nonexistent.json"

[[upstream]]
name = "native"
adapter = "ollama"
listen = "127.0.0.1:11435"
target = "http://localhost:11434"
resource = "gpu0"
also_requires = ["ram"]

[[upstream]]
name = "compat"
adapter = "openai"
listen = "127.0.0.1:11436"
target = "127.0.0.1:11434/v1"
resource = "gpu0"
colour = "blue"
"#,
    )
    .unwrap();
    let out = check_config(&["--config", path.to_str().unwrap(), "--no-sample"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    for expected in [
        "line 2: server.lisen: unknown key (did you mean \"listen\"?)",
        "line 16: upstream[0] (\"native\").also_requires: unknown resource \"ram\"",
        "line 22: upstream[1] (\"compat\").target: ",
        "line 24: upstream[1] (\"compat\").colour: unknown key",
        "4 problems found",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}

// Issue 14 item 11: a file that is not UTF-8 is named with the offset of its
// first byte that is not.
#[test]
fn a_file_that_is_not_utf8_names_the_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, b"# owner: Ren\xe9e\n[server]\n").unwrap();
    let out = check_config(&["--config", path.to_str().unwrap(), "--no-sample"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}: line 1: the configuration file is not UTF-8 text: the byte at offset 12 (0xe9)",
            path.display()
        )),
        "{err}"
    );
}

#[test]
fn a_reserve_above_the_total_is_a_warning_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let sample = dir.path().join("gpu.json");
    std::fs::write(&sample, r#"{"free_mib": 900, "total_mib": 1000}"#).unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(
        &path,
        format!(
            "[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nsampler = \"file\"\npath = {:?}\nreserve_mib = 2048\n",
            sample.to_str().unwrap()
        ),
    )
    .unwrap();
    let out = check_config(&["--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("reserve_mib = 2048 is larger than its total of 1000 MiB"),
        "{stdout}"
    );
}

#[test]
fn an_unreadable_sampler_is_a_warning_naming_capacity_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(
        &path,
        "[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nsampler = \"file\"\npath = \"/nonexistent/gpu.json\"\n",
    )
    .unwrap();
    let out = check_config(&["--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("/nonexistent/gpu.json"), "{stdout}");
    assert!(stdout.contains("capacity_unknown"), "{stdout}");
}

#[test]
fn a_missing_file_is_named() {
    let out = check_config(&["--config", "/nonexistent/vacancyd.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/vacancyd.toml"));
}

/// A configuration with GPU pressure on one NVIDIA GPU, its recovery directory in `dir`.
fn pressure_config(dir: &Path) -> std::path::PathBuf {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    // A recovery directory must be private (REC rules), as vacancyd checks.
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let path = dir.join("vacancyd.toml");
    std::fs::write(
        &path,
        format!(
            r#"[server]
admission_state_dir = "{}"

[owner.gpu_pressure]
enabled = true

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "nvml"

[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:18081"
target = "http://127.0.0.1:18080"
resource = "gpu0"
"#,
            state.display()
        ),
    )
    .unwrap();
    path
}

// PRES-03: a GPU without a baseline reads as uncalibrated, which refuses and
// reclaims its work; check-config says so before the daemon does.
#[test]
fn a_missing_pressure_calibration_is_a_warning_naming_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let path = pressure_config(dir.path());
    let out = check_config(&["--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for attendance in ["attended", "unattended"] {
        assert!(
            stdout.contains(&format!("GPU pressure has no {attendance} baseline"))
                && stdout.contains(&format!(
                    "vacancyd calibrate-pressure --resource gpu0 --{attendance}`"
                )),
            "{stdout}"
        );
    }

    // With the unattended baseline saved, only the attended one is missing.
    let calibration = dir.path().join("state/pressure-calibration.json");
    std::fs::write(
        &calibration,
        r#"{"version": 1, "gpus": {"gpu0": {"attended": null, "unattended": {"util_pct": 3, "memory_mib": 200}}}}"#,
    )
    .unwrap();
    // Private, as calibrate-pressure saves it (REC-22, issue 14 item 16).
    std::fs::set_permissions(
        &calibration,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let stdout = text(&check_config(&["--config", path.to_str().unwrap()]).stdout);
    assert!(stdout.contains("no attended baseline"), "{stdout}");
    assert!(!stdout.contains("no unattended baseline"), "{stdout}");

    // A damaged file is named; nothing is judged from it.
    std::fs::write(&calibration, "{oops").unwrap();
    let stdout = text(&check_config(&["--config", path.to_str().unwrap()]).stdout);
    assert!(
        stdout.contains("pressure-calibration.json") && stdout.contains("uncalibrated"),
        "{stdout}"
    );

    // Without pressure, calibration does not matter.
    let off = std::fs::read_to_string(&path)
        .unwrap()
        .replace("enabled = true", "enabled = false");
    std::fs::write(&path, off).unwrap();
    let stdout = text(&check_config(&["--config", path.to_str().unwrap()]).stdout);
    assert!(!stdout.contains("calibrat"), "{stdout}");
}

// REC-18, REC-21: checking a configuration only looks; it never creates the
// recovery directory (as whatever account runs check-config).
#[test]
fn checking_the_pressure_calibration_creates_no_recovery_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = pressure_config(dir.path());
    let written = std::fs::read_to_string(&path).unwrap();
    let default_location = written
        .lines()
        .filter(|l| !l.starts_with("admission_state_dir"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&path, default_location).unwrap();
    let out = check_config(&["--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text_of(&out));
    let admission = dir.path().join("vacancyd.admission");
    assert!(
        text(&out.stdout).contains(&format!(
            "no attended baseline in {}",
            admission.join("pressure-calibration.json").display()
        )),
        "{}",
        text_of(&out)
    );
    assert!(
        !admission.exists(),
        "check-config created {}",
        admission.display()
    );
}

fn text_of(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

#[test]
fn an_unregistered_adapter_kind_is_named_with_its_line_and_the_registered_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(
        &path,
        r#"[[resource]]
name = "ram"

[[upstream]]
name = "v"
adapter = "vllm"
listen = "127.0.0.1:18000"
target = "http://127.0.0.1:8000"
resource = "ram"

[[upstream]]
name = "o"
adapter = "ollama"
listen = "127.0.0.1:18001"
target = "http://127.0.0.1:11434"
resource = "ram"
[upstream.adapter_settings]
num_ctx = 4096
"#,
    )
    .unwrap();
    let out = check_config(&["--config", path.to_str().unwrap(), "--no-sample"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "line 6: upstream[0] (\"v\").adapter: unknown adapter \"vllm\"; registered adapters: \"ollama\", \"comfyui\", \"llamacpp\", \"openai\", \"chatterbox\""
        ),
        "{err}"
    );
    // A built-in kind checks its own settings through the same door: it takes none.
    assert!(
        err.contains("line 18: upstream[1] (\"o\").adapter_settings.num_ctx: adapter \"ollama\" takes no settings"),
        "{err}"
    );
    assert!(err.contains("2 problems found"), "{err}");
}

#[test]
fn calibrate_pressure_loads_the_configuration_as_run_does() {
    // Issue 30 item 13: the adapter registry checks the kinds, so a
    // configuration `run` refuses is refused here too, with the same words,
    // before any GPU is touched.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(
        &path,
        r#"[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "nvml"
device = "0"

[[upstream]]
name = "llm"
adapter = "olama"
listen = "127.0.0.1:11435"
target = "http://127.0.0.1:11434"
resource = "gpu0"
"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vacancyd"))
        .args(["calibrate-pressure", "--config", path.to_str().unwrap()])
        .args(["--resource", "gpu0", "--attended", "--seconds", "1"])
        .args(["--state-dir", dir.path().to_str().unwrap()])
        .output()
        .expect("vacancyd runs");
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("unknown adapter \"olama\""), "{err}");
    assert!(err.contains("did you mean \"ollama\"?"), "{err}");
}
