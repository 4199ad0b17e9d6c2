//! A generic OpenAI-compatible server (vLLM, llama-cpp-python, LocalAI, a TTS
//! server ...): the `/v1` work routes, the model list, nothing else.

use async_trait::async_trait;
use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{Adapter, InspectContext, InspectResult, RouteSpec, RouteTable, WorkRoute};

pub use crate::common::inspect_request;
use crate::common::routes::{OPENAI_AUDIO_INPUT, OPENAI_V1, WORK};
use crate::common::{AdapterCore, AdapterSettings};

/// The OpenAI routes no other built-in adapter serves all of: speech and images.
const SPEECH_AND_IMAGES: &[RouteSpec] = crate::routes![
    Post WORK => ["/v1/audio/speech", "/v1/images/generations", "/v1/images/edits"];
];

/// The OpenAI-compatible route table, as data.
///
/// # Behavior
///
/// - Work (admitted, released at the clean end of the response, DONE-01):
///   `POST` `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
///   `/v1/responses`, `/v1/audio/speech`, `/v1/audio/transcriptions`,
///   `/v1/audio/translations`, `/v1/images/generations`, `/v1/images/edits`.
/// - Discovery, forwarded without admission and while lending is refused
///   (ROUTE-12): `GET` (and `HEAD`) `/v1/models` and `/v1/models/{id}` (one
///   path segment: an ID containing `/` is not matched, and so refused as an
///   unlisted read).
/// - Anything else is unknown: a GET/HEAD is 403, any other method 501
///   (ROUTE-01..03, via `route_policy`). There is no management route: the
///   API has none vacancy forwards by name.
pub const ROUTES: &[RouteSpec] =
    crate::join_routes![OPENAI_V1, OPENAI_AUDIO_INPUT, SPEECH_AND_IMAGES];

/// [`ROUTES`] as a checked [`RouteTable`].
///
/// Refused if two entries could match the same request (docs/adapter-guide.md#route-classes); the
/// table's tests build it, so an overlap never ships.
pub fn route_table() -> Result<RouteTable, RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

/// The adapter for OpenAI-compatible servers (name `openai`).
///
/// # Behavior
///
/// - Routes: [`ROUTES`] (ROUTE-01..03, ROUTE-12): [`OPENAI_V1`],
///   [`OPENAI_AUDIO_INPUT`], speech and images.
/// - Inspection: a `multipart/form-data` request (audio transcriptions and
///   translations, image edits) has its `model` field read by a small,
///   bounded multipart reader ([`multipart_model`](crate::common::multipart_model)); a form it cannot read
///   is 400 `invalid_request`, a form without `model` names no model. Every
///   other request, and `/v1/responses` whatever its content type, goes
///   through [`inspect_json_body`](crate::common::inspect_json_body): a JSON object, `model` a string kept
///   exactly (MEM-06), and the Responses background rule (ROUTE-05..07).
/// - Completion: the clean end of the response (DONE-01).
/// - No observation: the API has no standard way to show what is loaded or
///   running, so no resident credit is ever proven (RES-18) and no foreign
///   work is seen; `verify_stopped` is never `true` (DONE-04).
/// - Refusals render OpenAI-style.
#[derive(Debug)]
pub struct OpenAiAdapter {
    core: AdapterCore,
}

impl OpenAiAdapter {
    /// The adapter's name in configuration (`adapter = "openai"`).
    ///
    /// What [`Adapter::name`] answers.
    pub const NAME: &'static str = "openai";

    /// An adapter for the upstream at `settings.target`.
    ///
    /// Builds and checks [`ROUTES`] (docs/adapter-guide.md#route-classes); connects nothing.
    pub fn new(settings: AdapterSettings) -> Result<Self, RouteOverlap> {
        Ok(OpenAiAdapter {
            core: AdapterCore::new(settings, ROUTES)?,
        })
    }

    /// The settings it was built with.
    ///
    /// As given to [`OpenAiAdapter::new`].
    pub fn settings(&self) -> &AdapterSettings {
        self.core.settings()
    }
}

