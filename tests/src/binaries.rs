//! The workspace binaries the behaviour tests start, built by the tests.
//!
//! Cargo hands `CARGO_BIN_EXE_<name>` only to the tests of the package that
//! owns the binary, and this package owns none of them. So each test process
//! builds vacancyd itself, once, the first time a test asks for it:
//! `cargo build -p vacancy-cli --bin vacancyd` in the profile and target
//! directory of the running test binary. The build runs at every test
//! process's start, so the binary is never stale, and it is a no-op when it is
//! fresh. It cannot deadlock: cargo releases the build directory's lock before
//! it runs the tests (another cargo in the same target directory makes this
//! build wait its turn, no more).
//!
//! The vacancyd is built with NVML when this package's `nvml` feature is on,
//! as `--all-features` builds the rest of the workspace. Cross builds
//! (`<target>/<triple>/<profile>/`) are not handled.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::SupportError;
use crate::error::tail_lines;

/// The path of vacancyd built from this checkout, built on first use.
///
/// It stands where tests of vacancy-cli used `env!("CARGO_BIN_EXE_vacancyd")`.
///
/// # Panics
///
/// If the build fails (the test cannot run without it): the message is
/// cargo's output.
pub fn vacancyd() -> &'static Path {
    static VACANCYD: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = VACANCYD.get_or_init(|| {
        build_bin(
            "vacancy-cli",
            "vacancyd",
            cfg!(feature = "nvml").then_some("nvml"),
        )
        .map_err(|e| e.to_string())
    });
    match built {
        Ok(path) => path,
        Err(why) => panic!("cannot build vacancyd for the tests: {why}"),
    }
}

/// Builds binary `bin` of workspace package `package` (with its feature
/// `feature`, if any) in the running test binary's profile and target
/// directory, and returns its path.
fn build_bin(package: &str, bin: &str, feature: Option<&str>) -> Result<PathBuf, SupportError> {
    let place = BuildPlace::of_current_exe()?;
    // Cargo sets CARGO for the processes it runs; the compile-time value
    // covers a test binary started by hand.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from(env!("CARGO")));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&place.target_dir)
        .args(["--profile", &place.profile, "-p", package, "--bin", bin]);
    if let Some(feature) = feature {
        cmd.args(["--features", &format!("{package}/{feature}")]);
    }
    let what = format!("{} build -p {package} --bin {bin}", cargo.to_string_lossy());
    let out = cmd
        .output()
        .map_err(|e| SupportError::io(format!("run {what}"), e))?;
    if !out.status.success() {
        let mut tail = String::from_utf8_lossy(&out.stdout).into_owned();
        tail.push_str(&String::from_utf8_lossy(&out.stderr));
        return Err(SupportError::Command {
            what,
            status: out.status.to_string(),
            tail: tail_lines(&tail, 40),
        });
    }
    Ok(place.profile_dir.join(bin))
}

/// Where the running test binary was built: `<target>/<profile dir>/deps/`.
struct BuildPlace {
    target_dir: PathBuf,
    profile_dir: PathBuf,
    /// The cargo profile whose output lands in `profile_dir`.
    profile: String,
}

impl BuildPlace {
    fn of_current_exe() -> Result<Self, SupportError> {
        let exe = std::env::current_exe()
            .map_err(|e| SupportError::io("find the running test binary".to_string(), e))?;
        let invalid = || SupportError::Invalid {
            what: "test binary location".to_string(),
            message: format!(
                "{} is not in <target>/<profile>/deps/, where cargo puts test binaries",
                exe.display()
            ),
        };
        let deps = exe.parent().ok_or_else(invalid)?;
        if deps.file_name() != Some("deps".as_ref()) {
            return Err(invalid());
        }
        let profile_dir = deps.parent().ok_or_else(invalid)?;
        let target_dir = profile_dir.parent().ok_or_else(invalid)?;
        let dir_name = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(invalid)?;
        // `dev` and `test` build into debug/, `release` and `bench` into
        // release/, a custom profile into its own name.
        let profile = match dir_name {
            "debug" => "dev",
            other => other,
        };
        Ok(Self {
            target_dir: target_dir.to_path_buf(),
            profile_dir: profile_dir.to_path_buf(),
            profile: profile.to_string(),
        })
    }
}
