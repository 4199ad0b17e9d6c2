//! What the daemon relies on from `inspect`: a body it cannot read is refused,
//! never guessed at; the model is kept exactly as written; the Responses
//! background rule holds on every adapter; a route that does not read its
//! body accepts the empty body it is handed.

use bytes::Bytes;

use crate::engine::{EntryId, RefusalCode};
use crate::traits::{Adapter, InspectContext, InspectResult, RouteClass, RouteMethod};

use super::{WorkSample, outcome};

/// The OpenAI Responses route: wherever an adapter lists it as work, its
/// background mode is refused (ROUTE-05..07).
pub const RESPONSES_PATH: &str = "/v1/responses";

/// A model name no configuration writes, with a capital, a colon, a slash and
/// a trailing space: inspection must return it byte for byte (MEM-06).
const ODD_MODEL: &str = "Vacancy-Testkit/Model:1 ";

/// Bodies no JSON route can read.
const UNREADABLE: [&[u8]; 5] = [b"not json", b"[1]", b"\"s\"", b"", b"\xff\xfe"];

fn inspect(
    adapter: &dyn Adapter,
    method: &http::Method,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<InspectResult, String> {
    let RouteClass::Work(route) = adapter.classify(method, path) else {
        return Err(format!("{method} {path} is not work in the route table"));
    };
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        headers.insert(http::header::CONTENT_TYPE, v);
    }
    let ctx = InspectContext {
        entry: EntryId::from_u128(0x7e57),
        method,
        path,
        headers: &headers,
    };
    // The daemon hands a route that does not read its body an empty one.
    let body = if route.inspect_body { body } else { b"" };
    Ok(adapter.inspect(&route, ctx, body))
}

fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// `body` with its top-level `"model"` set to `model`, if it is a JSON object naming one.
fn with_model(body: &Bytes, model: &str) -> Option<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    obj.get("model")?.as_str()?;
    obj.insert("model".to_owned(), model.into());
    serde_json::to_vec(&v).ok()
}

/// Inspection on the adapter's own table, for each work `sample` and for
/// every work route at [`RESPONSES_PATH`]:
///
/// - each sample inspects cleanly;
/// - a JSON sample naming a model keeps an odd model name exactly (MEM-06);
/// - a JSON route refuses a body that is not a JSON object with 400
///   `invalid_request` or `invalid_submission` (`unsupported_request` on the
///   Responses route, ROUTE-06), and where the sample names a model, a
///   `model` that is not a string or is named twice as well;
/// - a route that does not read its body accepts the empty body the daemon
///   hands it (it can never learn more);
/// - on the Responses route: `"background": true`, a value that is not a
///   boolean and `background` named twice are 400 `unsupported_request`;
///   absent, `null` and `false` pass, with or without a query (ROUTE-05..07);
///   the route must read its body.
// Long: the kit's inspection checks, one after another, each with the message an adapter author reads.
pub fn check_inspection(adapter: &dyn Adapter, samples: &[WorkSample]) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    for s in samples {
        let (method, path, ct) = (&s.method, s.path.as_str(), s.content_type.as_str());
        let at = format!("{method} {path}");
        match inspect(adapter, method, path, ct, &s.body) {
            Err(e) => {
                problems.push(e);
                continue;
            }
            Ok(Err(e)) => problems.push(format!("{at}: the sample itself was refused: {e}")),
            Ok(Ok(_)) => {}
        }
        let reads_body =
            matches!(adapter.classify(method, path), RouteClass::Work(w) if w.inspect_body);
        if !reads_body {
            continue;
        }
        if !is_json(ct) {
            continue;
        }
        let odd = with_model(&s.body, ODD_MODEL);
        let names_model = odd.is_some();
        if let Some(body) = odd {
            match inspect(adapter, method, path, ct, &body) {
                Ok(Ok(i)) if i.model.as_deref() == Some(ODD_MODEL) => {}
                Ok(Ok(i)) => problems.push(format!(
                    "MEM-06: {at}: the model {ODD_MODEL:?} was inspected as {:?}; keep it exactly as written",
                    i.model
                )),
                Ok(Err(e)) => problems.push(format!(
                    "MEM-06: {at}: the model {ODD_MODEL:?} was refused: {e}"
                )),
                Err(e) => problems.push(e),
            }
        }
        // ComfyUI-style submissions refuse with invalid_submission: also a 400 that names the body.
        let want: &[RefusalCode] = if is_responses(path) {
            &[RefusalCode::UnsupportedRequest]
        } else {
            &[RefusalCode::InvalidRequest, RefusalCode::InvalidSubmission]
        };
        let wanted = want
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(" or ");
        // Where the request names a model, a model that is not one string is unreadable too.
        let model_bodies: &[&[u8]] = if names_model {
            &[br#"{"model":1}"#, br#"{"model":"a","model":"b"}"#]
        } else {
            &[]
        };
        let bad: Vec<&[u8]> = UNREADABLE.iter().chain(model_bodies).copied().collect();
        for body in bad {
            match inspect(adapter, method, path, ct, body) {
                Ok(Err(e)) if want.contains(&e.code) => {}
                Ok(Err(e)) => problems.push(format!(
                    "{at}: the body {:?} was refused with {}, expected {wanted}",
                    String::from_utf8_lossy(body),
                    e.code
                )),
                Ok(Ok(_)) => problems.push(format!(
                    "{at}: the body {:?} was accepted; a body inspection cannot read is refused with {wanted}, never guessed at",
                    String::from_utf8_lossy(body)
                )),
                Err(e) => problems.push(e),
            }
        }
    }
    for e in adapter.routes().entries() {
        if let RouteClass::Work(w) = e.class {
            if !w.inspect_body {
                let method = method_of(e.method);
                let path = super::concrete_path(e.path);
                match inspect(adapter, &method, &path, "application/octet-stream", b"") {
                    Ok(Err(err)) if err.code == RefusalCode::InvalidRequest => problems.push(format!(
                        "{method} {path} does not read its body, so the daemon hands inspect an empty one, and it was refused: {err}"
                    )),
                    _ => {}
                }
            }
            if e.path == RESPONSES_PATH {
                background_rule(adapter, method_of(e.method), w.inspect_body, &mut problems);
            }
        }
    }
    outcome(problems)
}

