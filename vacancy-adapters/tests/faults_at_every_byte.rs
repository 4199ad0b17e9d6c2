//! Faults at every byte (issue 18 item 2): for each adapter's work route, a
//! raw TCP upstream sends a real response up to every offset, then ends the
//! connection with a clean close (FIN) or a reset (RST). The real proxy
//! stands in front of it. At every offset:
//!
//! - the borrower gets an answer: a 502 while no response head came,
//!   else the relayed head and a body that ends cleanly only when the
//!   upstream's did;
//! - the reservation is released only where the seed proves the end: the
//!   whole response read (DONE-01) or a refused connection (DONE-02); it is
//!   held everywhere else (DONE-03).
//!
//! The responses are in `tests/fixtures/responses` (see its README: which
//! were recorded from a real server and which follow a server's format).
//! `VACANCY_FAULT_STRIDE=N` tries every Nth offset inside a body (default
//! 1: every offset); `VACANCY_FAULT_ADAPTER=NAME` tries one adapter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use vacancy::engine::Phase;
use vacancy::testkit::{ProxyUnderTest, WorkSample};
use vacancy::{Adapter, MonotonicClock};
use vacancy_adapters::comfyui::ComfyUiAdapter;
use vacancy_adapters::{
    AdapterSettings, ChatterboxAdapter, LlamaCppAdapter, OllamaAdapter, OpenAiAdapter,
};

fn settings(target: &str) -> AdapterSettings {
    AdapterSettings::new(target.parse().unwrap(), MonotonicClock::new())
}

/// One adapter's work route and a real response of its upstream.
struct Case {
    adapter: &'static str,
    make: fn(&str) -> Arc<dyn Adapter>,
    sample: WorkSample,
    response: Vec<u8>,
    /// Tracked work (ComfyUI): the reply names the forwarded `prompt_id`,
    /// and a clean end of the submission reply proves nothing of the job.
    tracked: bool,
}

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/responses")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            adapter: "llamacpp",
            make: |t| Arc::new(LlamaCppAdapter::new(settings(t)).unwrap()),
            sample: WorkSample::json("/completion", r#"{"prompt":"hi","n_predict":2}"#),
            response: fixture("llamacpp_completion.http"),
            tracked: false,
        },
        Case {
            adapter: "openai",
            make: |t| Arc::new(OpenAiAdapter::new(settings(t)).unwrap()),
            sample: WorkSample::json(
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":true}"#,
            ),
            response: fixture("openai_chat_completions_stream.http"),
            tracked: false,
        },
        Case {
            adapter: "ollama",
            make: |t| Arc::new(OllamaAdapter::new(settings(t)).unwrap()),
            sample: WorkSample::json(
                "/api/generate",
                r#"{"model":"tiny","prompt":"Once","options":{"num_predict":2}}"#,
            ),
            response: fixture("ollama_generate_stream.http"),
            tracked: false,
        },
        Case {
            adapter: "chatterbox",
            make: |t| Arc::new(ChatterboxAdapter::new(settings(t)).unwrap()),
            sample: WorkSample::json("/v1/audio/speech", r#"{"input":"hi","voice":"default"}"#),
            response: fixture("chatterbox_speech.http"),
            tracked: false,
        },
        Case {
            adapter: "comfyui",
            make: |t| Arc::new(ComfyUiAdapter::new(settings(t)).unwrap()),
            sample: WorkSample::json(
                "/prompt",
                r#"{"prompt":{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":64,"batch_size":1,"color":0}}}}"#,
            ),
            response: fixture("comfyui_prompt.http"),
            tracked: true,
        },
    ]
}

/// How the upstream ends the connection after its last byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// FIN: a clean close.
    Close,
    /// RST: a reset (zero linger).
    Reset,
}

/// Where in the response an offset falls, for the report.
fn part(response: &[u8], cut: usize) -> &'static str {
    let head_end = head_len(response);
    let head = &response[..head_end];
    let status_end = head.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    if cut < status_end {
        "status line"
    } else if cut < head_end {
        "headers"
    } else if cut == response.len() {
        "whole response"
    } else if !String::from_utf8_lossy(head)
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        "body"
    } else {
        // Walk the chunks: size line, data, CRLF; then the last chunk.
        let mut at = head_end;
        loop {
            let line_end = at
                + response[at..]
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .unwrap()
                + 2;
            let size = usize::from_str_radix(
                std::str::from_utf8(&response[at..line_end - 2])
                    .unwrap()
                    .trim(),
                16,
            )
            .unwrap();
            if size == 0 {
                return "last chunk";
            }
            if cut < line_end {
                return "chunk size";
            }
            at = line_end + size + 2;
            if cut < at {
                return "chunk";
            }
        }
    }
}

