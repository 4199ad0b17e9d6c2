//! Instructions per proxied read, counted by callgrind: a proxy's own work,
//! which a shared and noisy machine cannot blur as it blurs requests per
//! second (issue 31: the same build measured 0.96× and 1.03× nginx's reads
//! in two runs, while callgrind gives the same count to a few parts in ten
//! thousand). Counted only where valgrind is installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Reads counted, after a warm-up, over [`CONNECTIONS`] keep-alive
/// connections.
pub const READS: usize = 3000;
pub const CONNECTIONS: usize = 8;

/// Whether valgrind's callgrind and its `callgrind_control` are here.
pub fn available() -> bool {
    let runs = |tool: &str, arg: &str| {
        Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    runs("valgrind", "--version") && runs("callgrind_control", "--version")
}

/// `program` under callgrind, counting nothing until [`per_read`] turns it
/// on; its counts are written to `dir`.
pub fn under_callgrind(program: &Path, dir: &Path) -> Command {
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg("--instr-atstart=no")
        .arg(format!(
            "--callgrind-out-file={}/callgrind.%p",
            dir.display()
        ))
        .arg(program);
    cmd
}

/// Instructions per read of `url` by process `pid`, which runs under
/// callgrind writing to `dir`: a warm-up of a few seconds, then counting
/// on for [`READS`] reads, then the count. `None`, with the reason printed,
/// where a step failed.
pub fn per_read(pid: u32, url: &str, dir: &Path) -> Option<f64> {
    let script = dir.join("count.lua");
    // wrk stops a thread once it has read this many responses.
    std::fs::write(
        &script,
        "local n = 0\nlocal limit = tonumber(os.getenv(\"READS\"))\nfunction response()\n  n = n + 1\n  if n >= limit then wrk.thread:stop() end\nend\n",
    )
    .unwrap();
    let wrk = |seconds: u32, counted: bool| {
        let mut cmd = Command::new("wrk");
        cmd.arg("-t1")
            .arg(format!("-c{CONNECTIONS}"))
            .arg(format!("-d{seconds}s"));
        if counted {
            cmd.arg("-s").arg(&script).env("READS", READS.to_string());
        }
        cmd.arg(url).output()
    };
    let control = |what: &str| {
        Command::new("callgrind_control")
            .arg(what)
            .arg(pid.to_string())
            .output()
            .is_ok_and(|o| o.status.success())
    };
    wrk(3, false).ok()?;
    if !control("--instr=on") {
        println!("instructions: callgrind_control could not turn counting on for pid {pid}");
        return None;
    }
    let out = wrk(30, true).ok()?;
    let reads: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())?;
    if !control("--dump") {
        println!("instructions: callgrind_control could not take the count of pid {pid}");
        return None;
    }
    let counted = dumped_total(dir, pid, Duration::from_secs(30))?;
    Some(counted as f64 / reads.max(1) as f64)
}

/// The instructions in `pid`'s dump (every thread's), once it is written.
fn dumped_total(dir: &Path, pid: u32, within: Duration) -> Option<u64> {
    let deadline = Instant::now() + within;
    loop {
        for path in dumps(dir, pid) {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains("Trigger: dump")
                && let Some(total) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("totals:"))
                    .and_then(|t| t.trim().parse().ok())
            {
                return Some(total);
            }
        }
        if Instant::now() > deadline {
            println!("instructions: no count from pid {pid} in {}", dir.display());
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `pid`'s callgrind files in `dir`.
fn dumps(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("callgrind.{pid}");
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}
