//! `vacancyd status`: what the daemon is doing, for a person or a script.

use std::fmt::Write as _;

use bytes::Bytes;
use serde_json::Value;

use crate::control_client::{ClientError, exchange};

/// Fetch `/status` from the control listener at `base`.
pub async fn fetch(base: &str) -> Result<Value, ClientError> {
    let url = format!("{}/status", base.trim_end_matches('/'));
    let req = http::Request::get(&url)
        .body(http_body_util::Full::new(Bytes::new()))
        .map_err(|e| ClientError::Url {
            url: url.clone(),
            reason: e.to_string(),
        })?;
    let (status, body) = exchange(req, &url, 5, "; is it running (vacancyd run)?", &url).await?;
    if !status.is_success() {
        return Err(ClientError::Status { url, status });
    }
    serde_json::from_slice(&body).map_err(|e| ClientError::NotJson {
        url,
        reason: e.to_string(),
    })
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A JSON array of names as `a,b,c`.
fn joined(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// The status as text: resources, upstreams (admitting or why not), work, and
/// one line per held entry (HELD-03).
pub fn render(status: &Value) -> String {
    let mut out = String::new();
    render_lending(&mut out, status);
    render_terms(&mut out, status);
    render_resources(&mut out, status);
    render_upstreams(&mut out, status);
    render_work(&mut out, status);
    render_reclaims_and_settings(&mut out, status);
    out
}

/// The lending switch, the owner and the owner veto.
fn render_lending(out: &mut String, status: &Value) {
    let on = |b: &Value| {
        if b.as_bool() == Some(true) {
            "on"
        } else {
            "off"
        }
    };
    let _ = writeln!(
        out,
        "lending {}; owner {} (presence {})",
        on(&status["lending"]),
        s(&status["owner"]),
        s(&status["presence_backend"])
    );
    let veto = &status["owner_veto"];
    if veto["active"].as_bool() == Some(true) {
        let exempt: Vec<String> = veto["exempt_upstreams"]
            .as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default();
        if exempt.is_empty() {
            let _ = writeln!(out, "owner veto: paused ({})", s(&veto["reason"]));
        } else {
            let _ = writeln!(
                out,
                "owner veto: paused for host-scoped upstreams only ({}); still lending: {}",
                s(&veto["reason"]),
                exempt.join(", ")
            );
        }
    }
}

/// The owner's terms in force beyond presence (issue 35), one line each:
/// whether it refuses now (with the code), what it reads, what was set.
fn render_terms(out: &mut String, status: &Value) {
    let terms = status["terms"].as_array().cloned().unwrap_or_default();
    if terms.is_empty() {
        return;
    }
    let _ = writeln!(out, "terms:");
    for t in &terms {
        let name = match (t["term"].as_str(), t["resource"].as_str()) {
            (Some("lending_hours"), _) => "lending hours".to_owned(),
            (Some("heat"), Some(r)) => format!("heat {r}"),
            (Some(other), _) => other.to_owned(),
            (None, _) => "-".to_owned(),
        };
        let verdict = if t["refusing"].as_bool() == Some(true) {
            format!("REFUSING {}", s(&t["code"]))
        } else {
            "admits".to_owned()
        };
        let _ = writeln!(
            out,
            "  {:<14} {}: {} ({})",
            name,
            verdict,
            s(&t["now"]),
            s(&t["in_force"])
        );
    }
}

/// One line per resource: its free memory, reserve, sample age and state.
fn render_resources(out: &mut String, status: &Value) {
    let _ = writeln!(out, "\nresources:");
    for r in status["resources"].as_array().into_iter().flatten() {
        let state = if r["enabled"].as_bool() == Some(false) {
            "switched off".to_owned()
        } else if !r["reserved_by"].is_null() {
            format!("reserved by {}", s(&r["reserved_by"]))
        } else if !r["capacity_unknown"].is_null() {
            format!("capacity unknown: {}", s(&r["capacity_unknown"]))
        } else if r["awaiting_fresh_sample"].as_bool() == Some(true) {
            "awaiting a post-job sample".to_owned()
        } else {
            "free".to_owned()
        };
        let _ = writeln!(
            out,
            "  {:<10} {:<7} free {:>7}/{:<7} MiB  reserve {:>6}  sample {:>6} ms  {}",
            s(&r["name"]),
            s(&r["kind"]),
            s(&r["free_mib"]),
            s(&r["total_mib"]),
            s(&r["reserve_mib"]),
            s(&r["sample_age_ms"]),
            state
        );
    }
}

/// One line per upstream, with its residency evidence and its wait line.
fn render_upstreams(out: &mut String, status: &Value) {
    let _ = writeln!(out, "\nupstreams:");
    for u in status["upstreams"].as_array().into_iter().flatten() {
        let v = &u["vacancy"];
        let admitting = if v["admitting"].as_bool() == Some(true) {
            "admitting".to_owned()
        } else if let Some(ahead) = v["queueing"].as_u64() {
            // Issue 30: a new request would wait its turn in the line.
            format!("queueing ({ahead} waiting): {}", s(&v["reason"]))
        } else {
            format!("not admitting: {}: {}", s(&v["code"]), s(&v["reason"]))
        };
        let reach = match u["reachable"].as_bool() {
            Some(true) => "reachable".to_owned(),
            Some(false) => format!("UNREACHABLE ({})", s(&u["error"])),
            None => "not checked yet".to_owned(),
        };
        let exempt = if u["owner_scope"] == "resource" {
            " [owner-exempt]"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:<12} {:<9} {} -> {}  {}; {}{}",
            s(&u["name"]),
            s(&u["adapter"]),
            s(&u["listen"]),
            s(&u["target"]),
            reach,
            admitting,
            exempt
        );
        // RES-22: what the last observation proves about loaded models.
        for line in u["residency"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "    model {}", s(line));
        }
        // Issue 22: the wait line, when anyone waits.
        if let Some(waiting) = u["line"]["waiting"].as_u64().filter(|n| *n > 0) {
            let oldest = u["line"]["oldest_wait_s"].as_f64().unwrap_or(0.0);
            let _ = writeln!(
                out,
                "    line: {waiting} waiting, the oldest for {oldest:.1}s"
            );
        }
    }
}

