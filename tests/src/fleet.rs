//! A fleet of lenders behind HAProxy, as `scripts/fleet-demo` starts it: the
//! shared setup of the fleet test and the fleet benchmark.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::SupportError;
use crate::http::http_request;
use crate::process::ManagedProcess;

/// How long [`FleetDemo::start`] waits for the fleet.
pub const FLEET_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The repository's `scripts/fleet-demo`.
pub fn fleet_demo_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet-demo")
}

/// The HAProxy configuration the demo runs, `docs/fleet/haproxy.cfg` (the
/// one docs/fleet.md shows).
pub fn fleet_haproxy_cfg() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/fleet/haproxy.cfg")
}

/// `scripts/fleet-demo` running: HAProxy in front of one vacancyd per
/// upstream given (at most three), on loopback. Dropping it stops the
/// script with SIGTERM, which stops HAProxy and the lenders (they also die
/// with the script if it is killed).
#[derive(Debug)]
pub struct FleetDemo {
    process: ManagedProcess,
    env: HashMap<String, String>,
    _dir: tempfile::TempDir,
}

impl FleetDemo {
    /// Runs the demo with `vacancyd` (a built binary), the lenders' `adapter`
    /// (`llamacpp` or `openai`) and one lender per URL in `upstreams`; waits
    /// until it writes `fleet.env`, i.e. HAProxy's checks see every lender up.
    pub fn start(
        vacancyd: &Path,
        adapter: &str,
        upstreams: &[String],
    ) -> Result<Self, SupportError> {
        let ok = Command::new("haproxy")
            .arg("-v")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Err(SupportError::Invalid {
                what: "haproxy".into(),
                message: "HAProxy is not installed: apt-get install haproxy (scripts/test does)"
                    .into(),
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("vacancy-fleet-")
            .tempdir()
            .map_err(|e| SupportError::io("fleet: create its directory", e))?;
        let fleet_dir = dir.path().join("fleet");
        let mut cmd = Command::new("bash");
        cmd.arg(fleet_demo_script())
            .arg("--adapter")
            .arg(adapter)
            .arg("--dir")
            .arg(&fleet_dir)
            .args(upstreams)
            .env("VACANCYD", vacancyd);
        let mut process = ManagedProcess::spawn("fleet-demo", cmd)?;
        let env_file = fleet_dir.join("fleet.env");
        let started = Instant::now();
        while !env_file.exists() {
            if let Some(status) = process.exit_status() {
                return Err(SupportError::Exited {
                    name: "fleet-demo".into(),
                    status: status.to_string(),
                    waiting_for: "the fleet to come up".into(),
                    tail: process.log_tail(60),
                });
            }
            if started.elapsed() > FLEET_READY_TIMEOUT {
                return Err(SupportError::Timeout {
                    what: "the fleet to come up (fleet.env)".into(),
                    after: FLEET_READY_TIMEOUT,
                    tail: process.log_tail(60),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&env_file)
            .map_err(|e| SupportError::io(format!("read {}", env_file.display()), e))?;
        let env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(Self {
            process,
            env,
            _dir: dir,
        })
    }

    /// A value of `fleet.env` (`FLEET_URL`, `LENDER1_CONTROL`, `OWNER_TOKEN`, ...).
    pub fn var(&self, name: &str) -> Result<&str, SupportError> {
        self.env
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| SupportError::Invalid {
                what: "fleet.env".into(),
                message: format!("no {name}"),
            })
    }

    /// HAProxy's borrower address followed by `path`.
    pub fn url(&self, path: &str) -> Result<String, SupportError> {
        Ok(format!("{}{path}", self.var("FLEET_URL")?))
    }

    /// Lender `n`'s (1-based) control listener, `http://127.0.0.1:PORT`.
    pub fn control(&self, n: usize) -> Result<&str, SupportError> {
        self.var(&format!("LENDER{n}_CONTROL"))
    }

    /// Sets lender `n`'s owner present or away, as its owner would.
    pub async fn presence(&self, n: usize, present: bool) -> Result<(), SupportError> {
        let url = format!("{}/admin/owner", self.control(n)?);
        let bearer = format!("Bearer {}", self.var("OWNER_TOKEN")?);
        let r = http_request(
            "POST",
            &url,
            &[
                ("content-type", "application/json"),
                ("authorization", &bearer),
                ("vacancy-intent", "presence"),
            ],
            format!(r#"{{"present": {present}}}"#).into_bytes(),
        )
        .await?;
        if r.status != 200 {
            return Err(SupportError::http(
                "POST",
                &url,
                format!("{} {}", r.status, r.text()),
            ));
        }
        Ok(())
    }

    /// HAProxy's stats CSV rows of backend `llama` by server name
    /// (`lender1`..`lender3`, `BACKEND`), each split into its fields.
    pub async fn stats(&self) -> Result<HashMap<String, Vec<String>>, SupportError> {
        let url = format!("{};csv", self.var("FLEET_STATS_URL")?);
        let csv = http_request("GET", &url, &[], Vec::new()).await?.text();
        Ok(csv
            .lines()
            .map(|l| l.split(',').map(str::to_owned).collect::<Vec<_>>())
            .filter(|f| f.first().is_some_and(|p| p == "llama") && f.len() > STATUS)
            .map(|f| (f[1].clone(), f))
            .collect())
    }

    /// What HAProxy's checks say of `server` now: `UP`, `DOWN`, ...
    pub async fn server_status(&self, server: &str) -> Result<String, SupportError> {
        Ok(self
            .stats()
            .await?
            .get(server)
            .map(|f| f[STATUS].clone())
            .unwrap_or_default())
    }

    /// The script's output so far (its own lines; HAProxy's and each
    /// lender's logs are files in its directory).
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// The `status` field of HAProxy's stats CSV (0-based).
const STATUS: usize = 17;

/// The `wretr` (retries) field of HAProxy's stats CSV (0-based).
pub const STATS_RETRIES: usize = 15;

/// The `wredis` (redispatches) field of HAProxy's stats CSV (0-based).
pub const STATS_REDISPATCHES: usize = 16;

impl Drop for FleetDemo {
    fn drop(&mut self) {
        // The script's trap stops HAProxy and the lenders.
        let _ = self.process.terminate(Duration::from_secs(10));
    }
}