fn head_len(response: &[u8]) -> usize {
    response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4
}

/// Read one whole request (head, then its Content-Length or chunked body),
/// so that closing afterwards sends a FIN, not a reset for unread data.
async fn read_request(s: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(h) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..h]).to_ascii_lowercase();
            let body = got.len() - h - 4;
            let done = if let Some(l) = head.lines().find_map(|l| l.strip_prefix("content-length:"))
            {
                body >= l.trim().parse::<usize>().unwrap()
            } else if head.contains("transfer-encoding: chunked") {
                got.ends_with(b"0\r\n\r\n")
            } else {
                true
            };
            if done {
                let body = got.split_off(h + 4);
                return Some((String::from_utf8_lossy(&got).into_owned(), body));
            }
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The 36-byte ID after `"prompt_id": "` (or without the space) in `bytes`:
/// where it starts.
fn prompt_id_at(bytes: &[u8]) -> Option<usize> {
    let key = b"\"prompt_id\":";
    let at = bytes.windows(key.len()).position(|w| w == key)? + key.len();
    let quote = at + bytes[at..].iter().position(|&b| b == b'"')? + 1;
    (bytes.len() >= quote + 36).then_some(quote)
}

/// An upstream that answers the work request (`path`) with
/// `response[..cut]`, then ends the connection as `end` says; a tracked
/// reply names the `prompt_id` the proxy forwarded. Any other request (an
/// adapter's own reads) is closed unanswered.
async fn upstream(
    response: Arc<Vec<u8>>,
    cut: usize,
    end: End,
    tracked: bool,
    path: String,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let work = format!("POST {path} ");
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let Some((head, body)) = read_request(&mut s).await else {
                continue;
            };
            if !head.starts_with(&work) {
                continue;
            }
            let mut response = response.to_vec();
            if tracked
                && let (Some(from), Some(to)) = (prompt_id_at(&body), prompt_id_at(&response))
            {
                response[to..to + 36].copy_from_slice(&body[from..from + 36]);
            }
            let _ = s.write_all(&response[..cut]).await;
            let _ = s.flush().await;
            match end {
                End::Close => {
                    let _ = s.shutdown().await;
                    // Wait for the proxy to close its side, so no late byte
                    // of ours turns the FIN into a reset.
                    let mut rest = [0u8; 256];
                    let _ = tokio::time::timeout(Duration::from_secs(10), s.read(&mut rest)).await;
                }
                End::Reset => {
                    let _ = s.set_zero_linger();
                }
            }
            return;
        }
    });
    addr
}

/// What the borrower saw.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The body ended as its framing says (not cut off).
    clean: bool,
    body: Bytes,
}

async fn borrow(addr: SocketAddr, sample: &WorkSample) -> Result<Answer, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(sample.method.clone())
        .uri(&sample.path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, &sample.content_type)
        .body(Full::new(sample.body.clone()))
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = resp.status().as_u16();
    match resp.into_body().collect().await {
        Ok(b) => Ok(Answer {
            status,
            clean: true,
            body: b.to_bytes(),
        }),
        Err(_) => Ok(Answer {
            status,
            clean: false,
            body: Bytes::new(),
        }),
    }
}

/// What the reservation became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    Released,
    Held,
    /// Tracked work followed after its submission reply.
    Tracking,
}

async fn kept(p: &ProxyUnderTest) -> Result<Kept, String> {
    let work = p
        .settle(|w| {
            w.is_empty() || (w.len() == 1 && matches!(w[0].phase, Phase::Held | Phase::Tracking))
        })
        .await;
    match work.as_slice() {
        [] => Ok(Kept::Released),
        [one] if one.phase == Phase::Held => Ok(Kept::Held),
        [one] if one.phase == Phase::Tracking => Ok(Kept::Tracking),
        other => Err(format!("the entry did not settle: {other:?}")),
    }
}

