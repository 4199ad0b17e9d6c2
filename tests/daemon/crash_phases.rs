//! kill -9 in every phase (issue 18 item 4): the crash campaign of
//! `crash.rs`, extended to each phase of the daemon's life. One vacancyd lends
//! three upstreams: a real llama-server (through a counting shim, on `gpu0`,
//! cancelled on owner return), a real Ollama 0.5.4 (through a counting shim, on
//! `gpu1`, drained for 1 s on owner return, then unloaded) and a ComfyUI
//! emulator (on `gpu2`; the emulator, because only it can delay its reply to a
//! submission on demand, which is what lands a kill inside that exchange).
//! Round by round it is killed with SIGKILL
//!
//! - `forwarding`: a non-streamed completion in flight;
//! - `streaming`: a streamed completion after its first chunk;
//! - `comfy-submission`: inside the `/prompt` exchange (the ledger write, the
//!   forward, the emulator's delayed reply, the handle rewrite);
//! - `comfy-tracking`: while the accepted prompt runs;
//! - `reclaim`: after the owner's return, during the llama cancel, the Ollama
//!   drain and the unload that follows it;
//! - `admin-release`: while administrators' releases of held work are answered;
//! - `compaction`: when the first admission after a restart compacts a
//!   journal padded with dead lines;
//! - `startup`: three times while the daemon is starting on a journal with
//!   held work, before a start that is let finish.
//!
//! After each restart it asserts: startup never fails; no entry or upstream
//! handle appears twice; every restored entry is held; every request an
//! upstream received and did not finish is held (llama, Ollama: the shims'
//! unfinished records; ComfyUI: the prompts it had queued or running at the
//! kill and has not finished since, each by its handle); no entry whose
//! release an administrator saw acknowledged comes back; held work planted in
//! the journal survives compactions and startups. Then the held entries are
//! released as an administrator so the next round tests something.
//!
//! `VACANCY_CRASH_KILLS` sets the number of rounds (default 40; a startup round
//! kills four times);
//! `VACANCY_CRASH_SEED` the seed of the kill points.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{JSON, Rng, completion, write_capacity};
use serde_json::{Value, json};
use vacancy_test_support::ollama::modelfile;
use vacancy_test_support::{
    ComfyEmulator, ComfyEmulatorOptions, ComfyFaults, CountingShim, LlamaOptions, LlamaServer,
    ManagedProcess, OllamaRelease, OllamaServer, Record, TinyModel, free_port, http_request,
    http_stream, prompt_request, simple_workflow,
};

const ADMIN: &str = "crash-phases-admin-token";
const OWNER: &str = "crash-phases-owner-token";

/// How long each ComfyUI prompt runs in the emulator.
const COMFY_RUN: Duration = Duration::from_millis(900);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Forwarding,
    Streaming,
    ComfySubmission,
    ComfyTracking,
    Reclaim,
    AdminRelease,
    Compaction,
    Startup,
}

const PHASES: [Phase; 8] = [
    Phase::Forwarding,
    Phase::Streaming,
    Phase::ComfySubmission,
    Phase::ComfyTracking,
    Phase::Reclaim,
    Phase::AdminRelease,
    Phase::Compaction,
    Phase::Startup,
];

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Forwarding => "forwarding",
            Phase::Streaming => "streaming",
            Phase::ComfySubmission => "comfy-submission",
            Phase::ComfyTracking => "comfy-tracking",
            Phase::Reclaim => "reclaim",
            Phase::AdminRelease => "admin-release",
            Phase::Compaction => "compaction",
            Phase::Startup => "startup",
        }
    }
}

/// What one phase's kills landed on, for the report.
#[derive(Debug, Default)]
struct Tally {
    kills: usize,
    /// Kills with work running at an upstream (or, for the phases without
    /// borrowed work, inside what the phase names: a release not yet
    /// answered, a compaction's `.new` file on disk, a start not yet healthy).
    inside: usize,
    unfinished: usize,
    held: usize,
}

