//! Clients that are not on loopback (docs/security.md): a real vacancyd,
//! reached from a network namespace the test creates itself, joined to this
//! one by a veth pair on a private /30. The client in the namespace is
//! another host as far as vacancyd can tell: its address is not loopback.
//!
//! Needs root and `ip` (iproute2) and `python3` (the client inside the
//! namespace); a missing prerequisite fails the test with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::write_capacity;
use vacancy_test_support::{ManagedProcess, free_port, http_request};

const OWNER: &str = "network-test-owner-token";
const READ: &str = "network-test-read-token";

/// A network namespace with a veth pair: this side `host`, the namespace's
/// side `peer`, on one /30. Dropping it deletes both.
struct Namespace {
    name: String,
    host_link: String,
    host: Ipv4Addr,
    peer: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!(
            "prerequisite missing: `ip` (Debian package iproute2) creates the test's network \
             namespace; `scripts/test` installs it ({e})"
        )
    });
    assert!(
        out.status.success(),
        "prerequisite missing: `ip {}` failed: {} (the test needs root to create a network \
         namespace and a veth pair; CI runs as root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Fails the test unless it runs as root (a namespace and a veth pair need it).
fn require_root() {
    let out = Command::new("id").arg("-u").output().unwrap();
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        uid, "0",
        "prerequisite missing: creating a network namespace and a veth pair needs root, and \
         this test runs as uid {uid}; run the suite as root (CI does)"
    );
}

impl Namespace {
    fn create() -> Namespace {
        require_root();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Unique per process and test: interface names stay under 15 bytes,
        // and the /30 is 10.251.X.Y/30 inside 10.0.0.0/8 (RFC 1918).
        let n = (std::process::id() % 16_000) * 4 + NEXT.fetch_add(1, Ordering::Relaxed) % 4;
        let (a, b) = (((n >> 6) & 0xff) as u8, ((n & 0x3f) << 2) as u8);
        let ns = Namespace {
            name: format!("vacns{n}"),
            host_link: format!("vach{n}"),
            host: Ipv4Addr::new(10, 251, a, b + 1),
            peer: Ipv4Addr::new(10, 251, a, b + 2),
        };
        // Leftovers of a run killed before its cleanup.
        let _ = Command::new("ip")
            .args(["link", "del", &ns.host_link])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &ns.name]).output();
        let peer_link = format!("vacp{n}");
        ip(&["netns", "add", &ns.name]);
        ip(&[
            "link",
            "add",
            &ns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &peer_link,
        ]);
        ip(&["link", "set", &peer_link, "netns", &ns.name]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.host),
            "dev",
            &ns.host_link,
        ]);
        ip(&["link", "set", &ns.host_link, "up"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{}/30", ns.peer),
            "dev",
            &peer_link,
        ]);
        ip(&["-n", &ns.name, "link", "set", &peer_link, "up"]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// An HTTP request from inside the namespace (python3's urllib): the
    /// status code and the body.
    fn request(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        const CLIENT: &str = r#"
import sys, json, urllib.request, urllib.error
method, url, headers, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
req = urllib.request.Request(url, method=method, headers=headers, data=body.encode() if body else None)
try:
    r = urllib.request.urlopen(req, timeout=10)
    status, text = r.status, r.read()
except urllib.error.HTTPError as e:
    status, text = e.code, e.read()
sys.stdout.write(str(status) + "\n" + text.decode("utf-8", "replace"))
"#;
        let headers: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "python3", "-c", CLIENT])
            .args([
                method,
                url,
                &serde_json::Value::Object(headers).to_string(),
                body,
            ])
            .output()
            .unwrap_or_else(|e| {
                panic!("prerequisite missing: cannot run python3 in the namespace: {e}")
            });
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "the client in the namespace failed on {method} {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (status, body) = text.split_once('\n').unwrap_or((&text, ""));
        (
            status
                .parse()
                .unwrap_or_else(|_| panic!("no status from the client: {text}")),
            body.to_owned(),
        )
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn token_lines() -> String {
    let t = |name: &str, scope: &str, token: &str| {
        format!(
            "[[server.token]]\nname = \"{name}\"\nscopes = [\"{scope}\"]\nsha256 = \"{}\"\n",
            vacancy::auth::hash_token(token)
        )
    };
    format!(
        "{}{}",
        t("desk", "owner", OWNER),
        t("grafana", "read", READ)
    )
}

