//! The JSON body checks every work request passes, on every adapter.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::error::Category;
use vacancy::RefusalCode;
use vacancy::traits::{InspectError, InspectResult, Inspection, WorkRoute};

/// The OpenAI Responses route, whose background mode vacancy refuses (ROUTE-05).
///
/// Compared with the borrower's path without its query (ROUTE-05..07).
pub const RESPONSES_PATH: &str = "/v1/responses";

/// The path without its query string.
///
/// `/v1/responses?x=1` is `/v1/responses`; route decisions never depend on
/// the query (ROUTE-01).
pub fn request_path(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

/// Whether a borrower's path is the OpenAI Responses route.
///
/// # Behavior
///
/// The path is the borrower's, as received: relative to the upstream's API
/// root, so it never carries the target's prefix (the daemon prepends that
/// when it forwards). The query is ignored (ROUTE-05, ROUTE-07).
pub fn is_responses_path(path: &str) -> bool {
    request_path(path) == RESPONSES_PATH
}

const NO_BACKGROUND: &str =
    "send the request without background, streaming it where the client wants progress";

fn unsupported(message: String) -> InspectError {
    InspectError {
        code: RefusalCode::UnsupportedRequest,
        message,
    }
}

/// What a borrower whose body could not be read should send instead.
const SEND_JSON: &str = "send the request body as one JSON object, as the upstream's API documents";

/// Inspect a JSON work request: the model it names and, on `POST /v1/responses`,
/// the background rule.
///
/// # Behavior
///
/// - `path` is the borrower's path as received (see [`is_responses_path`]).
/// - On `/v1/responses`, on every adapter (ROUTE-07): a body that is not a
///   JSON object vacancy can read is 400 `unsupported_request` (ROUTE-06);
///   `"background": true` is 400 `unsupported_request` (ROUTE-05); absent,
///   `null` or `false` is allowed; any other value, or `background` named
///   twice, cannot rule background mode out and is refused too (ROUTE-05
///   Ambiguity reading). Streamed or not, a request without background is
///   inspected like any other.
/// - Elsewhere, a body that is not JSON (UTF-8 text, RFC 8259), or JSON that
///   is not an object, is 400 `invalid_request` naming the problem.
/// - `model`, when present, must be a string and is kept exactly as written
///   (MEM-06); another type, or `model` named twice (the upstream might read
///   either), is 400 `invalid_request`.
/// - A route that does not inspect its body (`inspect_body == false`) is
///   passed through untouched, except `/v1/responses`, which is always read.
/// - Nothing but `model` and `background` is kept: prompt contents are never
///   copied (other values are skipped while parsing).
pub fn inspect_json_body(route: &WorkRoute, path: &str, body: &[u8]) -> InspectResult {
    let responses = is_responses_path(path);
    if !route.inspect_body && !responses {
        return Ok(Inspection::default());
    }
    let parsed = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str::<TopLevel>(text).map_err(|e| match e.classify() {
            Category::Data => format!("the body is not a JSON object: {e}"),
            Category::Io | Category::Syntax | Category::Eof => {
                format!("the body is not valid JSON: {e}")
            }
        }),
        Err(e) => Err(format!(
            "the body is not valid JSON: it is not UTF-8 text (invalid byte at offset {})",
            e.valid_up_to()
        )),
    };
    let top = match parsed {
        Ok(top) => top,
        Err(problem) => {
            return Err(if responses {
                unsupported(format!(
                    "POST {RESPONSES_PATH} needs a body that is a JSON object vacancy can read, to rule out background mode, and {problem}; send a JSON object, without background"
                ))
            } else {
                InspectError::invalid(format!("{problem}; {SEND_JSON}"))
            });
        }
    };
    if responses {
        check_background(&top)?;
    }
    let model = match (&top.model, top.model_repeated) {
        (_, true) => {
            return Err(InspectError::invalid(
                "the body names \"model\" more than once; name the model once",
            ));
        }
        (None, false) => None,
        (Some(Value::String(m)), false) => Some(m.clone()),
        (Some(other), false) => {
            return Err(InspectError::invalid(format!(
                "\"model\" must be a string naming the model, not {}",
                kind(other)
            )));
        }
    };
    Ok(Inspection {
        model,
        ..Inspection::default()
    })
}