/// The daemon under test and everything it lends.
struct Rig {
    dir: tempfile::TempDir,
    config: PathBuf,
    control: String,
    llama_proxy: String,
    ollama_proxy: String,
    comfy_proxy: String,
    llama_shim: CountingShim,
    ollama_shim: CountingShim,
    comfy: ComfyEmulator,
    process: Option<ManagedProcess>,
    /// Entries whose administrator release was answered 200.
    released: BTreeSet<String>,
    /// Held entries the test wrote into the journal; they must survive.
    planted: BTreeSet<String>,
    /// Where the compaction rounds' kills landed.
    compaction_stages: BTreeMap<CompactionStage, usize>,
    /// The last killed daemons' logs.
    killed_logs: Vec<String>,
    _llama: LlamaServer,
    _ollama: OllamaServer,
}

fn resource(dir: &Path, name: &str) -> String {
    let path = dir.join(format!("{name}.json"));
    write_capacity(&path, 40_000, 64_000);
    format!(
        "[[resource]]\nname = \"{name}\"\nkind = \"gpu\"\nsampler = \"file\"\npath = \"{}\"\nreserve_mib = 1000\npoll_ms = 60000\nmax_sample_age_ms = 120000\n\n",
        path.display()
    )
}

fn upstream(name: &str, adapter: &str, port: u16, target: &str, res: &str, extra: &str) -> String {
    format!(
        "[[upstream]]\nname = \"{name}\"\nadapter = \"{adapter}\"\nlisten = \"127.0.0.1:{port}\"\ntarget = \"{target}\"\nresource = \"{res}\"\ndefault_min_free_mib = 1000\n{extra}\n\n"
    )
}

fn is_llama_work(r: &Record) -> bool {
    r.method == "POST" && r.path == "/completion"
}

