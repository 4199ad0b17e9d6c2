//! A tiny HTTP/1.1 server for unit tests: replays canned answers (the real
//! llama-server fixtures, garbage, silence) and records what it was asked.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as received.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
}

/// What the server answers.
pub(crate) enum Reply {
    /// A complete response, written as is.
    Bytes(Vec<u8>),
    /// Accept, read, and never answer.
    Hang,
}

impl Reply {
    pub fn json(status: u16, body: &str) -> Self {
        Self::with_type(status, "application/json; charset=utf-8", body)
    }

    pub fn text(status: u16, body: &str) -> Self {
        Self::with_type(status, "text/plain", body)
    }

    pub fn raw(bytes: Vec<u8>) -> Self {
        Reply::Bytes(bytes)
    }

    fn with_type(status: u16, content_type: &str, body: &str) -> Self {
        let reason = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Unknown");
        Reply::Bytes(
            format!(
                "HTTP/1.1 {status} {reason}\r\nServer: llama.cpp\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    }
}

type Handler = dyn Fn(&Recorded) -> Reply + Send + Sync;

pub(crate) struct TestServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let recorded = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let recorded = recorded.clone();
                tokio::spawn(serve(stream, handler, recorded));
            }
        });
        TestServer {
            addr,
            requests,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, handler: Arc<Handler>, recorded: Arc<Mutex<Vec<Recorded>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_owned();
    let path = first.next().unwrap_or_default().to_owned();
    let headers = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let req = Recorded {
        method,
        path,
        headers,
    };
    let reply = handler(&req);
    recorded.lock().unwrap().push(req);
    match reply {
        Reply::Bytes(bytes) => {
            let _ = stream.write_all(&bytes).await;
            let _ = stream.shutdown().await;
        }
        Reply::Hang => {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    }
}

/// A local port that refuses connections while the returned guard lives.
pub(crate) fn closed_port() -> vacancy::testkit::RefusingPort {
    vacancy::testkit::RefusingPort::bind().unwrap()
}

/// The inspection rules every adapter shares (ROUTE-05..07, MEM-06), checked
/// through the adapter's own table and `inspect`.
pub(crate) fn check_shared_inspection(adapter: &dyn vacancy::Adapter) {
    use vacancy::RefusalCode;
    use vacancy::traits::{InspectContext, RouteClass};

    let headers = http::HeaderMap::new();
    let inspect = |path: &str, body: &[u8]| {
        let RouteClass::Work(route) = adapter.classify(&http::Method::POST, path) else {
            panic!("{} does not list POST {path} as work", adapter.name());
        };
        let ctx = InspectContext {
            entry: vacancy::EntryId::from_u128(7),
            method: &http::Method::POST,
            path,
            headers: &headers,
        };
        adapter.inspect(&route, ctx, body)
    };
    let chat = "/v1/chat/completions";
    // MEM-06: the model exactly as written; absent is None.
    assert_eq!(
        inspect(chat, br#"{"model":"Qwen3:8B ","messages":[]}"#)
            .unwrap()
            .model
            .as_deref(),
        Some("Qwen3:8B ")
    );
    assert_eq!(inspect(chat, br#"{"messages":[]}"#).unwrap().model, None);
    // A body that is not a JSON object, or a model that is not a string: invalid_request.
    for body in [&b"not json"[..], b"[1]", b"\"s\"", b""] {
        assert_eq!(
            inspect(chat, body).unwrap_err().code,
            RefusalCode::InvalidRequest,
            "{body:?}"
        );
    }
    assert_eq!(
        inspect(chat, br#"{"model":1}"#).unwrap_err().code,
        RefusalCode::InvalidRequest
    );
    // ROUTE-05, ROUTE-07: background true or undecidable is refused on every adapter.
    for body in [
        &br#"{"model":"m","background":true}"#[..],
        br#"{"background":"yes"}"#,
        br#"{"background":1}"#,
    ] {
        let e = inspect("/v1/responses", body).unwrap_err();
        assert_eq!(e.code, RefusalCode::UnsupportedRequest, "{body:?}");
        assert!(e.message.contains(
            "send the request without background, streaming it where the client wants progress"
        ));
    }
    for body in [
        &br#"{"model":"m","background":false}"#[..],
        br#"{"model":"m","background":null}"#,
        br#"{"model":"m","stream":true}"#,
    ] {
        assert_eq!(
            inspect("/v1/responses?x=1", body).unwrap().model.as_deref(),
            Some("m"),
            "{body:?}"
        );
    }
    // ROUTE-06: unreadable Responses bodies are unsupported_request, not invalid_request.
    for body in [&b"{"[..], b"[]", b"", b"\xff"] {
        assert_eq!(
            inspect("/v1/responses", body).unwrap_err().code,
            RefusalCode::UnsupportedRequest,
            "{body:?}"
        );
    }
}