#[async_trait]
impl Adapter for OpenAiAdapter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn routes(&self) -> &RouteTable {
        self.core.routes()
    }

    fn inspect(&self, route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        inspect_request(route, ctx, body)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::common::testing::check_shared_inspection;
    use http::Method;
    use vacancy::config::Management;
    use vacancy::traits::RouteClass;
    use vacancy::traits::{ObserveError, RoutePolicy, route_policy};
    use vacancy::{MonotonicClock, RefusalCode};

    fn adapter() -> OpenAiAdapter {
        OpenAiAdapter::new(AdapterSettings::new(
            "http://127.0.0.1:8000".parse().unwrap(),
            MonotonicClock::new(),
        ))
        .unwrap()
    }

    #[test]
    fn every_route_of_the_table_is_classified() {
        // ROUTE-01, ROUTE-12; DONE-01 for work.
        let a = adapter();
        let work = RouteClass::Work(WorkRoute::response_end());
        let expected = [
            (Method::POST, "/v1/chat/completions", work),
            (Method::POST, "/v1/completions", work),
            (Method::POST, "/v1/embeddings", work),
            (Method::POST, "/v1/responses", work),
            (Method::POST, "/v1/audio/speech", work),
            (Method::POST, "/v1/audio/transcriptions", work),
            (Method::POST, "/v1/audio/translations", work),
            (Method::POST, "/v1/images/generations", work),
            (Method::POST, "/v1/images/edits", work),
            (Method::GET, "/v1/models", RouteClass::Discovery),
            (Method::GET, "/v1/models/gpt-4o-mini", RouteClass::Discovery),
        ];
        for (method, path, class) in &expected {
            assert_eq!(a.classify(method, path), *class, "{method} {path}");
        }
        assert_eq!(ROUTES.len(), expected.len());
        assert_eq!(a.name(), "openai");
    }

    #[test]
    fn head_query_and_unknown_routes() {
        // ROUTE-01..03, ROUTE-12
        let a = adapter();
        assert_eq!(
            a.classify(&Method::HEAD, "/v1/models"),
            RouteClass::Discovery
        );
        assert_eq!(
            a.classify(&Method::HEAD, "/v1/models/m?x=1"),
            RouteClass::Discovery
        );
        assert!(matches!(
            a.classify(&Method::POST, "/v1/chat/completions?stream=1"),
            RouteClass::Work(_)
        ));
        for (method, path) in [
            (Method::GET, "/health"),
            (Method::GET, "/v1/files"),
            (Method::GET, "/v1/models/org/model"),
            (Method::GET, "/v1/models/"),
            (Method::GET, "/v1/chat/completions"),
            (Method::GET, "/slots"),
            (Method::GET, "/metrics"),
            (Method::POST, "/v1/files"),
            (Method::POST, "/v1/batches"),
            (Method::POST, "/v1/fine_tuning/jobs"),
            (Method::POST, "/completion"),
            (Method::DELETE, "/v1/models/m"),
            (Method::POST, "/v1/models"),
        ] {
            assert_eq!(
                a.classify(&method, path),
                RouteClass::Unknown,
                "{method} {path}"
            );
        }
        let policy = |m: Method, p: &str| route_policy(a.classify(&m, p), &m, Management::Deny);
        assert_eq!(
            policy(Method::GET, "/v1/files"),
            RoutePolicy::Refuse(RefusalCode::RouteForbidden)
        );
        assert_eq!(
            policy(Method::POST, "/v1/batches"),
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        );
        assert_eq!(policy(Method::GET, "/v1/models"), RoutePolicy::Forward);
    }

    #[test]
    fn inspection_follows_the_shared_rules() {
        // ROUTE-05, ROUTE-06, ROUTE-07, MEM-06
        check_shared_inspection(&adapter());
    }

    fn inspect(path: &str, content_type: &str, body: &[u8]) -> InspectResult {
        let a = adapter();
        let RouteClass::Work(route) = a.classify(&Method::POST, path) else {
            panic!("{path}");
        };
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        let ctx = InspectContext {
            entry: vacancy::EntryId::from_u128(3),
            method: &Method::POST,
            path,
            headers: &headers,
        };
        a.inspect(&route, ctx, body)
    }

    #[test]
    fn multipart_uploads_name_their_model() {
        let ct = "multipart/form-data; boundary=XyZ";
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF....\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n";
        for path in [
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1/images/edits",
        ] {
            assert_eq!(
                inspect(path, ct, body).unwrap().model.as_deref(),
                Some("whisper-1"),
                "{path}"
            );
        }
        // Not JSON, and not refused for it.
        let no_model = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n\r\n\x89PNG\r\n--XyZ--";
        assert_eq!(
            inspect("/v1/images/edits", ct, no_model).unwrap().model,
            None
        );
        // A form that cannot be read is refused, not guessed.
        assert_eq!(
            inspect("/v1/audio/transcriptions", ct, b"whisper-1")
                .unwrap_err()
                .code,
            RefusalCode::InvalidRequest
        );
    }

    #[test]
    fn json_is_read_whatever_the_content_type_says_except_multipart() {
        assert_eq!(
            inspect(
                "/v1/audio/speech",
                "application/json",
                br#"{"model":"tts-1","input":"hi"}"#
            )
            .unwrap()
            .model
            .as_deref(),
            Some("tts-1")
        );
        assert_eq!(
            inspect("/v1/chat/completions", "text/plain", br#"{"model":"m"}"#)
                .unwrap()
                .model
                .as_deref(),
            Some("m")
        );
        assert_eq!(
            inspect("/v1/audio/transcriptions", "application/json", b"--XyZ")
                .unwrap_err()
                .code,
            RefusalCode::InvalidRequest
        );
    }

    #[test]
    fn responses_is_json_even_when_sent_as_a_form() {
        // ROUTE-06: a form is not a JSON object vacancy can read.
        let e = inspect(
            "/v1/responses",
            "multipart/form-data; boundary=b",
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--",
        )
        .unwrap_err();
        assert_eq!(e.code, RefusalCode::UnsupportedRequest);
    }

    #[tokio::test]
    async fn nothing_is_observed_and_nothing_proven_stopped() {
        let a = adapter();
        assert_eq!(a.observe().await, Err(ObserveError::Unsupported));
        assert_eq!(a.verify_stopped().await, Err(ObserveError::Unsupported));
        assert_eq!(a.settings().prefix(), "");
    }
}
