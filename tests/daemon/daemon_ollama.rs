//! vacancyd end to end in front of the Ollama emulator of a later release:
//! resident credit by request kind (RES-03..15, RES-21, RES-22), which needs
//! the `context_length` of `/api/ps` that Ollama added in 0.10.0, and
//! observation errors (OBS-03). The route table, the refusal dialect and
//! what the real releases 0.5.4 and 0.9.3 show are tested against them in
//! `daemon_ollama_real.rs`.
//!
//! The oracle of "credited or not" is memory: `gpu0` has 5000 MiB free with a
//! 1000 MiB reserve, a request charged in full needs 8000 MiB above the reserve
//! and is refused `insufficient_memory`, a credited one needs 0 and is admitted.
//! A request that must run uncredited (so that its kind is learned) is sent
//! while the capacity file says 20,000 free; the file is lowered to 5000 while
//! its response streams, so the post-job sample reads 5000. The daemon's
//! `admitted ... resident_credit=` log lines confirm each admission's credit.
//!
//! Residency needs an observation taken after the last job (RES-02): after a
//! job, [`settle`] waits until three `GET /api/ps` reached the emulator after
//! the response ended (the second one started after the job was released, and
//! the third one's arrival means the second was handed to the engine).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Daemon, write_capacity};
use serde_json::{Value, json};
use vacancy_test_support::{
    HttpReply, OllamaEmulator, OllamaModel, OllamaOptions, http_request, http_stream,
};

const JSON: (&str, &str) = ("content-type", "application/json");
/// Free MiB that admits a request charged in full (8000 + 1000 reserve).
const HIGH: u64 = 20_000;
/// Free MiB that admits only a credited request.
const LOW: u64 = 5000;
const MODEL: &str = "llama3:latest";

fn config(dir: &Path, control: u16, proxy: u16, target: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:{control}"

[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{capacity}"
reserve_mib = 1000
poll_ms = 60000
max_sample_age_ms = 120000

[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 8000
"#,
        capacity = dir.join("gpu0.json").display(),
    )
}

/// A fresh configuration directory for `target`, `gpu0` at `free` MiB free:
/// (the directory, the config path, control port, proxy port).
fn prepare(target: &str, free: u64) -> (tempfile::TempDir, PathBuf, u16, u16) {
    common::prepare(free, |dir, control, proxy| {
        config(dir, control, proxy, target)
    })
}

fn start(target: &str, free: u64) -> Daemon {
    let (dir, path, control, proxy) = prepare(target, free);
    Daemon::start_with(dir, &path, control, proxy)
}

fn emulator() -> OllamaEmulator {
    OllamaEmulator::start(OllamaOptions {
        // 8 tokens, 100 ms apart: a streamed response lasts ~0.8 s, time to
        // rewrite the capacity file before the job ends.
        token_delay: Duration::from_millis(100),
        ..OllamaOptions::default()
    })
    .unwrap()
}

fn admission_dir(d: &Daemon) -> PathBuf {
    d.dir.path().join("vacancyd.admission")
}

fn cache_file(d: &Daemon) -> PathBuf {
    admission_dir(d).join("learned-contexts.json")
}

/// The first 12 hex digits of the emulator's digest of `llama3`.
fn short_digest(digest: &str) -> String {
    digest.chars().take(12).collect()
}

fn generate(options: Option<Value>) -> Value {
    let mut body = json!({"model": "llama3", "prompt": "hi", "stream": false});
    if let Some(o) = options {
        body["options"] = o;
    }
    body
}

fn v1_chat() -> Value {
    json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]})
}

async fn post(d: &Daemon, path: &str, body: &Value) -> HttpReply {
    post_with(d, path, body, &[]).await
}

async fn post_with(d: &Daemon, path: &str, body: &Value, extra: &[(&str, &str)]) -> HttpReply {
    let mut headers = vec![JSON];
    headers.extend_from_slice(extra);
    tokio::time::timeout(
        Duration::from_secs(20),
        http_request(
            "POST",
            &format!("{}{path}", d.proxy),
            &headers,
            body.to_string().into_bytes(),
        ),
    )
    .await
    .expect("the request answered within 20 s")
    .unwrap()
}