/// One offset: a problem, if any.
async fn one(case: &Case, response: Arc<Vec<u8>>, cut: usize, end: End) -> Option<String> {
    let up = upstream(
        Arc::clone(&response),
        cut,
        end,
        case.tracked,
        case.sample.path.clone(),
    )
    .await;
    let p = ProxyUnderTest::start((case.make)(&format!("http://{up}")), up)
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), borrow(p.addr, &case.sample)).await;
    let where_ = format!(
        "{} {end:?} at byte {cut} of {} ({})",
        case.adapter,
        response.len(),
        part(&response, cut)
    );
    let answer = match answer {
        Err(_) => return Some(format!("{where_}: no answer within 20 s")),
        Ok(Err(e)) => return Some(format!("{where_}: {e}")),
        Ok(Ok(a)) => a,
    };
    let kept = match kept(&p).await {
        Ok(k) => k,
        Err(e) => return Some(format!("{where_}: {e}")),
    };
    let whole = cut == response.len();
    let head = cut >= head_len(&response);
    let ok = if case.tracked {
        // COMFY-01, COMFY-03: a submission reply proves nothing of the
        // job's end. Its prompt ID was recorded before forwarding, so the
        // entry is followed (or held), never released; the borrower is
        // shown a complete reply only when it came whole.
        kept != Kept::Released
            && if whole && end == End::Close {
                answer.status == 200 && answer.clean
            } else {
                answer.status == 502 || !answer.clean || whole
            }
    } else {
        match (whole, end, kept) {
            // DONE-01: the whole response was read and relayed.
            (true, End::Close, Kept::Released) => answer.status == 200 && answer.clean,
            // A reset right after the last byte may beat the proxy's read of
            // it: released only with the whole body relayed, else held.
            (true, End::Reset, Kept::Released) => answer.status == 200 && answer.clean,
            (true, End::Reset, Kept::Held) => !answer.clean || answer.status == 502,
            // DONE-03: anything short of the end holds, and the borrower is
            // never shown a body that looks complete.
            (false, _, Kept::Held) if head => answer.status == 200 && !answer.clean,
            (false, _, Kept::Held) => answer.status == 502 && answer.clean,
            _ => false,
        }
    };
    (!ok).then(|| {
        format!(
            "{where_}: kept {kept:?}, the borrower got {} (body {}, {} bytes)",
            answer.status,
            if answer.clean { "complete" } else { "cut off" },
            answer.body.len()
        )
    })
}

fn stride() -> usize {
    std::env::var("VACANCY_FAULT_STRIDE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// The offsets tried: every one in the head and the chunk framing and the
/// last 8 bytes, and every `stride`th inside body data.
fn offsets(response: &[u8], stride: usize) -> Vec<usize> {
    (0..=response.len())
        .filter(|&cut| {
            stride == 1
                || cut % stride == 0
                || cut + 8 >= response.len()
                || !matches!(part(response, cut), "chunk" | "body")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_offset_of_every_adapters_response_holds_unless_the_end_is_proven() {
    let stride = stride();
    let mut problems = Vec::new();
    let mut tried = 0usize;
    let only = std::env::var("VACANCY_FAULT_ADAPTER").ok();
    for case in cases() {
        if only.as_deref().is_some_and(|a| a != case.adapter) {
            continue;
        }
        let response = Arc::new(case.response.clone());
        let case = Arc::new(case);

        // DONE-02: a refused connection releases and answers 502.
        // A socket bound but not listening refuses connections, and holds
        // its port: no other socket (nor a connection to itself) can take it.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let up = closed.local_addr().unwrap();
        let p = ProxyUnderTest::start((case.make)(&format!("http://{up}")), up)
            .await
            .unwrap();
        let a = borrow(p.addr, &case.sample).await.unwrap();
        let k = kept(&p).await;
        // Each adapter's dialect: 502, or 503 where its clients expect it.
        if !(matches!(a.status, 502 | 503) && k == Ok(Kept::Released)) {
            problems.push(format!(
                "{} refused connect: {} and {k:?}",
                case.adapter, a.status
            ));
        }
        drop(closed);

        let cuts = offsets(&response, stride);
        let mut set = tokio::task::JoinSet::new();
        let limit = Arc::new(tokio::sync::Semaphore::new(8));
        for &cut in &cuts {
            for end in [End::Close, End::Reset] {
                let (case, response, limit) =
                    (Arc::clone(&case), Arc::clone(&response), Arc::clone(&limit));
                set.spawn(async move {
                    let _permit = limit.acquire_owned().await.unwrap();
                    one(&case, response, cut, end).await
                });
            }
        }
        while let Some(r) = set.join_next().await {
            if let Some(p) = r.unwrap() {
                problems.push(p);
            }
        }
        tried += cuts.len() * 2;
        println!(
            "{}: {} offsets of {} bytes, each with a clean close and a reset",
            case.adapter,
            cuts.len(),
            response.len()
        );
    }
    println!("{tried} exchanges cut; {} problems", problems.len());
    problems.sort();
    assert!(
        problems.is_empty(),
        "{} of {tried} cut exchanges broke a rule:\n{}",
        problems.len(),
        problems
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
