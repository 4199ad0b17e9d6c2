//! ComfyUI's progress messages, read from its `/ws` as its own web client
//! reads them: which node of which prompt runs now.
//!
//! A test that must act while a given node runs (an interrupt that lands
//! only at the next node's start, for one) waits here for that node's
//! `executing` message instead of guessing from the queue, which shows a
//! prompt running from before its first node starts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::SupportError;

/// A WebSocket to ComfyUI's `/ws`, opened under a client ID: ComfyUI sends
/// it the progress of the prompts submitted with that `client_id`.
#[derive(Debug)]
pub struct ComfyEvents {
    stream: TcpStream,
    addr: SocketAddr,
}

impl ComfyEvents {
    /// Opens `/ws?clientId=<client_id>` on the ComfyUI at `addr`. Open it
    /// before submitting: ComfyUI sends each message once, to the sockets
    /// open at the time.
    pub fn connect(addr: SocketAddr, client_id: &str) -> Result<Self, SupportError> {
        let url = format!("ws://{addr}/ws?clientId={client_id}");
        let fail = |m: String| SupportError::http("GET", &url, m);
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| fail(e.to_string()))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| fail(e.to_string()))?;
        let request = format!(
            "GET /ws?clientId={client_id} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        // The handshake's reply ends at the blank line; read it byte by byte
        // so that no frame after it is taken with it.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream
                .read_exact(&mut byte)
                .map_err(|e| fail(format!("reading the handshake reply: {e}")))?;
            head.push(byte[0]);
            if head.len() > 8192 {
                return Err(fail("handshake reply head over 8 KiB".into()));
            }
        }
        if !head.starts_with(b"HTTP/1.1 101") {
            return Err(fail(format!(
                "no upgrade: {}",
                String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
            )));
        }
        Ok(Self { stream, addr })
    }

    /// Waits up to `within` for the message that node `node` of prompt
    /// `prompt_id` starts executing.
    pub fn wait_executing(
        &mut self,
        prompt_id: &str,
        node: &str,
        within: Duration,
    ) -> Result<(), SupportError> {
        let deadline = Instant::now() + within;
        let mut last = String::from("no message");
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| SupportError::io("set the /ws read timeout", e))?;
            let Some(text) = self.next_text()? else {
                continue;
            };
            let Ok(message) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if message["type"] == "executing"
                && message["data"]["prompt_id"] == prompt_id
                && message["data"]["node"] == node
            {
                return Ok(());
            }
            last = text;
        }
        Err(SupportError::Timeout {
            what: format!(
                "ComfyUI at {} starting node {node} of prompt {prompt_id} (last message: {last})",
                self.addr
            ),
            after: within,
            tail: String::new(),
        })
    }

    /// The next text frame, or `None` for any other frame (previews, pings).
    fn next_text(&mut self) -> Result<Option<String>, SupportError> {
        let url = format!("ws://{}/ws", self.addr);
        let fail = |m: String| SupportError::http("GET", &url, m);
        let mut header = [0u8; 2];
        self.stream
            .read_exact(&mut header)
            .map_err(|e| fail(format!("reading a frame: {e}")))?;
        let opcode = header[0] & 0x0f;
        let len = match header[1] & 0x7f {
            126 => {
                let mut n = [0u8; 2];
                self.stream
                    .read_exact(&mut n)
                    .map_err(|e| fail(e.to_string()))?;
                u64::from(u16::from_be_bytes(n))
            }
            127 => {
                let mut n = [0u8; 8];
                self.stream
                    .read_exact(&mut n)
                    .map_err(|e| fail(e.to_string()))?;
                u64::from_be_bytes(n)
            }
            n => u64::from(n),
        };
        if header[1] & 0x80 != 0 {
            return Err(fail("the server masked a frame".into()));
        }
        if opcode == 8 {
            return Err(fail("ComfyUI closed the socket".into()));
        }
        let mut payload = Vec::new();
        (&mut self.stream)
            .take(len)
            .read_to_end(&mut payload)
            .map_err(|e| fail(e.to_string()))?;
        if payload.len() as u64 != len {
            return Err(fail("the socket ended inside a frame".into()));
        }
        Ok((opcode == 1).then(|| String::from_utf8_lossy(&payload).into_owned()))
    }
}
