#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn wrong() -> GateOutcome {
    GateOutcome::Wrong {
        expected: EXPECTED.into(),
        actual: "<|im_end|>".into(),
        probe: Probe::ChatCompletions,
        heard: vec![
            Heard {
                probe: Probe::Completion,
                said: " the capital of the country of France.".into(),
            },
            Heard {
                probe: Probe::ChatCompletions,
                said: "<|im_end|>".into(),
            },
        ],
    }
}

fn unanswered() -> GateOutcome {
    GateOutcome::Unanswered {
        probe: Probe::Completion,
        reason: "POST http://x/completion: no reply within 30.0 s".into(),
        heard: vec![],
    }
}

fn passed() -> GateOutcome {
    GateOutcome::Passed {
        probe: Probe::Completion,
        answer: " Paris.".into(),
    }
}

// GATE-01 / SLOT-05: only a passing gate publishes READY.
#[test]
fn gate_01_only_passed_is_ready() {
    assert_eq!(passed().next_state(), GateNextState::Ready);
    assert_ne!(wrong().next_state(), GateNextState::Ready);
    assert_ne!(unanswered().next_state(), GateNextState::Ready);
}

// GATE-05: a wrong answer is terminal: ERROR, 500 SlotOutputSanityFailed.
#[test]
fn gate_05_wrong_is_error_with_500() {
    let w = wrong();
    assert_eq!(w.next_state(), GateNextState::Error);
    assert_eq!(w.load_error(), Some((500, "SlotOutputSanityFailed")));
    assert_eq!(passed().load_error(), None);
    assert_eq!(unanswered().load_error(), None);
}

// GATE-05: the message names the probe, the expected token and what was said.
#[test]
fn gate_05_message_names_probe_expected_and_actual() {
    let text = wrong().to_string();
    assert!(text.contains("POST /v1/chat/completions"), "{text}");
    assert!(text.contains("\"Paris\""), "{text}");
    assert!(text.contains("<|im_end|>"), "{text}");
    // And the first, raw-completion answer too.
    assert!(text.contains("POST /completion"), "{text}");
    assert!(
        text.contains("the capital of the country of France."),
        "{text}"
    );
}

// GATE-06 / GATE-07: a wrong answer stops the unit and records the verdict.
#[test]
fn gate_06_07_wrong_stops_unit_and_records_verdict() {
    assert!(wrong().stops_unit());
    assert!(wrong().records_verdict());
}

// GATE-08: only a pass clears the verdict.
#[test]
fn gate_08_only_pass_clears_verdict() {
    assert!(passed().clears_verdict());
    assert!(!wrong().clears_verdict());
    assert!(!unanswered().clears_verdict());
}

// GATE-09: unanswered → WARMING; the unit is left alone; nothing stamped.
#[test]
fn gate_09_unanswered_is_warming_and_touches_nothing() {
    let u = unanswered();
    assert_eq!(u.next_state(), GateNextState::Warming);
    assert!(!u.stops_unit());
    assert!(!u.records_verdict());
    assert!(!u.passed());
    assert!(u.to_string().contains("no reply within"), "{u}");
}

// GATE-10: the CPU lane's budget is wider; its token limits are the same.
#[test]
fn gate_10_cpu_budget_is_wider() {
    let gpu = GateOptions::accelerated();
    let cpu = GateOptions::cpu();
    assert!(cpu.completion_timeout > gpu.completion_timeout);
    assert!(cpu.chat_timeout > gpu.chat_timeout);
    assert!(cpu.worst_case() > gpu.worst_case());
    assert_eq!(cpu.completion_tokens, gpu.completion_tokens);
    assert_eq!(cpu.chat_tokens, gpu.chat_tokens);
    assert_eq!(GateOptions::for_device("cpu"), cpu);
    assert_eq!(GateOptions::for_device(" CPU "), cpu);
    assert_eq!(GateOptions::for_device("gpu"), gpu);
    assert_eq!(GateOptions::for_device("npu"), gpu);
    assert_eq!(GateOptions::default(), gpu);
}

// GATE-04: the chat retry leaves room for a <think> block.
#[test]
fn gate_04_chat_has_room_for_think() {
    let o = GateOptions::accelerated();
    assert!(o.chat_tokens >= 512);
    assert!(o.chat_tokens > o.completion_tokens);
}