pub(super) fn is_responses(path: &str) -> bool {
    path.split('?').next() == Some(RESPONSES_PATH)
}

pub(super) fn method_of(m: RouteMethod) -> http::Method {
    match m {
        RouteMethod::Get => http::Method::GET,
        RouteMethod::Post => http::Method::POST,
        RouteMethod::Put => http::Method::PUT,
        RouteMethod::Delete => http::Method::DELETE,
        RouteMethod::Patch => http::Method::PATCH,
    }
}

fn background_rule(
    adapter: &dyn Adapter,
    method: http::Method,
    reads_body: bool,
    problems: &mut Vec<String>,
) {
    if !reads_body {
        problems.push(format!(
            "ROUTE-05: {method} {RESPONSES_PATH} must read its body (inspect_body) to rule out background mode"
        ));
        return;
    }
    let ct = "application/json";
    let refused: [&[u8]; 8] = [
        br#"{"model":"m","input":"hi","background":true}"#,
        br#"{"model":"m","input":"hi","background":"yes"}"#,
        br#"{"model":"m","input":"hi","background":1}"#,
        br#"{"model":"m","input":"hi","background":false,"background":true}"#,
        b"{",
        b"[]",
        b"",
        b"\xff",
    ];
    for path in [RESPONSES_PATH, "/v1/responses?vacancy-testkit=1"] {
        for body in refused {
            match inspect(adapter, &method, path, ct, body) {
                Ok(Err(e)) if e.code == RefusalCode::UnsupportedRequest => {}
                other => problems.push(format!(
                    "ROUTE-05..07: {method} {path} with {:?} gave {}, expected 400 unsupported_request (background mode cannot be ruled out)",
                    String::from_utf8_lossy(body),
                    shown(&other)
                )),
            }
        }
        for body in [
            &br#"{"model":"m","input":"hi"}"#[..],
            br#"{"model":"m","input":"hi","background":false}"#,
            br#"{"model":"m","input":"hi","background":null}"#,
            br#"{"model":"m","input":"hi","stream":true}"#,
        ] {
            match inspect(adapter, &method, path, ct, body) {
                Ok(Ok(i)) if i.model.as_deref() == Some("m") => {}
                other => problems.push(format!(
                    "ROUTE-05: {method} {path} with {:?} gave {}, expected it inspected with model \"m\"",
                    String::from_utf8_lossy(body),
                    shown(&other)
                )),
            }
        }
    }
}

fn shown(r: &Result<InspectResult, String>) -> String {
    match r {
        Ok(Ok(i)) => format!("an inspection with model {:?}", i.model),
        Ok(Err(e)) => format!("a refusal ({e})"),
        Err(e) => e.clone(),
    }
}