/// Borrowers chat; the daemon's own unload is a `/api/generate`.
fn is_ollama_work(r: &Record) -> bool {
    r.method == "POST" && r.path == "/api/chat"
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn admit_line(id: &str, upstream: &str, res: &str, completion: &str) -> String {
    format!(
        "{{\"v\":1,\"op\":\"admit\",\"id\":\"{id}\",\"upstream\":\"{upstream}\",\"model\":null,\"resources\":[\"{res}\"],\"completion\":\"{completion}\",\"started_unix_ms\":{},\"upstream_ref\":null}}\n",
        now_ms()
    )
}

impl Rig {
    fn start() -> Rig {
        let llama = LlamaServer::start(LlamaOptions {
            model: TinyModel {
                layers: 4,
                embd: 256,
                seed: 2,
            },
            ..LlamaOptions::default()
        })
        .unwrap();
        let llama_shim = CountingShim::start(llama.addr()).unwrap();
        let ollama = OllamaServer::start(OllamaRelease::V0_5_4).unwrap();
        let gguf = TinyModel::default().ensure().unwrap();
        ollama
            .create("tiny", &modelfile(&gguf, Some(2048)))
            .unwrap();
        let ollama_shim = CountingShim::start(ollama.addr()).unwrap();
        let comfy = ComfyEmulator::start(ComfyEmulatorOptions {
            run_time: COMFY_RUN,
            ..ComfyEmulatorOptions::default()
        })
        .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let control = free_port().unwrap();
        let ports = [
            free_port().unwrap(),
            free_port().unwrap(),
            free_port().unwrap(),
        ];
        let tokens = format!(
            "[[server.token]]\nname = \"ops\"\nscopes = [\"admin\"]\nsha256 = \"{}\"\n\n[[server.token]]\nname = \"desk\"\nscopes = [\"owner\"]\nsha256 = \"{}\"\n",
            vacancy::auth::hash_token(ADMIN),
            vacancy::auth::hash_token(OWNER)
        );
        let body = [
            resource(dir.path(), "gpu0"),
            resource(dir.path(), "gpu1"),
            resource(dir.path(), "gpu2"),
            upstream(
                "llama",
                "llamacpp",
                ports[0],
                &llama_shim.base_url(),
                "gpu0",
                "on_owner_return = \"cancel\"",
            ),
            upstream(
                "ollama",
                "ollama",
                ports[1],
                &ollama_shim.base_url(),
                "gpu1",
                "on_owner_return = \"drain\"\ndrain_timeout_s = 1",
            ),
            upstream("comfy", "comfyui", ports[2], &comfy.base_url(), "gpu2", ""),
        ]
        .concat();
        let config = dir.path().join("vacancyd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{control}\"\n{tokens}\n[owner]\npresence = \"manual\"\n\n{body}"
            ),
        )
        .unwrap();
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        Rig {
            config,
            control: url(control),
            llama_proxy: url(ports[0]),
            ollama_proxy: url(ports[1]),
            comfy_proxy: url(ports[2]),
            dir,
            llama_shim,
            ollama_shim,
            comfy,
            process: None,
            released: BTreeSet::new(),
            planted: BTreeSet::new(),
            compaction_stages: BTreeMap::new(),
            killed_logs: Vec::new(),
            _llama: llama,
            _ollama: ollama,
        }
    }

    fn journal(&self) -> PathBuf {
        self.dir
            .path()
            .join("vacancyd.admission")
            .join("journal.jsonl")
    }

    fn spawn(&self) -> ManagedProcess {
        let mut cmd = Command::new(vacancy_test_support::vacancyd());
        cmd.arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("VACANCYD_LOG", "info")
            .env(
                "VACANCYD_SERVICE_BASE",
                self.dir.path().join("service-base"),
            );
        ManagedProcess::spawn("vacancyd", cmd).unwrap()
    }

    /// Start the daemon and wait for it to answer; the owner is then set away.
    async fn up(&mut self, context: &str) {
        let mut process = self.spawn();
        if let Err(e) =
            process.wait_http_ok(&format!("{}/health", self.control), Duration::from_secs(30))
        {
            panic!("{context}: startup failed: {e}\n{}", process.log_tail(40));
        }
        self.process = Some(process);
        self.presence(false).await;
        self.wait_status(context, "the owner away", |s| s["owner"] == "away")
            .await;
    }

    fn kill(&mut self) {
        if let Some(p) = self.process.take() {
            self.killed(p);
        }
    }

    /// Stop the daemon as a service manager does (SIGTERM), so the journal
    /// can be written to: a kill may leave a complete compaction beside it
    /// that the next start would complete over what the test appended.
    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.terminate(Duration::from_secs(20)).unwrap();
        }
    }

    /// Kill `p`, keeping its log for a failure's report.
    fn killed(&mut self, mut p: ManagedProcess) {
        p.kill().unwrap();
        self.killed_logs.push(p.log_tail(30));
        if self.killed_logs.len() > 6 {
            self.killed_logs.remove(0);
        }
    }

    async fn presence(&self, present: bool) -> u16 {
        match http_request(
            "POST",
            &format!("{}/admin/owner", self.control),
            &[
                JSON,
                ("authorization", &format!("Bearer {OWNER}")),
                ("vacancy-intent", "presence"),
            ],
            json!({ "present": present }).to_string().into_bytes(),
        )
        .await
        {
            Ok(r) => r.status,
            Err(_) => 0,
        }
    }

    async fn status(&self) -> Value {
        http_request("GET", &format!("{}/status", self.control), &[], Vec::new())
            .await
            .unwrap()
            .json()
            .unwrap()
    }

    async fn wait_status(&self, context: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.status().await;
            if pred(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("{context}: timed out waiting for {what}: {s:#}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An administrator's release; `Some(status)` when it was answered.
    async fn release(control: String, id: String) -> Option<u16> {
        http_request(
            "POST",
            &format!("{control}/admin/work/{id}/release"),
            &[
                JSON,
                ("authorization", &format!("Bearer {ADMIN}")),
                ("vacancy-intent", "release_work"),
            ],
            br#"{"upstream_stopped": true}"#.to_vec(),
        )
        .await
        .ok()
        .map(|r| r.status)
    }

    /// Release every held entry, so the next round starts clean.
    async fn release_all(&mut self, context: &str) {
        let s = self.status().await;
        for w in s["work"].as_array().unwrap() {
            let id = w["id"].as_str().unwrap().to_owned();
            let answer = Self::release(self.control.clone(), id.clone()).await;
            assert_eq!(answer, Some(200), "{context}: release {id}");
            self.planted.remove(&id);
            self.released.insert(id);
        }
        // A prompt released as stopped may still run in the emulator, and
        // ComfyUI busy with work vacancy did not admit lends nothing.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.comfy_unfinished().is_empty() {
            assert!(
                Instant::now() < deadline,
                "{context}: the emulator never went idle"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A released entry's resources wait for a fresh sample (HELD-07),
        // which the release asks for; the next round needs them lendable.
        self.wait_status(context, "fresh samples after the releases", |s| {
            s["resources"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["awaiting_fresh_sample"] == false)
        })
        .await;
    }

    /// Write `lines` into the journal of the daemon [`stop`](Self::stop)ped,
    /// as it would have appended them.
    fn append_journal(&self, lines: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.journal())
            .unwrap();
        f.write_all(lines.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }

    /// Plant `n` held ComfyUI entries (written by a daemon that crashed
    /// before it learned their prompts' IDs) in the stopped daemon's journal.
    fn plant_held(&mut self, n: usize) {
        let mut lines = String::new();
        for _ in 0..n {
            let id = uuid::Uuid::new_v4().to_string();
            lines.push_str(&admit_line(&id, "comfy", "gpu2", "tracked"));
            self.planted.insert(id);
        }
        self.append_journal(&lines);
    }

    /// Borrowers' work on llama (`stream`: streamed, `tokens` each) that runs
    /// until the test stops it.
    fn llama_load(&self, stream: bool, tokens: u32) -> tokio::task::JoinHandle<()> {
        let url = format!("{}/completion", self.llama_proxy);
        tokio::spawn(async move {
            loop {
                let mut body: Value = serde_json::from_slice(&completion(tokens, stream)).unwrap();
                body["ignore_eos"] = json!(true);
                let body = body.to_string().into_bytes();
                let ok = if stream {
                    match http_stream("POST", &url, &[JSON], body).await {
                        Ok(mut s) => {
                            while let Some(Ok(_)) = s.next_chunk().await {}
                            s.status == 200
                        }
                        Err(_) => false,
                    }
                } else {
                    matches!(http_request("POST", &url, &[JSON], body).await, Ok(r) if r.status == 200)
                };
                if !ok {
                    // Refused (the owner is back) or the daemon is gone.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    }

    /// A streamed chat on Ollama that runs until the response ends.
    fn ollama_chat(&self, tokens: u32) -> tokio::task::JoinHandle<()> {
        let url = format!("{}/api/chat", self.ollama_proxy);
        let body = json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": true,
            "options": {"num_predict": tokens}
        })
        .to_string()
        .into_bytes();
        tokio::spawn(async move {
            if let Ok(mut s) = http_stream("POST", &url, &[JSON], body).await {
                while let Some(Ok(_)) = s.next_chunk().await {}
            }
        })
    }

    async fn comfy_submit(proxy: String, color: u32) -> Result<String, String> {
        let r = http_request(
            "POST",
            &format!("{proxy}/prompt"),
            &[JSON],
            prompt_request(simple_workflow(color), None)
                .to_string()
                .into_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!("{}: {}", r.status, r.text()));
        }
        r.json()
            .ok()
            .and_then(|v| v["prompt_id"].as_str().map(str::to_owned))
            .ok_or_else(|| format!("no prompt_id in {}", r.text()))
    }

    fn comfy_unfinished(&self) -> BTreeSet<String> {
        let mut ids: BTreeSet<String> = self.comfy.pending().into_iter().collect();
        ids.extend(self.comfy.running());
        ids
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CompactionStage {
    Before,
    Writing,
    After,
}

fn journal_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

/// What the test knew when it killed the daemon.
#[derive(Default)]
struct AtKill {
    /// Prompts the emulator had queued or running.
    comfy_unfinished: BTreeSet<String>,
    /// Kills that landed inside what the phase names.
    inside: usize,
    /// When the daemon was killed: an exchange cut before it was cut by the
    /// daemon itself (a cancel, a drain's deadline), which may have proven
    /// its end; one running at the kill had no such proof.
    killed_at: Option<Instant>,
}

async fn kill_in(rig: &mut Rig, phase: Phase, rng: &mut Rng, round: usize) -> AtKill {
    let mut at = AtKill::default();
    match phase {
        Phase::Forwarding | Phase::Streaming => {
            let stream = phase == Phase::Streaming;
            let load = rig.llama_load(stream, 8 + rng.below(120) as u32);
            if stream {
                // Once a request reached the upstream.
                let deadline = Instant::now() + Duration::from_secs(10);
                while rig.llama_shim.in_flight() == 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            tokio::time::sleep(rng.millis(400)).await;
            at.inside = usize::from(rig.llama_shim.in_flight() > 0);
            at.killed_at = Some(Instant::now());
            rig.kill();
            load.abort();
        }
        Phase::ComfySubmission => {
            rig.comfy.set_faults(ComfyFaults {
                submission_reply_delay: rng.millis(40),
                ..ComfyFaults::default()
            });
            let proxy = rig.comfy_proxy.clone();
            let color = 0x10_0000 + round as u32;
            let submit = tokio::spawn(Rig::comfy_submit(proxy, color));
            tokio::time::sleep(rng.millis(60)).await;
            at.inside = usize::from(!submit.is_finished());
            at.comfy_unfinished = rig.comfy_unfinished();
            at.killed_at = Some(Instant::now());
            rig.kill();
            submit.abort();
            rig.comfy.set_faults(ComfyFaults::default());
            at.comfy_unfinished.extend(rig.comfy_unfinished());
        }
        Phase::ComfyTracking => {
            let id = Rig::comfy_submit(rig.comfy_proxy.clone(), 0x20_0000 + round as u32)
                .await
                .unwrap_or_else(|e| panic!("round {round}: the prompt was refused: {e}"));
            tokio::time::sleep(rng.millis(COMFY_RUN.as_millis() as u64)).await;
            at.comfy_unfinished = rig.comfy_unfinished();
            at.inside = usize::from(at.comfy_unfinished.contains(&id));
            rig.kill();
            at.comfy_unfinished.extend(rig.comfy_unfinished());
        }
        Phase::Reclaim => {
            let llama = rig.llama_load(true, 100_000);
            let chat = rig.ollama_chat(200 + rng.below(2000) as u32);
            let deadline = Instant::now() + Duration::from_secs(20);
            while (rig.llama_shim.in_flight() == 0 || rig.ollama_shim.in_flight() == 0)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let present = rig.presence(true).await;
            assert_eq!(present, 200, "round {round}: the owner's return");
            // Within the cancel, the 1 s drain and the unload after it.
            tokio::time::sleep(rng.millis(1600)).await;
            let s = rig.status().await;
            at.inside = usize::from(!s["reclaims"].as_array().unwrap().is_empty());
            at.killed_at = Some(Instant::now());
            rig.kill();
            llama.abort();
            chat.abort();
        }
        Phase::AdminRelease => {
            let s = rig.status().await;
            let ids: Vec<String> = s["work"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["id"].as_str().unwrap().to_owned())
                .collect();
            let releases: Vec<_> = ids
                .iter()
                .map(|id| {
                    (
                        id.clone(),
                        tokio::spawn(Rig::release(rig.control.clone(), id.clone())),
                    )
                })
                .collect();
            // A release cut by the kill may or may not have been applied;
            // only an answered one is certain.
            for id in &ids {
                rig.planted.remove(id);
            }
            tokio::time::sleep(rng.millis(8)).await;
            at.inside = usize::from(releases.iter().any(|(_, r)| !r.is_finished()));
            at.killed_at = Some(Instant::now());
            rig.kill();
            for (id, r) in releases {
                if let Ok(Some(200)) = r.await {
                    rig.planted.remove(&id);
                    rig.released.insert(id);
                }
            }
        }
        Phase::Compaction => {
            rig.stop();
            // Dead lines enough for the next change to compact the journal.
            let mut lines = String::new();
            for _ in 0..600 {
                let id = uuid::Uuid::new_v4().to_string();
                lines.push_str(&admit_line(&id, "llama", "gpu0", "response_end"));
                lines.push_str(&format!("{{\"v\":1,\"op\":\"release\",\"id\":\"{id}\"}}\n"));
            }
            rig.append_journal(&lines);
            rig.up(&format!("round {round} (compaction)")).await;
            // The first admission's write compacts the journal, within
            // milliseconds of the request.
            let padded = journal_lines(&rig.journal());
            let new_file = rig.journal().with_extension("jsonl.new");
            let load = rig.llama_load(false, 4);
            tokio::time::sleep(Duration::from_micros(rng.below(12_000))).await;
            at.killed_at = Some(Instant::now());
            rig.kill();
            load.abort();
            // Where in the compaction the kill landed: before it (the
            // padding still there), while its file was written, after
            // the rename.
            let stage = if new_file.exists() {
                CompactionStage::Writing
            } else if journal_lines(&rig.journal()) >= padded {
                CompactionStage::Before
            } else {
                CompactionStage::After
            };
            *rig.compaction_stages.entry(stage).or_default() += 1;
            at.inside = usize::from(stage == CompactionStage::Writing);
        }
        Phase::Startup => {
            rig.kill();
            for _ in 0..3 {
                let p = rig.spawn();
                tokio::time::sleep(rng.millis(60)).await;
                // Not yet answering: the kill landed before startup ended.
                let health = format!("{}/health", rig.control);
                let answered = tokio::time::timeout(
                    Duration::from_millis(500),
                    http_request("GET", &health, &[], Vec::new()),
                )
                .await;
                if !matches!(answered, Ok(Ok(ref r)) if r.status == 200) {
                    at.inside += 1;
                }
                rig.killed(p);
            }
        }
    }
    at
}

/// After a restart: the invariants of the module comment.
async fn verify(rig: &Rig, context: &str, at: &AtKill, tally: &mut Tally) {
    assert!(
        rig.llama_shim.wait_idle(Duration::from_secs(60)),
        "{context}: llama still works after the kill"
    );
    assert!(
        rig.ollama_shim.wait_idle(Duration::from_secs(60)),
        "{context}: ollama still works after the kill"
    );
    let unfinished = |shim: &CountingShim, work: fn(&Record) -> bool| {
        shim.records()
            .into_iter()
            .filter(|r| work(r) && !r.completed)
            .filter(|r| match (r.ended, at.killed_at) {
                (Some(ended), Some(killed)) => ended >= killed,
                _ => true,
            })
            .count()
    };
    let llama_unfinished = unfinished(&rig.llama_shim, is_llama_work);
    let ollama_unfinished = unfinished(&rig.ollama_shim, is_ollama_work);

    let s = rig.status().await;
    // Read after /status: a prompt not finished now was not finished then,
    // so the daemon had no proof of its end.
    let finished: BTreeSet<String> = rig.comfy.history_ids().into_iter().collect();
    let work = s["work"].as_array().unwrap();
    let ids: BTreeSet<&str> = work.iter().map(|w| w["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), work.len(), "{context}: an entry twice: {s:#}");
    let refs: Vec<&str> = work
        .iter()
        .filter_map(|w| w["upstream_ref"].as_str())
        .collect();
    let unique_refs: BTreeSet<&str> = refs.iter().copied().collect();
    assert_eq!(
        unique_refs.len(),
        refs.len(),
        "{context}: a handle twice: {s:#}"
    );
    assert!(
        work.iter().all(|w| w["phase"] == "held"),
        "{context}: restored entries must be held: {s:#}"
    );
    let held_on = |up: &str| work.iter().filter(|w| w["upstream"] == up).count();
    assert!(
        held_on("llama") >= llama_unfinished,
        "{context}: llama received {llama_unfinished} requests it did not finish but {} came back held: {s:#}",
        held_on("llama")
    );
    assert!(
        held_on("ollama") >= ollama_unfinished,
        "{context}: ollama received {ollama_unfinished} chats it did not finish but {} came back held: {s:#}",
        held_on("ollama")
    );
    let mut comfy_unfinished = 0;
    for id in &at.comfy_unfinished {
        if finished.contains(id) || rig.released.contains(id) {
            continue;
        }
        comfy_unfinished += 1;
        assert!(
            work.iter()
                .any(|w| w["id"] == id.as_str() || w["upstream_ref"] == id.as_str()),
            "{context}: ComfyUI had prompt {id} unfinished at the kill but it is not held: {s:#}"
        );
    }
    let undone: Vec<&&str> = ids
        .iter()
        .filter(|id| rig.released.contains(**id))
        .collect();
    assert!(
        undone.is_empty(),
        "{context}: acknowledged releases came back: {undone:?}"
    );
    let lost: Vec<&String> = rig
        .planted
        .iter()
        .filter(|id| !ids.contains(id.as_str()))
        .collect();
    if !lost.is_empty() {
        let journal = std::fs::read_to_string(rig.journal()).unwrap_or_default();
        let mentions: Vec<&str> = journal
            .lines()
            .filter(|l| lost.iter().any(|id| l.contains(id.as_str())))
            .collect();
        panic!(
            "{context}: planted held entries lost: {lost:?}\njournal lines naming them: {mentions:#?}\njournal has {} lines\nlogs of the killed daemons:\n{}",
            journal.lines().count(),
            rig.killed_logs.join("\n----\n")
        );
    }

    tally.kills += 1;
    tally.inside += at.inside;
    tally.unfinished += llama_unfinished + ollama_unfinished + comfy_unfinished;
    tally.held += work.len();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_every_phase_never_forgets_work_nor_undoes_a_release() {
    let kills: usize = std::env::var("VACANCY_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("VACANCY_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0bad_5eed);
    let mut rng = Rng(seed);
    let mut rig = Rig::start();
    rig.up("the first start").await;
    let mut tallies: BTreeMap<Phase, Tally> = BTreeMap::new();
    let started = Instant::now();
    for round in 0..kills {
        let phase = PHASES[round % PHASES.len()];
        let next = PHASES[(round + 1) % PHASES.len()];
        let context = format!("round {round} ({}, seed {seed})", phase.name());
        rig.llama_shim.clear();
        rig.ollama_shim.clear();
        if phase == Phase::Startup {
            rig.stop();
            rig.plant_held(2);
            rig.up(&context).await;
        }
        let at = kill_in(&mut rig, phase, &mut rng, round).await;
        rig.up(&context).await;
        let tally = tallies.entry(phase).or_default();
        verify(&rig, &context, &at, tally).await;
        if phase == Phase::Startup {
            // The kill before the three during startup was counted above.
            tally.kills += 3;
        }
        if next == Phase::AdminRelease {
            // Leave held work for the releases the next round cuts, and
            // make sure there is some.
            rig.stop();
            rig.plant_held(3);
            rig.up(&context).await;
        } else {
            rig.release_all(&context).await;
        }
        if next == Phase::Compaction {
            rig.stop();
            rig.plant_held(1);
            rig.up(&context).await;
        }
    }
    let total: usize = tallies.values().map(|t| t.kills).sum();
    println!(
        "kill -9 in every phase (seed {seed}): {total} kills in {:.1} s; lost: 0, duplicated: 0, undone: 0",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  compaction kills: {} before it, {} while its file was written, {} after the rename",
        rig.compaction_stages
            .get(&CompactionStage::Before)
            .unwrap_or(&0),
        rig.compaction_stages
            .get(&CompactionStage::Writing)
            .unwrap_or(&0),
        rig.compaction_stages
            .get(&CompactionStage::After)
            .unwrap_or(&0),
    );
    for (phase, t) in &tallies {
        println!(
            "  {:<17} kills {:>4}  inside the phase {:>4}  unfinished at the upstream {:>4}  held after restart {:>4}",
            phase.name(),
            t.kills,
            t.inside,
            t.unfinished,
            t.held
        );
    }
}