fn check_background(top: &TopLevel) -> Result<(), InspectError> {
    if top.background_repeated {
        return Err(unsupported(format!(
            "the body names \"background\" more than once, so background mode cannot be ruled out; {NO_BACKGROUND}"
        )));
    }
    match &top.background {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(Value::Bool(true)) => Err(unsupported(format!(
            "background mode is not supported through vacancy: a background response keeps generating after its reply, so vacancy could not tell when the hardware is free again; {NO_BACKGROUND}"
        ))),
        Some(other) => Err(unsupported(format!(
            "\"background\" must be true, false or null, and {} cannot rule out background mode; {NO_BACKGROUND}",
            kind(other)
        ))),
    }
}

/// A JSON value's type, never its contents.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The top level of a JSON object body: the two members inspection reads,
/// and whether either is repeated. Every other member is skipped unparsed.
#[derive(Debug, Default)]
struct TopLevel {
    model: Option<Value>,
    model_repeated: bool,
    background: Option<Value>,
    background_repeated: bool,
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(TopLevelVisitor)
    }
}

struct TopLevelVisitor;

impl<'de> Visitor<'de> for TopLevelVisitor {
    type Value = TopLevel;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevel, A::Error> {
        let mut top = TopLevel::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "model" => {
                    let v: Value = map.next_value()?;
                    top.model_repeated |= top.model.is_some();
                    top.model = Some(v);
                }
                "background" => {
                    let v: Value = map.next_value()?;
                    top.background_repeated |= top.background.is_some();
                    top.background = Some(v);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(top)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const WORK: WorkRoute = WorkRoute::response_end();

    fn ok(path: &str, body: &str) -> Option<String> {
        inspect_json_body(&WORK, path, body.as_bytes())
            .unwrap()
            .model
    }

    fn err(path: &str, body: &[u8]) -> InspectError {
        inspect_json_body(&WORK, path, body).unwrap_err()
    }

    #[test]
    fn the_model_is_kept_exactly_as_written() {
        // MEM-06
        assert_eq!(
            ok(
                "/v1/chat/completions",
                r#"{"model":" Llama-3:8B ","messages":[]}"#
            )
            .as_deref(),
            Some(" Llama-3:8B ")
        );
        assert_eq!(ok("/v1/chat/completions", r#"{"messages":[]}"#), None);
        assert_eq!(
            ok("/completion", r#"{"mod\u0065l":"escaped"}"#).as_deref(),
            Some("escaped")
        );
        assert_eq!(
            ok("/completion", r#"{"prompt":{"model":"nested"}}"#),
            None,
            "only the top level names the model"
        );
    }

    #[test]
    fn a_body_that_is_not_json_is_invalid_request_naming_the_problem() {
        let e = err("/v1/chat/completions", b"");
        assert_eq!(e.code, RefusalCode::InvalidRequest);
        assert_eq!(
            e.message,
            "the body is not valid JSON: EOF while parsing a value at line 1 column 0; send the request body as one JSON object, as the upstream's API documents"
        );
        let e = err("/v1/chat/completions", b"model=x");
        assert_eq!(
            e.message,
            "the body is not valid JSON: expected value at line 1 column 1; send the request body as one JSON object, as the upstream's API documents"
        );
        let e = err("/completion", br#"{"model":"m"} trailing"#);
        assert!(
            e.message
                .starts_with("the body is not valid JSON: trailing characters")
        );
        let e = err("/completion", b"{\"prompt\":\"\xff\"}");
        assert_eq!(e.code, RefusalCode::InvalidRequest);
        assert_eq!(
            e.message,
            "the body is not valid JSON: it is not UTF-8 text (invalid byte at offset 11); send the request body as one JSON object, as the upstream's API documents"
        );
    }

    #[test]
    fn json_that_is_not_an_object_is_invalid_request() {
        for (body, what) in [
            ("[1,2]", "sequence"),
            ("\"text\"", "string"),
            ("42", "integer"),
            ("null", "null"),
        ] {
            let e = err("/v1/embeddings", body.as_bytes());
            assert_eq!(e.code, RefusalCode::InvalidRequest, "{body}");
            assert!(
                e.message
                    .starts_with("the body is not a JSON object: invalid type: ")
                    && e.message.contains(what)
                    && e.message.contains("expected a JSON object"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn a_model_that_is_not_a_string_is_invalid_request() {
        for (body, what) in [
            (r#"{"model":7}"#, "a number"),
            (r#"{"model":null}"#, "null"),
            (r#"{"model":["a"]}"#, "an array"),
            (r#"{"model":{"name":"a"}}"#, "an object"),
        ] {
            let e = err("/v1/chat/completions", body.as_bytes());
            assert_eq!(e.code, RefusalCode::InvalidRequest);
            assert_eq!(
                e.message,
                format!("\"model\" must be a string naming the model, not {what}")
            );
        }
        let e = err("/v1/chat/completions", br#"{"model":"a","model":"b"}"#);
        assert_eq!(e.code, RefusalCode::InvalidRequest);
        assert!(e.message.contains("more than once"));
    }

    #[test]
    fn responses_background_true_and_undecidable_values_are_unsupported() {
        // ROUTE-05 and its Ambiguity reading
        for body in [
            r#"{"model":"m","background":true}"#,
            r#"{"background":"yes"}"#,
            r#"{"background":"true"}"#,
            r#"{"background":1}"#,
            r#"{"background":0}"#,
            r#"{"background":{}}"#,
            r#"{"background":[]}"#,
            r#"{"background":false,"background":true}"#,
            r#"{"background":null,"background":null}"#,
        ] {
            let e = err("/v1/responses", body.as_bytes());
            assert_eq!(e.code, RefusalCode::UnsupportedRequest, "{body}");
            assert!(e.message.contains("without background"), "{}", e.message);
            assert!(
                e.message
                    .contains("streaming it where the client wants progress")
            );
        }
        assert_eq!(
            err("/v1/responses?stream=1", br#"{"background":true}"#).code,
            RefusalCode::UnsupportedRequest
        );
    }

    #[test]
    fn responses_without_background_is_inspected_normally() {
        // ROUTE-05, ROUTE-07: absent, null, false; streamed or not.
        for body in [
            r#"{"model":"m","input":"hi"}"#,
            r#"{"model":"m","background":null}"#,
            r#"{"model":"m","background":false,"stream":true}"#,
        ] {
            assert_eq!(ok("/v1/responses", body).as_deref(), Some("m"), "{body}");
        }
    }

    #[test]
    fn an_unreadable_responses_body_is_unsupported_not_invalid() {
        // ROUTE-06
        for body in [
            &b""[..],
            b"{",
            b"[]",
            b"\"background\"",
            b"null",
            b"\xff\xfe",
        ] {
            let e = err("/v1/responses", body);
            assert_eq!(e.code, RefusalCode::UnsupportedRequest, "{body:?}");
            assert!(
                e.message.starts_with(
                    "POST /v1/responses needs a body that is a JSON object vacancy can read, to rule out background mode"
                ),
                "{}",
                e.message
            );
        }
        // A readable object with a bad model stays invalid_request.
        assert_eq!(
            err("/v1/responses", br#"{"model":1}"#).code,
            RefusalCode::InvalidRequest
        );
    }

    #[test]
    fn background_elsewhere_is_not_inspection_s_business() {
        // ROUTE-05 concerns POST /v1/responses only.
        assert_eq!(
            ok("/v1/chat/completions", r#"{"model":"m","background":true}"#).as_deref(),
            Some("m")
        );
        assert_eq!(ok("/v1/responsesX", r#"{"background":true}"#), None);
    }

    #[test]
    fn routes_that_do_not_inspect_pass_except_responses() {
        let blind = WorkRoute {
            inspect_body: false,
            ..WorkRoute::response_end()
        };
        assert_eq!(
            inspect_json_body(&blind, "/upload", b"\x00binary").unwrap(),
            Inspection::default()
        );
        assert_eq!(
            inspect_json_body(&blind, "/v1/responses", br#"{"background":true}"#)
                .unwrap_err()
                .code,
            RefusalCode::UnsupportedRequest
        );
    }

    #[test]
    fn the_query_is_ignored() {
        assert_eq!(request_path("/v1/responses?a=b?c"), "/v1/responses");
        assert!(is_responses_path("/v1/responses?x"));
        assert!(!is_responses_path("/llm/v1/responses"));
    }
}