/// A 503 `insufficient_memory` in Ollama's dialect that says why no resident
/// credit applied (RES-21); its error text.
fn assert_uncredited(r: &HttpReply) -> String {
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json().unwrap();
    let error = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("Ollama dialect {{\"error\": \"...\"}}: {body}"))
        .to_owned();
    assert!(error.starts_with("insufficient_memory: "), "{error}");
    assert!(error.contains("no resident credit: "), "{error}");
    error
}

fn ps_count(emu: &OllamaEmulator) -> usize {
    emu.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/ps")
        .count()
}

fn count_path(emu: &OllamaEmulator, method: &str, path: &str) -> usize {
    emu.requests()
        .iter()
        .filter(|r| r.method == method && r.path == path)
        .count()
}

/// `/status` `upstreams[0].residency`, joined with ` | `.
fn residency(s: &Value) -> String {
    s["upstreams"][0]["residency"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_default()
}

/// Wait until the residency in `/status` satisfies `pred`.
async fn wait_residency(d: &Daemon, what: &str, pred: impl Fn(&str) -> bool) -> Value {
    d.wait_status(what, |s| pred(&residency(s))).await
}

/// Wait, after a job whose response ended when the emulator had seen
/// `ps_at_end` `GET /api/ps`, until an observation taken after the job is in
/// the engine, `gpu0`'s post-job sample says `free`, and the residency
/// satisfies `pred`. Returns that `/status`.
async fn settle(
    d: &Daemon,
    emu: &OllamaEmulator,
    ps_at_end: usize,
    free: u64,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = d.status().await;
        let r = &s["resources"][0];
        let ok = ps_count(emu) >= ps_at_end + 3
            && r["free_mib"] == free
            && r["awaiting_fresh_sample"] == false
            && s["work"].as_array().is_some_and(Vec::is_empty)
            && pred(&residency(&s));
        if ok {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last status: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Send a work request that streams, admitted while the capacity file says
/// `HIGH` free; lower the file to `LOW` while the response streams, so the
/// post-job sample reads `LOW`. Returns the `/api/ps` count at its end.
async fn streamed_then_lower(d: &Daemon, emu: &OllamaEmulator, path: &str, body: Value) -> usize {
    let mut body = body;
    body["stream"] = json!(true);
    let mut stream = http_stream(
        "POST",
        &format!("{}{path}", d.proxy),
        &[JSON],
        body.to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(stream.status, 200, "POST {path} {body}");
    let first = stream.next_chunk().await.expect("a first chunk").unwrap();
    write_capacity(&d.capacity_file(), LOW, 64_000);
    assert!(!first.data.is_empty());
    let rest = tokio::time::timeout(Duration::from_secs(20), stream.collect_chunks())
        .await
        .expect("the stream ended within 20 s")
        .unwrap();
    let text: String = rest
        .iter()
        .map(|c| String::from_utf8_lossy(&c.data).into_owned())
        .collect();
    assert!(
        text.contains("\"done\":true") || text.contains("[DONE]"),
        "the stream ran to its end: {text}"
    );
    ps_count(emu)
}

/// The log without ANSI escape sequences.
fn plain_log(d: &Daemon) -> String {
    let log = d.process.log();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `resident_credit` of each `admitted` log line, in order.
fn admissions(d: &Daemon) -> Vec<bool> {
    plain_log(d)
        .lines()
        .filter(|l| l.contains("admitted") && l.contains("resident_credit="))
        .map(|l| l.contains("resident_credit=true"))
        .collect()
}

fn read_cache(d: &Daemon) -> Value {
    let text = std::fs::read_to_string(cache_file(d)).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn learned_kinds(cache: &Value) -> Vec<Value> {
    cache["upstreams"]["ollama"]["models"][MODEL]["kinds"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// A byte-level tap between vacancyd and the emulator, recording what vacancyd
// sends, headers included (the emulator records no headers).

/// The bytes vacancyd sent on one connection.
type Recorded = Arc<Mutex<Vec<u8>>>;

struct Tap {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<Recorded>>>,
}

impl Tap {
    fn start(upstream: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let all = Arc::clone(&conns);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let record: Recorded = Arc::default();
                all.lock().unwrap().push(Arc::clone(&record));
                let (mut from_client, mut to_server) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = from_client.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if to_server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown(Shutdown::Write);
                });
                let (mut from_server, mut to_client) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut to_client);
                    let _ = to_client.shutdown(Shutdown::Write);
                });
            }
        });
        Tap { addr, conns }
    }

    fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The heads (request line and headers) of every request whose request
    /// line starts with `line`, e.g. `POST /api/show`.
    fn heads(&self, line: &str) -> Vec<String> {
        let mut out = Vec::new();
        for conn in self.conns.lock().unwrap().iter() {
            let text = String::from_utf8_lossy(&conn.lock().unwrap()).into_owned();
            let mut at = 0;
            while let Some(i) = text[at..].find(line) {
                let start = at + i;
                let end = text[start..]
                    .find("\r\n\r\n")
                    .map_or(text.len(), |e| start + e);
                out.push(text[start..end].to_owned());
                at = end;
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preloaded_model_with_its_modelfile_context_is_credited_on_the_first_request() {
    // RES-09, RES-05 (c), RES-22; /api/show once per digest, never with the
    // borrower's credential (OBS-01).
    let emu = emulator();
    assert!(emu.set_modelfile_num_ctx("llama3", Some(8192)));
    emu.preload("llama3", None).unwrap();
    assert_eq!(emu.loaded()[0].context_length, 8192);
    let tap = Tap::start(emu.addr());
    let d = start(&tap.base_url(), LOW);
    let digest = short_digest(&OllamaModel::new("llama3").digest);
    let expected = format!("{MODEL}: loaded, context 8192, digest {digest}; resident for ");
    let s = wait_residency(&d, "the Modelfile context to be credited", |r| {
        r.contains(&expected) && r.contains(&format!("{MODEL}, num_ctx unset, /api"))
    })
    .await;
    let r = residency(&s);
    assert!(r.contains(&format!("{MODEL}, num_ctx unset, /v1")), "{r}");
    assert!(r.contains(&format!("{MODEL}, num_ctx 8192, /api")), "{r}");

    let secret = "Bearer borrower-secret-5f1c";
    let reply = post_with(
        &d,
        "/api/generate",
        &generate(None),
        &[("authorization", secret)],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json().unwrap()["done"], true);
    assert_eq!(admissions(&d), [true]);
    // The emulator did not reload: the request ran on the preloaded context.
    assert_eq!(emu.loaded()[0].load_id, 1);

    // Several more observations: still one /api/show for the one digest.
    let ps = ps_count(&emu);
    settle(&d, &emu, ps, LOW, "observations after the job", |r| {
        r.contains("resident for")
    })
    .await;
    let shows: Vec<_> = emu
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/show")
        .collect();
    assert_eq!(shows.len(), 1, "{shows:?}");
    assert_eq!(shows[0].method, "POST");
    assert_eq!(shows[0].body["model"], MODEL);
    // vacancyd's own reads never carry the borrower's credential; the
    // borrower's own request does (so the tap sees headers).
    let show_heads = tap.heads("POST /api/show");
    assert_eq!(show_heads.len(), 1, "{show_heads:?}");
    for head in show_heads.iter().chain(&tap.heads("GET /api/ps")) {
        assert!(!head.contains("borrower-secret"), "{head}");
    }
    let generate_heads = tap.heads("POST /api/generate");
    assert_eq!(generate_heads.len(), 1, "{generate_heads:?}");
    assert!(
        generate_heads[0].contains("borrower-secret"),
        "{generate_heads:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_num_ctx_is_credited_only_when_it_equals_the_loaded_context() {
    // RES-05 (b), RES-21
    let emu = emulator();
    emu.preload("llama3", Some(4096)).unwrap();
    let d = start(&emu.base_url(), LOW);
    wait_residency(&d, "num_ctx 4096 to be credited", |r| {
        r.contains(&format!("resident for {MODEL}, num_ctx 4096, /api"))
    })
    .await;
    let ok = post(
        &d,
        "/api/generate",
        &generate(Some(json!({"num_ctx": 4096}))),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(admissions(&d), [true]);
    let ps = ps_count(&emu);
    settle(&d, &emu, ps, LOW, "a post-job observation", |r| {
        r.contains("num_ctx 4096, /api")
    })
    .await;

    let generates = count_path(&emu, "POST", "/api/generate");
    let refused = post(
        &d,
        "/api/generate",
        &generate(Some(json!({"num_ctx": 8192}))),
    )
    .await;
    let error = assert_uncredited(&refused);
    assert!(error.contains("context 4096"), "{error}");
    assert!(error.contains("num_ctx 8192"), "{error}");
    // Refused before the upstream: it never saw the request, nothing reloaded.
    assert_eq!(count_path(&emu, "POST", "/api/generate"), generates);
    assert_eq!(emu.loaded()[0].context_length, 4096);
    assert_eq!(admissions(&d), [true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_kind_is_charged_in_full_until_a_finished_request_teaches_its_context() {
    // RES-07, RES-08, RES-12/13 (the cache file), RES-21
    let emu = emulator();
    let d = start(&emu.base_url(), HIGH);
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;
    let ps = streamed_then_lower(&d, &emu, "/v1/chat/completions", v1_chat()).await;
    assert_eq!(
        admissions(&d),
        [false],
        "the first /v1 request is not credited"
    );
    assert_eq!(emu.loaded()[0].context_length, 4096);
    settle(&d, &emu, ps, LOW, "the /v1 kind to be learned", |r| {
        r.contains(&format!("{MODEL}, num_ctx unset, /v1"))
    })
    .await;

    let second = post(&d, "/v1/chat/completions", &v1_chat()).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(admissions(&d), [false, true]);
    let ps = ps_count(&emu);
    settle(&d, &emu, ps, LOW, "a post-job observation", |r| {
        r.contains("/v1")
    })
    .await;

    // Kinds are separate: /api without num_ctx taught nothing (no Modelfile
    // num_ctx), so it is still charged in full.
    let error = assert_uncredited(&post(&d, "/api/generate", &generate(None)).await);
    assert!(error.contains("num_ctx unset, /api"), "{error}");

    let cache = read_cache(&d);
    assert_eq!(
        cache["upstreams"]["ollama"]["models"][MODEL]["digest"],
        OllamaModel::new("llama3").digest
    );
    let kinds = learned_kinds(&cache);
    assert!(
        kinds.contains(&json!({"num_ctx": null, "family": "v1", "context": 4096})),
        "{cache:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_context_survives_a_restart() {
    // RES-13
    let emu = emulator();
    let (dir, path, control, proxy) = prepare(&emu.base_url(), HIGH);
    let d = Daemon::start_with(dir, &path, control, proxy);
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;
    let ps = streamed_then_lower(&d, &emu, "/v1/chat/completions", v1_chat()).await;
    settle(&d, &emu, ps, LOW, "the /v1 kind to be learned", |r| {
        r.contains("num_ctx unset, /v1")
    })
    .await;
    assert_eq!(admissions(&d), [false]);

    let Daemon {
        mut process, dir, ..
    } = d;
    process.terminate(Duration::from_secs(10)).unwrap();
    drop(process);
    let d = Daemon::start_with(dir, &path, control, proxy);
    assert!(
        plain_log(&d).contains("learned Ollama contexts loaded"),
        "{}",
        plain_log(&d)
    );
    wait_residency(&d, "the learned /v1 kind after the restart", |r| {
        r.contains(&format!("{MODEL}, num_ctx unset, /v1"))
    })
    .await;
    let reply = post(&d, "/v1/chat/completions", &v1_chat()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(admissions(&d), [true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_digest_forgets_the_learned_contexts() {
    // RES-14, RES-09 (/api/show once per digest)
    let emu = emulator();
    let old = OllamaModel::new("llama3").digest;
    let new = "0123456789ab".repeat(5) + "cdef";
    let d = start(&emu.base_url(), HIGH);
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;
    let ps = streamed_then_lower(&d, &emu, "/v1/chat/completions", v1_chat()).await;
    settle(&d, &emu, ps, LOW, "the /v1 kind to be learned", |r| {
        r.contains("num_ctx unset, /v1")
    })
    .await;
    assert!(
        std::fs::read_to_string(cache_file(&d))
            .unwrap()
            .contains(&old)
    );

    // `ollama pull` fetched a new version and the owner loaded it again, with
    // the same context.
    assert!(emu.expire("llama3"));
    assert!(emu.set_digest("llama3", &new));
    emu.preload("llama3", None).unwrap();
    assert_eq!(emu.loaded()[0].context_length, 4096);
    let s = wait_residency(&d, "the new digest", |r| {
        r.contains(&format!("digest {}", short_digest(&new)))
    })
    .await;
    let r = residency(&s);
    assert!(!r.contains("/v1"), "the /v1 kind is forgotten: {r}");

    let error = assert_uncredited(&post(&d, "/v1/chat/completions", &v1_chat()).await);
    assert!(error.contains("nothing learned"), "{error}");
    assert_eq!(admissions(&d), [false]);
    let file = std::fs::read_to_string(cache_file(&d)).unwrap();
    assert!(!file.contains(&old), "{file}");
    let shows: Vec<String> = emu
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/show")
        .map(|r| r.body.to_string())
        .collect();
    assert_eq!(shows.len(), 2, "one /api/show per digest: {shows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_cache_file_is_logged_and_never_blocks_startup() {
    // RES-15
    let emu = emulator();
    let (dir, path, control, proxy) = prepare(&emu.base_url(), HIGH);
    let admission = dir.path().join("vacancyd.admission");
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&admission)
            .unwrap();
    }
    let cache = admission.join("learned-contexts.json");
    std::fs::write(&cache, b"{\"version\": 1, garbage").unwrap();
    // Private, as vacancyd writes it: what is tested is its contents.
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // Startup proceeds: start_with waits for /health to answer 200.
    let d = Daemon::start_with(dir, &path, control, proxy);
    let log = plain_log(&d);
    assert!(
        log.lines()
            .any(|l| l.contains("learned-contexts.json") && l.contains("unreadable")),
        "{log}"
    );
    let health = http_request("GET", &format!("{}/health", d.control), &[], Vec::new())
        .await
        .unwrap();
    assert_eq!(health.status, 200);

    let reply = post(&d, "/api/generate", &generate(None)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let ps = ps_count(&emu);
    settle(&d, &emu, ps, HIGH, "the /api kind to be learned", |r| {
        r.contains("num_ctx unset, /api")
    })
    .await;
    // The next lesson replaced the corrupt file with a valid one.
    let kinds = learned_kinds(&read_cache(&d));
    assert!(
        kinds.contains(&json!({"num_ctx": null, "family": "api", "context": 4096})),
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_parallel_slots_only_learned_contexts_count() {
    // RES-08, RES-10
    let emu = emulator();
    emu.set_parallel(2);
    let d = start(&emu.base_url(), HIGH);
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;
    let ps = streamed_then_lower(
        &d,
        &emu,
        "/api/generate",
        generate(Some(json!({"num_ctx": 2048}))),
    )
    .await;
    assert_eq!(emu.loaded()[0].context_length, 4096, "2 slots × 2048");
    let s = settle(&d, &emu, ps, LOW, "the 2048 kind to be learned", |r| {
        r.contains(&format!("{MODEL}, num_ctx 2048, /api"))
    })
    .await;
    let r = residency(&s);
    assert!(r.contains("context 4096"), "{r}");
    assert!(!r.contains("num_ctx 4096"), "RES-10: {r}");

    // The loaded context equals 4096, but parallel slots were seen: an
    // unlearned explicit num_ctx 4096 is not credited.
    let error = assert_uncredited(
        &post(
            &d,
            "/api/generate",
            &generate(Some(json!({"num_ctx": 4096}))),
        )
        .await,
    );
    assert!(error.contains("parallel slots"), "{error}");
    let credited = post(
        &d,
        "/api/generate",
        &generate(Some(json!({"num_ctx": 2048}))),
    )
    .await;
    assert_eq!(credited.status, 200, "{}", credited.text());
    assert_eq!(admissions(&d), [false, true]);
    assert_eq!(emu.loaded()[0].load_id, 1, "no reload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_options_and_a_model_about_to_unload_get_no_credit() {
    // RES-04, RES-03
    let emu = emulator();
    emu.preload("llama3", None).unwrap();
    let d = start(&emu.base_url(), LOW);
    wait_residency(&d, "num_ctx 4096 to be credited", |r| {
        r.contains(&format!("resident for {MODEL}, num_ctx 4096, /api"))
    })
    .await;
    let error = assert_uncredited(
        &post(
            &d,
            "/api/generate",
            &generate(Some(json!({"num_ctx": 4096, "num_gpu": 10}))),
        )
        .await,
    );
    assert!(error.contains("runner option num_gpu"), "{error}");
    assert_eq!(count_path(&emu, "POST", "/api/generate"), 0);

    // Without the runner option the same request is credited; it leaves the
    // model to unload 20 s after it ends.
    let mut short = generate(Some(json!({"num_ctx": 4096})));
    short["keep_alive"] = json!("20s");
    let ok = post(&d, "/api/generate", &short).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(admissions(&d), [true]);
    let ps = ps_count(&emu);
    settle(
        &d,
        &emu,
        ps,
        LOW,
        "the model to show its near unload",
        |r| {
            r.contains(&format!("{MODEL}: loaded, context 4096"))
                && r.contains("not proven (unloads in")
        },
    )
    .await;
    let error = assert_uncredited(
        &post(
            &d,
            "/api/generate",
            &generate(Some(json!({"num_ctx": 4096}))),
        )
        .await,
    );
    assert!(error.contains("unloads in"), "{error}");
    assert_eq!(admissions(&d), [true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_ps_gives_no_credit_and_shows_the_observation_error() {
    // OBS-03
    let emu = emulator();
    emu.preload("llama3", None).unwrap();
    emu.set_override("/api/ps", Some((200, "garbage".to_owned())));
    let d = start(&emu.base_url(), LOW);
    let s = d
        .wait_status("the observation error", |s| {
            s["upstreams"][0]["error"].is_string()
        })
        .await;
    let shown = s["upstreams"][0]["error"].as_str().unwrap();
    assert!(shown.contains("malformed"), "{s:#}");
    assert_eq!(residency(&s), "", "{s:#}");
    let body = generate(Some(json!({"num_ctx": 4096})));
    assert_uncredited(&post(&d, "/api/generate", &body).await);

    // The same request is credited once /api/ps answers properly again.
    emu.set_override("/api/ps", None);
    wait_residency(&d, "a good observation", |r| {
        r.contains(&format!("resident for {MODEL}, num_ctx 4096, /api"))
    })
    .await;
    let ok = post(&d, "/api/generate", &body).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(admissions(&d), [true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_context_that_differs_from_the_loaded_one_is_charged_in_full() {
    // RES-11: the model was since reloaded differently. RES-05 (b) still
    // credits an explicit num_ctx equal to the new context.
    let emu = emulator();
    assert!(emu.set_modelfile_num_ctx("llama3", Some(8192)));
    let d = start(&emu.base_url(), HIGH);
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;
    let ps = streamed_then_lower(&d, &emu, "/v1/chat/completions", v1_chat()).await;
    assert_eq!(emu.loaded()[0].context_length, 8192);
    settle(
        &d,
        &emu,
        ps,
        LOW,
        "the /v1 kind to be learned at 8192",
        |r| r.contains("context 8192") && r.contains(&format!("{MODEL}, num_ctx unset, /v1")),
    )
    .await;
    assert!(
        learned_kinds(&read_cache(&d))
            .contains(&json!({"num_ctx": null, "family": "v1", "context": 8192}))
    );
    // The owner reloads the model with another context, directly on Ollama.
    emu.preload("llama3", Some(4096)).unwrap();
    wait_residency(&d, "the reload to be observed", |r| {
        r.contains("context 4096")
    })
    .await;
    let error = assert_uncredited(&post(&d, "/v1/chat/completions", &v1_chat()).await);
    assert!(error.contains("loaded with context 4096"), "{error}");
    assert!(error.contains("num_ctx unset /v1 → 8192"), "{error}");
    let reply = post(
        &d,
        "/api/generate",
        &generate(Some(json!({"num_ctx": 4096}))),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(admissions(&d).last(), Some(&true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_old_observation_is_refreshed_once_on_the_refusal_path() {
    // RES-20: observations fail for over 4 s, so the last good one is too
    // old; the refusal path observes once more and the request is credited.
    // The observation loop may refresh first (it runs every 2 s): such a
    // round proves nothing and is repeated.
    let emu = emulator();
    emu.preload("llama3", Some(4096)).unwrap();
    let d = start(&emu.base_url(), LOW);
    wait_residency(&d, "the preloaded model to be credited", |r| {
        r.contains(&format!("{MODEL}, num_ctx 4096, /api"))
    })
    .await;
    let body = generate(Some(json!({"num_ctx": 4096})));
    for round in 0..3 {
        emu.set_override("/api/ps", Some((200, "garbage".into())));
        d.wait_status("the observation to fail", |s| {
            s["upstreams"][0]["error"]
                .as_str()
                .is_some_and(|e| e.contains("malformed"))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(4500)).await;
        let refreshes_before = plain_log(&d).matches("(RES-20)").count();
        emu.set_override("/api/ps", None);
        let reply = post(&d, "/api/generate", &body).await;
        assert_eq!(reply.status, 200, "round {round}: {}", reply.text());
        assert_eq!(admissions(&d).last(), Some(&true));
        if plain_log(&d).matches("(RES-20)").count() > refreshes_before {
            return;
        }
        let ps = ps_count(&emu);
        settle(&d, &emu, ps, LOW, "a post-job observation", |r| {
            r.contains("num_ctx 4096, /api")
        })
        .await;
    }
    panic!("the observation loop refreshed first in every round; RES-20 was never exercised");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_contexts_survive_a_model_unload_up_to_eight_kinds_per_model() {
    // RES-12: kinds learned for a model stay when the model unloads, at most
    // 8 per model (the oldest goes first); when it loads again under the
    // same digest they credit its first request.
    let emu = emulator();
    let digest = OllamaModel::new("llama3").digest;
    let (dir, path, control, proxy) = prepare(&emu.base_url(), HIGH);
    // An earlier run taught 8 /api kinds (num_ctx 1000 to 8000).
    let admission = dir.path().join("vacancyd.admission");
    std::fs::create_dir_all(&admission).unwrap();
    std::fs::set_permissions(
        &admission,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let kinds: Vec<Value> = (1..=8u64)
        .map(|n| json!({"num_ctx": n * 1000, "family": "api", "context": n * 1000}))
        .collect();
    let cache = json!({"version": 1, "upstreams": {"ollama": {"models": {MODEL: {
        "digest": digest, "parallel": false, "learned": 1, "kinds": kinds
    }}}}});
    let file = admission.join("learned-contexts.json");
    std::fs::write(&file, cache.to_string()).unwrap();
    // The recovery directory's files are private to vacancyd's account.
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let d = Daemon::start_with(dir, &path, control, proxy);
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;

    // A ninth kind is taught: the oldest one makes room.
    let ps = streamed_then_lower(&d, &emu, "/v1/chat/completions", v1_chat()).await;
    settle(&d, &emu, ps, LOW, "the /v1 kind to be learned", |r| {
        r.contains(&format!("{MODEL}, num_ctx unset, /v1"))
    })
    .await;
    let kinds = learned_kinds(&read_cache(&d));
    assert_eq!(kinds.len(), 8, "{kinds:#?}");
    assert!(!kinds.iter().any(|k| k["num_ctx"] == 1000), "{kinds:#?}");
    assert!(kinds.iter().any(|k| k["num_ctx"] == 2000), "{kinds:#?}");
    let v1 = json!({"num_ctx": null, "family": "v1", "context": 4096});
    assert_eq!(kinds.last(), Some(&v1), "{kinds:#?}");

    // The owner unloads the model: nothing is loaded, nothing is forgotten.
    let r = http_request(
        "POST",
        &format!("{}/api/generate", emu.base_url()),
        &[JSON],
        json!({"model": "llama3", "keep_alive": 0})
            .to_string()
            .into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.json().unwrap()["done_reason"], "unload");
    wait_residency(&d, "the model unloaded", |r| !r.contains(MODEL)).await;
    assert_eq!(
        learned_kinds(&read_cache(&d)),
        kinds,
        "kept through the unload"
    );

    // Loaded again under the same digest: the /v1 kind credits at once.
    emu.preload("llama3", None).unwrap();
    wait_residency(&d, "the learned /v1 kind credited again", |r| {
        r.contains(&format!("resident for {MODEL}, num_ctx unset, /v1"))
    })
    .await;
    let reply = post(&d, "/v1/chat/completions", &v1_chat()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(admissions(&d), [false, true]);
}