/// vacancyd with its control listener on `control` and its proxy listener
/// on `proxy`, lending `gpu0` to a llamacpp upstream at `target` (nothing
/// listens there: these tests send no work that is admitted). Waits for
/// `/health` at `health`.
fn vacancyd(
    dir: &tempfile::TempDir,
    control: &str,
    proxy: &str,
    tokens: &str,
    health: &str,
) -> ManagedProcess {
    let capacity = dir.path().join("gpu0.json");
    write_capacity(&capacity, 20_000, 64_000);
    let target = format!("http://127.0.0.1:{}", free_port().unwrap());
    let config = format!(
        r#"[server]
listen = "{control}"
{tokens}
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
name = "llama"
adapter = "llamacpp"
listen = "{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 2000
"#,
        capacity = capacity.display(),
    );
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(vacancy_test_support::vacancyd());
    cmd.arg("run")
        .arg("--config")
        .arg(&path)
        .env("VACANCYD_LOG", "info");
    let mut process = ManagedProcess::spawn("vacancyd", cmd).unwrap();
    process
        .wait_http_ok(&format!("{health}/health"), Duration::from_secs(20))
        .unwrap();
    process
}

fn code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .map(|v| v["error"]["code"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lan_client_reads_with_a_read_token_and_changes_nothing_without_an_owner_token() {
    // docs/security.md#the-listeners: /status and /metrics need scope `read` from elsewhere than
    // loopback; /admin needs its scope from everyone. The control listener is
    // bound to this side's LAN address, as an operator exposing it would.
    let ns = Namespace::create();
    let dir = tempfile::tempdir().unwrap();
    let (cport, pport) = (free_port().unwrap(), free_port().unwrap());
    let control = format!("http://{}:{cport}", ns.host);
    let proxy = format!("http://{}:{pport}", ns.host);
    let mut d = vacancyd(
        &dir,
        &format!("{}:{cport}", ns.host),
        &format!("{}:{pport}", ns.host),
        &token_lines(),
        &control,
    );
    let read = format!("Bearer {READ}");
    let owner = format!("Bearer {OWNER}");

    // /health answers everyone: load balancers and probes carry no token.
    let (s, body) = ns.request("GET", &format!("{control}/health"), &[], "");
    assert_eq!(s, 200, "{body}");

    for path in ["/status", "/metrics", "/history", "/settings"] {
        let url = format!("{control}{path}");
        let (s, body) = ns.request("GET", &url, &[], "");
        assert_eq!(s, 401, "{path} without a token from the LAN: {body}");
        assert_eq!(code(&body), "unauthorized", "{path}: {body}");
        let (s, body) = ns.request("GET", &url, &[("authorization", "Bearer not-a-token")], "");
        assert_eq!(s, 401, "{path} with a wrong token: {body}");
        let (s, body) = ns.request("GET", &url, &[("authorization", &read)], "");
        assert_eq!(s, 200, "{path} with a read token from the LAN: {body}");
    }
    let (_, metrics) = ns.request(
        "GET",
        &format!("{control}/metrics"),
        &[("authorization", &read)],
        "",
    );
    assert!(metrics.contains("vacancyd_admissions_total"), "{metrics}");
    let (s, health) = ns.request("GET", &format!("{control}/health/upstreams/llama"), &[], "");
    assert_eq!(
        s, 401,
        "the load balancers' route needs read from the LAN: {health}"
    );

    // A read token changes nothing; an owner token with its intent pauses lending.
    let lending = format!("{control}/admin/lending");
    let off = r#"{"enabled": false}"#;
    let json = ("content-type", "application/json");
    let (s, body) = ns.request(
        "POST",
        &lending,
        &[json, ("vacancy-intent", "lending")],
        off,
    );
    assert_eq!(s, 401, "{body}");
    let (s, body) = ns.request(
        "POST",
        &lending,
        &[
            json,
            ("authorization", &read),
            ("vacancy-intent", "lending"),
        ],
        off,
    );
    assert_eq!(s, 403, "a read token must not pause lending: {body}");
    assert_eq!(code(&body), "forbidden", "{body}");
    let (s, body) = ns.request(
        "POST",
        &lending,
        &[
            json,
            ("authorization", &owner),
            ("vacancy-intent", "lending"),
        ],
        off,
    );
    assert_eq!(s, 200, "an owner token from the LAN pauses lending: {body}");

    // The borrower listener needs no token: a LAN borrower is refused for
    // the owner's reason, in words it can act on.
    let (s, body) = ns.request(
        "POST",
        &format!("{proxy}/completion"),
        &[json],
        r#"{"prompt": "hi", "n_predict": 1}"#,
    );
    assert_eq!(s, 503, "{body}");
    assert_eq!(code(&body), "lending_paused", "{body}");

    // The tokens never reach the log.
    let log = d.log();
    for secret in [READ, OWNER] {
        assert!(!log.contains(secret), "a token leaked into the log");
    }
    d.terminate(Duration::from_secs(20)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_listener_on_every_address_without_tokens_answers_only_loopback() {
    // docs/security.md#the-listeners with no [[server.token]]: bound to 0.0.0.0, /status and
    // /metrics answer loopback clients only, /admin nobody; vacancyd warns.
    let ns = Namespace::create();
    let dir = tempfile::tempdir().unwrap();
    let (cport, pport) = (free_port().unwrap(), free_port().unwrap());
    let local = format!("http://127.0.0.1:{cport}");
    let lan = format!("http://{}:{cport}", ns.host);
    let mut d = vacancyd(
        &dir,
        &format!("0.0.0.0:{cport}"),
        &format!("127.0.0.1:{pport}"),
        "",
        &local,
    );
    for path in ["/status", "/metrics"] {
        let (s, body) = ns.request("GET", &format!("{lan}{path}"), &[], "");
        assert_eq!(
            s, 401,
            "{path} from the LAN with no tokens configured: {body}"
        );
        let here = http_request("GET", &format!("{local}{path}"), &[], Vec::new())
            .await
            .unwrap();
        assert_eq!(here.status, 200, "{path} from loopback: {}", here.text());
    }
    let (s, body) = ns.request(
        "POST",
        &format!("{lan}/admin/lending"),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer anything"),
            ("vacancy-intent", "lending"),
        ],
        r#"{"enabled": false}"#,
    );
    assert_eq!(s, 401, "{body}");
    let (s, _) = ns.request("GET", &format!("{lan}/health"), &[], "");
    assert_eq!(s, 200);
    assert!(
        d.log()
            .contains("the control listener is reachable beyond loopback"),
        "no warning for an exposed control listener without tokens:\n{}",
        d.log_tail(20)
    );
    // The proxy listener on loopback is not reachable from the LAN at all.
    let (s, body) = {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-c"])
            .arg(format!(
                "import socket\ntry:\n    socket.create_connection(('{}', {pport}), timeout=5)\n    print('connected')\nexcept OSError as e:\n    print('refused', e)",
                ns.host
            ))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(s, Some(0));
    assert!(
        body.starts_with("refused"),
        "a loopback proxy listener reached from the LAN: {body}"
    );
    d.terminate(Duration::from_secs(20)).unwrap();
}