// GATE-01, GATE-11, GATE-12, GATE-13, GATE-14: which loads are gated.
#[test]
fn gate_01_11_12_13_14_scope() {
    use Runtime::*;
    use SlotType::*;
    assert!(is_gated(Llm, LlamaServer, None, None));
    for t in [Embedding, Reranking, Tts, Stt, Image] {
        assert!(!is_gated(t, LlamaServer, None, None), "GATE-11 {t:?}");
    }
    assert!(!is_gated(Llm, FlmNpu, None, None), "GATE-12");
    assert!(!is_gated(Llm, LlamaServer, Some("0"), None), "GATE-13");
    assert!(!is_gated(Llm, LlamaServer, Some(" 0\n"), None), "GATE-13");
    for on in ["1", "", "true", "yes"] {
        assert!(is_gated(Llm, LlamaServer, Some(on), None), "GATE-13 {on:?}");
    }
    assert!(!is_gated(Llm, LlamaServer, None, Some(false)), "GATE-14");
    assert!(is_gated(Llm, LlamaServer, None, Some(true)), "GATE-14");
    assert!(
        !is_gated(Llm, LlamaServer, Some("0"), Some(true)),
        "GATE-13 wins"
    );
}

#[test]
fn completion_content_parsing() {
    let ok = serde_json::json!({"content": " Paris.", "stop": true});
    assert_eq!(completion_content(&ok).unwrap(), " Paris.");
    for bad in [
        serde_json::json!({}),
        serde_json::json!({"content": 3}),
        serde_json::json!([1, 2]),
    ] {
        assert!(completion_content(&bad).is_err(), "{bad}");
    }
}

fn chat(content: Value, reasoning: Option<&str>, finish: &str) -> Value {
    let mut message = serde_json::json!({"role": "assistant", "content": content});
    if let Some(r) = reasoning {
        message["reasoning_content"] = Value::String(r.into());
    }
    serde_json::json!({"choices": [{"index": 0, "message": message, "finish_reason": finish}]})
}

// GATE-04: the retry's answer is judged without its think block.
#[test]
fn gate_04_chat_answer_strips_think() {
    let r = chat(json!("<think>Hmm, France.</think>\n\nParis"), None, "stop");
    assert_eq!(chat_answer(&r).unwrap(), "Paris");
    // Reasoning split out by the server: content is the answer.
    let r = chat(json!("Paris."), Some("France's capital..."), "stop");
    assert_eq!(chat_answer(&r).unwrap(), "Paris.");
}

// GATE-09 (reading): reasoning cut off by the token limit is no answer.
#[test]
fn gate_09_cut_off_reasoning_is_no_answer() {
    let r = chat(json!("<think>Let me think about"), None, "length");
    assert!(chat_answer(&r).unwrap_err().contains("cut off"));
    let r = chat(json!(""), Some("Let me think about"), "length");
    assert!(chat_answer(&r).unwrap_err().contains("cut off"));
    // An empty answer that was not cut off is an answer (a wrong one).
    let r = chat(Value::Null, None, "stop");
    assert_eq!(chat_answer(&r).unwrap(), "");
}

#[test]
fn chat_answer_malformed_replies_are_reasons() {
    for bad in [
        serde_json::json!({}),
        serde_json::json!({"choices": []}),
        serde_json::json!({"choices": [{"index": 0}]}),
        serde_json::json!({"choices": [{"message": {"content": 5}}]}),
    ] {
        assert!(chat_answer(&bad).is_err(), "{bad}");
    }
}

// GATE-09: a refused connection is an unanswered probe, never a panic, and
// buys no retry.
#[tokio::test]
async fn gate_09_refused_connection_is_unanswered() {
    let (_refusing, addr) = crate::test_prereq::refusing_port();
    let port = addr.port();
    let outcome = check_output_sanity(
        &format!("http://127.0.0.1:{port}"),
        &GateOptions::accelerated(),
    )
    .await;
    match &outcome {
        GateOutcome::Unanswered {
            probe: Probe::Completion,
            reason,
            heard,
        } => {
            assert!(reason.contains("/completion"), "{reason}");
            assert!(heard.is_empty());
        }
        other => panic!("expected Unanswered, got {other:?}"),
    }
    assert_eq!(outcome.next_state(), GateNextState::Warming);
}

#[test]
fn probe_paths() {
    assert_eq!(Probe::Completion.path(), "/completion");
    assert_eq!(Probe::ChatCompletions.path(), "/v1/chat/completions");
    assert_eq!(Probe::Completion.to_string(), "POST /completion");
}