/// One line per work entry, then one per held entry (HELD-03).
fn render_work(out: &mut String, status: &Value) {
    let work = status["work"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "\nwork: {} entr{}",
        work.len(),
        if work.len() == 1 { "y" } else { "ies" }
    );
    for w in &work {
        let borrower = match w["borrower"].as_str() {
            Some(b) => format!("  for {b}"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}  {:>6}s  {:<12} {:<10} {}{}",
            s(&w["id"]),
            s(&w["age_s"]),
            s(&w["upstream"]),
            s(&w["phase"]),
            joined(&w["resources"]),
            borrower
        );
    }
    for w in work.iter().filter(|w| w["phase"] == "held") {
        let at_upstream = match w["upstream_ref"].as_str() {
            Some(r) => format!(" (at the upstream: {r})"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "held {} age {}s upstream {}{} resources {}: {}",
            s(&w["id"]),
            s(&w["age_s"]),
            s(&w["upstream"]),
            at_upstream,
            joined(&w["resources"]),
            s(&w["held_reason"])
        );
    }
}

/// Reclaims under way, and saved settings a restart would apply (SCOPE-03).
fn render_reclaims_and_settings(out: &mut String, status: &Value) {
    for r in status["reclaims"].as_array().into_iter().flatten() {
        let deadline = match r["deadline_in_ms"].as_u64() {
            Some(ms) => format!(", deadline in {} s", ms.div_ceil(1000)),
            None => String::new(),
        };
        let holds = if r["holds"].as_bool() == Some(true) {
            ", holding its resources (yield_on_veto)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{} upstream {}: {} {}{}{} ({})",
            s(&r["id"]),
            s(&r["upstream"]),
            s(&r["mode"]),
            s(&r["stage"]),
            deadline,
            holds,
            s(&r["trigger"])
        );
    }
    // SCOPE-03: the running settings stay authoritative until a restart.
    let pending: Vec<String> = status["settings"]["pending"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    if !pending.is_empty() {
        let _ = writeln!(
            out,
            "saved settings differ from the running ones: {}; a restart applies them",
            pending.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_term_in_force_gets_one_line_saying_whether_it_refuses() {
        // Issue 35 item 4.
        let status = serde_json::json!({
            "lending": true, "owner": "away", "presence_backend": "none",
            "owner_veto": {"active": false, "reason": null, "exempt_upstreams": []},
            "resources": [], "upstreams": [], "work": [], "reclaims": [],
            "terms": [
                {"term": "lending_hours", "resource": null, "state": "open", "refusing": false, "code": null,
                 "now": "open; lending closes at Tue 2026-12-08 08:00 CET, in 9 h 0 min",
                 "in_force": "[lending] hours: Mon-Fri 19:00-08:00; time zone Europe/Berlin"},
                {"term": "battery", "resource": null, "state": "battery", "refusing": true, "code": "on_battery",
                 "now": "on battery", "in_force": "[owner] on_battery = \"pause\""},
                {"term": "heat", "resource": "gpu0", "state": "breach", "refusing": true, "code": "gpu_too_hot",
                 "now": "85 °C (120 ms ago)", "in_force": "gpu0: max_temperature_c = 80 (resume_below_c = 75), hot_for_s = 30"}
            ]
        });
        let text = render(&status);
        assert!(text.contains("terms:\n  lending hours  admits: open; lending closes at Tue 2026-12-08 08:00 CET, in 9 h 0 min ([lending] hours: Mon-Fri 19:00-08:00; time zone Europe/Berlin)\n"), "{text}");
        assert!(text.contains("  battery        REFUSING on_battery: on battery ([owner] on_battery = \"pause\")\n"), "{text}");
        assert!(text.contains("  heat gpu0      REFUSING gpu_too_hot: 85 °C (120 ms ago) (gpu0: max_temperature_c = 80"), "{text}");
        // No terms configured: no section.
        let none = serde_json::json!({"lending": true, "owner": "away", "owner_veto": {"active": false}, "terms": []});
        assert!(!render(&none).contains("terms:"));
    }

    #[test]
    fn reclaims_under_way_get_a_line() {
        let status = serde_json::json!({
            "lending": true, "owner": "present", "presence_backend": "logind",
            "owner_veto": {"active": true, "reason": "the owner is present", "exempt_upstreams": []},
            "resources": [], "upstreams": [], "work": [],
            "reclaims": [{"id": "reclaim-3", "upstream": "ollama", "mode": "drain", "stage": "waiting",
                          "deadline_in_ms": 11_500, "holds": true, "trigger": "owner return: the owner is present"}]
        });
        let text = render(&status);
        assert!(
            text.contains("reclaim-3 upstream ollama: drain waiting, deadline in 12 s, holding its resources (yield_on_veto) (owner return: the owner is present)"),
            "{text}"
        );
    }

    #[test]
    fn saved_settings_that_differ_get_a_line() {
        // SCOPE-03
        let status = serde_json::json!({
            "lending": true, "owner": "away", "presence_backend": "none",
            "owner_veto": {"active": false, "reason": null, "exempt_upstreams": []},
            "resources": [], "upstreams": [], "work": [], "reclaims": [],
            "settings": {"config_path": "/etc/vacancyd/vacancyd.toml", "pending": ["resource.gpu0.reserve_mib", "upstream.llama.owner_scope"]}
        });
        assert!(
            render(&status).contains("saved settings differ from the running ones: resource.gpu0.reserve_mib, upstream.llama.owner_scope; a restart applies them"),
            "{}",
            render(&status)
        );
    }

    #[test]
    fn held_entries_get_a_line_and_exempt_upstreams_are_named() {
        // HELD-03, SCOPE-15
        let status = serde_json::json!({
            "lending": true, "owner": "present", "presence_backend": "manual",
            "owner_veto": {"active": true, "reason": "the owner is present", "exempt_upstreams": ["tts"]},
            "resources": [{"name": "gpu0", "kind": "gpu", "free_mib": 1, "total_mib": 2, "reserve_mib": 0,
                           "sample_age_ms": 5, "enabled": true, "reserved_by": "e1", "capacity_unknown": null}],
            "upstreams": [{"name": "tts", "adapter": "openai", "listen": "a", "target": "b", "reachable": true,
                           "owner_scope": "resource", "vacancy": {"admitting": true},
                           "residency": ["qwen3-tts: loaded; not proven (busy)"],
                           "line": {"waiting": 3, "oldest_wait_s": 4.25}}],
            "work": [{"id": "e1", "age_s": 12, "upstream": "llama", "phase": "held",
                      "resources": ["gpu0", "ram"], "held_reason": "cut"}]
        });
        let text = render(&status);
        assert!(
            text.contains("held e1 age 12s upstream llama resources gpu0,ram: cut"),
            "{text}"
        );
        assert!(
            text.contains("paused for host-scoped upstreams only"),
            "{text}"
        );
        assert!(text.contains("still lending: tts"), "{text}");
        assert!(text.contains("[owner-exempt]"), "{text}");
        assert!(text.contains("reserved by e1"), "{text}");
        assert!(!text.contains("saved settings differ"), "{text}");
        // RES-22
        assert!(
            text.contains("    model qwen3-tts: loaded; not proven (busy)"),
            "{text}"
        );
        // Issue 22
        assert!(
            text.contains("    line: 3 waiting, the oldest for 4.2s"),
            "{text}"
        );
    }
}
