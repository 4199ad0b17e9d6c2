//! Which rule reads a work request's body, and the inspection every
//! OpenAI-style adapter runs: one place for what OpenAI, llama-server,
//! chatterbox and vLLM each wrote before.

use vacancy::traits::{InspectContext, InspectResult, Inspection, WorkRoute};

use super::inspect::{inspect_json_body, is_responses_path};
use super::multipart::{is_multipart_form, multipart_model};

/// How a work request's body is read.
///
/// # Behavior
///
/// - `Json`: [`inspect_json_body`]: one JSON object, `model` a string kept
///   exactly (MEM-06).
/// - `Responses`: the same, and the background rule (ROUTE-05..07): always
///   read, whatever the content type says (a form is not a JSON object
///   vacancy can read, ROUTE-06).
/// - `Multipart`: the `model` field of a `multipart/form-data` upload, by
///   [`multipart_model`]; a form it cannot read is 400 `invalid_request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRule {
    /// A JSON object.
    Json,
    /// `POST /v1/responses`: a JSON object without background mode.
    Responses,
    /// A `multipart/form-data` upload.
    Multipart,
}

impl BodyRule {
    /// The rule for one request: `Responses` on `/v1/responses`, `Multipart`
    /// when the request says it is a form, `Json` otherwise.
    ///
    /// A body is read as JSON whatever else its content type says (`text/plain`
    /// included), as the upstreams read it.
    pub fn of(ctx: &InspectContext<'_>) -> BodyRule {
        if is_responses_path(ctx.path) {
            BodyRule::Responses
        } else if is_multipart_form(ctx.headers) {
            BodyRule::Multipart
        } else {
            BodyRule::Json
        }
    }
}

/// The request's `Content-Type`, `""` when absent or not text.
///
/// Only read, never logged.
pub fn content_type(headers: &http::HeaderMap) -> &str {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// Inspect a request of the OpenAI API by its [`BodyRule`]: the building
/// block for any adapter whose upstream speaks the `/v1` routes.
///
/// # Behavior
///
/// - `Multipart`: the form's `model` field ([`multipart_model`]); a form it
///   cannot read is 400 `invalid_request`, a form without `model` names no model.
/// - `Json` and `Responses`: [`inspect_json_body`]: a JSON object, `model`
///   one string kept exactly (MEM-06), the Responses background rule
///   (ROUTE-05..07).
/// - A route that does not read its body (`inspect_body == false`) is handed
///   an empty body by the daemon and passes, except `/v1/responses`.
pub fn inspect_request(route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
    match BodyRule::of(&ctx) {
        BodyRule::Json | BodyRule::Responses => inspect_json_body(route, ctx.path, body),
        BodyRule::Multipart if !route.inspect_body => Ok(Inspection::default()),
        BodyRule::Multipart => Ok(Inspection {
            model: multipart_model(content_type(ctx.headers), body)?,
            ..Inspection::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rule(path: &str, content_type: Option<&str>) -> BodyRule {
        let mut headers = http::HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
        }
        BodyRule::of(&InspectContext {
            entry: vacancy::EntryId::from_u128(1),
            method: &http::Method::POST,
            path,
            headers: &headers,
        })
    }

    #[test]
    fn the_rule_follows_the_path_then_the_content_type() {
        // ROUTE-06, ROUTE-07: /v1/responses is read as JSON whatever it says it is.
        let form = Some("multipart/form-data; boundary=b");
        assert_eq!(rule("/v1/responses?x=1", form), BodyRule::Responses);
        assert_eq!(rule("/v1/responses", None), BodyRule::Responses);
        assert_eq!(rule("/v1/audio/transcriptions", form), BodyRule::Multipart);
        assert_eq!(
            rule("/v1/chat/completions", Some("text/plain")),
            BodyRule::Json
        );
        assert_eq!(rule("/v1/chat/completions", None), BodyRule::Json);
    }
}
