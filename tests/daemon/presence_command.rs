//! `presence = "command"` through a real vacancyd: the owner's own check
//! decides (exit 0 present, 1 away, anything else unknown), and a present or
//! unknown owner refuses host-scoped work (OWN-01).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Daemon, write_capacity};
use serde_json::json;
use vacancy_test_support::{OllamaEmulator, OllamaOptions, free_port, http_request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owners_command_decides_presence() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    write_capacity(&dir.path().join("gpu0.json"), 20_000, 64_000);
    let flag = dir.path().join("owner-here");
    let config = format!(
        r#"[server]
listen = "127.0.0.1:{control}"

[owner]
presence = "command"
command = "if [ -e '{flag}' ]; then exit 0; elif [ -e '{flag}.broken' ]; then exit 7; else exit 1; fi"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{capacity}"
reserve_mib = 1000
poll_ms = 500

[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 1000
"#,
        flag = flag.display(),
        capacity = dir.path().join("gpu0.json").display(),
        target = emu.base_url(),
    );
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, config).unwrap();
    let d = Daemon::start_with(dir, &path, control, proxy);
    let url = format!("{}/api/generate", d.proxy);
    let generate = || {
        http_request(
            "POST",
            &url,
            &[("content-type", "application/json")],
            json!({"model": "llama3", "prompt": "hi", "stream": false})
                .to_string()
                .into_bytes(),
        )
    };
    d.wait_status("the owner away", |s| s["owner"] == "away")
        .await;
    assert_eq!(generate().await.unwrap().status, 200);

    std::fs::write(&flag, "").unwrap();
    d.wait_status("the owner present", |s| s["owner"] == "present")
        .await;
    let r = generate().await.unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("owner_present"), "{}", r.text());

    std::fs::remove_file(&flag).unwrap();
    std::fs::write(flag.with_extension("broken"), "").unwrap();
    let s = d
        .wait_status("presence unknown", |s| s["owner"] == "unknown")
        .await;
    assert_eq!(s["owner_veto"]["active"], true);
    let r = generate().await.unwrap();
    assert_eq!(r.status, 503, "unknown refuses like present: {}", r.text());
}
