//! Ollama: its native `/api` routes and its OpenAI-compatible `/v1` ones,
//! observed through `GET /api/ps`.
//!
//! Wire shapes follow Ollama v0.32.15 (`docs/api.md`, `api/types.go`), as the
//! emulator in `vacancy-test-support` reproduces them:
//!
//! - `GET /api/ps` answers `{"models": [{"name", "model", "digest",
//!   "expires_at", "size_vram", "context_length", ...}]}`; `expires_at` is an
//!   RFC 3339 time (Go's `time.Time`, with or without fractional seconds, `Z`
//!   or a numeric offset). A model kept loaded forever (`keep_alive: -1`)
//!   shows a time about 292 years ahead.
//! - `/api/ps` does not say whether a request is running on a model, so it
//!   proves no idle state and shows no foreign work.
//!
//! This slice credits residency by the unload time alone (RES-03) and the
//! request's runner options (RES-04); matching the loaded context (RES-05..15)
//! is not part of it.

use std::time::SystemTime;

use async_trait::async_trait;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use vacancy::engine::{ModelObservation, ObservedModel, Refusal, RequestReuse, ResidencyEvidence};
use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{
    Adapter, InspectContext, InspectError, Inspection, ObserveError, RenderedRefusal, RouteClass,
    RouteMethod, RouteSpec, RouteTable, WorkRoute, render_ollama,
};

use crate::common::{AdapterSettings, ObservationClient, inspect_json_body, request_path};

const WORK: RouteClass = RouteClass::Work(WorkRoute::response_end());

/// Ollama's route table, as data.
///
/// # Behavior
///
/// - Work (admitted, released at the clean end of the response, DONE-01):
///   `POST` `/api/generate`, `/api/chat`, `/api/embed`, `/api/embeddings`,
///   `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
///   `/v1/responses`. A `/api/generate` or `/api/chat` request without a
///   prompt or messages loads the model, or with `keep_alive: 0` unloads it;
///   both are still work: a load uses the hardware like any request, and an
///   unload is admitted like one rather than trusted to free anything.
/// - Discovery, forwarded without admission and while lending is refused
///   (ROUTE-12): `GET` (and `HEAD`) `/api/tags`, `/api/version`, `/v1/models`,
///   `/v1/models/{id}` and `/` ("Ollama is running").
/// - Management and owner data, 403 unless `management = "allow"` (ROUTE-08,
///   ROUTE-09): the model store (`POST /api/pull`, `/api/push`, `/api/create`,
///   `/api/copy`, `DELETE /api/delete`, `POST` and `HEAD /api/blobs/{digest}`),
///   `GET /api/ps` (what the owner has loaded, named by ROUTE-08), and
///   `POST /api/show`: it answers the model's Modelfile, template, system
///   prompt, parameters and license, which are the owner's configuration
///   rather than a model listing, so it is owner data, not discovery.
/// - Anything else is unknown: a GET/HEAD is 403, any other method 501
///   (ROUTE-01..03, via `route_policy`).
pub const ROUTES: &[RouteSpec] = &[
    RouteSpec::new(RouteMethod::Post, "/api/generate", WORK),
    RouteSpec::new(RouteMethod::Post, "/api/chat", WORK),
    RouteSpec::new(RouteMethod::Post, "/api/embed", WORK),
    RouteSpec::new(RouteMethod::Post, "/api/embeddings", WORK),
    RouteSpec::new(RouteMethod::Post, "/v1/chat/completions", WORK),
    RouteSpec::new(RouteMethod::Post, "/v1/completions", WORK),
    RouteSpec::new(RouteMethod::Post, "/v1/embeddings", WORK),
    RouteSpec::new(RouteMethod::Post, "/v1/responses", WORK),
    RouteSpec::new(RouteMethod::Get, "/api/tags", RouteClass::Discovery),
    RouteSpec::new(RouteMethod::Get, "/api/version", RouteClass::Discovery),
    RouteSpec::new(RouteMethod::Get, "/v1/models", RouteClass::Discovery),
    RouteSpec::new(RouteMethod::Get, "/v1/models/{id}", RouteClass::Discovery),
    RouteSpec::new(RouteMethod::Get, "/", RouteClass::Discovery),
    RouteSpec::new(RouteMethod::Post, "/api/pull", RouteClass::Management),
    RouteSpec::new(RouteMethod::Post, "/api/push", RouteClass::Management),
    RouteSpec::new(RouteMethod::Post, "/api/create", RouteClass::Management),
    RouteSpec::new(RouteMethod::Post, "/api/copy", RouteClass::Management),
    RouteSpec::new(RouteMethod::Delete, "/api/delete", RouteClass::Management),
    RouteSpec::new(
        RouteMethod::Post,
        "/api/blobs/{digest}",
        RouteClass::Management,
    ),
    RouteSpec::new(
        RouteMethod::Get,
        "/api/blobs/{digest}",
        RouteClass::Management,
    ),
    RouteSpec::new(RouteMethod::Get, "/api/ps", RouteClass::Management),
    RouteSpec::new(RouteMethod::Post, "/api/show", RouteClass::Management),
];

/// [`ROUTES`] as a checked [`RouteTable`].
///
/// # Behavior
///
/// Refused if two entries could match the same request (DESIGN §8); the
/// table's tests build it, so an overlap never ships.
pub fn route_table() -> Result<RouteTable, RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

/// The `options` keys that change how Ollama loads the model's runner
/// (RES-04 Ambiguity reading), from Ollama's `api.Runner` options and the
/// runner options earlier releases accepted.
///
/// # Behavior
///
/// A native request (`/api/...`) that sets any of these forfeits resident
/// credit. `num_ctx` is not listed: it is the one runner option RES-04
/// allows (its match with the loaded context is RES-05's concern). Sampling
/// and prediction options (`temperature`, `top_k`, `top_p`, `min_p`, `seed`,
/// `num_predict`, `stop`, `repeat_penalty`, `num_keep`, ...) are per request
/// and never forfeit it; neither do keys Ollama does not know.
pub const RUNNER_OPTIONS: &[&str] = &[
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "numa",
    "num_gqa",
    "rope_frequency_base",
    "rope_frequency_scale",
    "embedding_only",
];

/// How far ahead a loaded model's unload must be for resident credit (RES-03).
pub const MIN_UNLOAD_SECS: i64 = 30;

/// The adapter for Ollama (name `ollama`).
///
/// # Behavior
///
/// - Routes: [`ROUTES`] (ROUTE-01..03, ROUTE-08, ROUTE-09, ROUTE-12).
/// - Inspection: [`inspect_json_body`] on every work route: a JSON object,
///   `model` a string kept exactly (MEM-06), and the Responses background
///   rule (ROUTE-05..07). On the native `/api` routes, `options` must be a
///   JSON object (or absent or `null`), else 400 `invalid_request`; one
///   naming a [`RUNNER_OPTIONS`] key makes the request
///   `RequestReuse::Cannot("the request sets runner option X")` (RES-04).
///   The `/v1` routes have no `options`: Ollama does not read it there.
/// - Completion: the clean end of the response (DONE-01).
/// - Observation ([`Adapter::observe`]), with `[upstream.credential]` only
///   (OBS-01/02), stamped before the request: `GET /api/ps`, one
///   [`ObservedModel`] per loaded model (by its `name`), ready, and
///   [`ResidencyEvidence::Proven`] only when its `expires_at` is at least
///   [`MIN_UNLOAD_SECS`] away (RES-03), else `NotProven("unloads in N s")`.
///   An answer without a `models` list, an entry without a string `name`, or
///   an `expires_at` that is not RFC 3339 is [`ObserveError::Malformed`],
///   never an observation (OBS-03).
/// - No `verify_stopped` proof: `/api/ps` does not show running requests, so
///   a cut stream keeps its hold (DONE-04).
/// - Refusals render in Ollama's dialect, `{"error": "code: reason"}`.
#[derive(Debug)]
pub struct OllamaAdapter {
    settings: AdapterSettings,
    routes: RouteTable,
    observer: ObservationClient,
}

impl OllamaAdapter {
    /// The adapter's name in configuration (`adapter = "ollama"`).
    ///
    /// # Behavior
    ///
    /// What [`Adapter::name`] answers.
    pub const NAME: &'static str = "ollama";

    /// An adapter for the upstream at `settings.target`.
    ///
    /// # Behavior
    ///
    /// Builds and checks [`ROUTES`] (DESIGN §8); connects nothing.
    pub fn new(settings: AdapterSettings) -> Result<Self, RouteOverlap> {
        Ok(OllamaAdapter {
            observer: ObservationClient::new(&settings),
            routes: route_table()?,
            settings,
        })
    }

    /// The settings it was built with.
    ///
    /// # Behavior
    ///
    /// As given to [`OllamaAdapter::new`].
    pub fn settings(&self) -> &AdapterSettings {
        &self.settings
    }
}

#[async_trait]
impl Adapter for OllamaAdapter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn routes(&self) -> &RouteTable {
        &self.routes
    }

    fn inspect(
        &self,
        route: &WorkRoute,
        ctx: InspectContext<'_>,
        body: &[u8],
    ) -> Result<Inspection, InspectError> {
        let mut inspection = inspect_json_body(route, ctx.path, body)?;
        if route.inspect_body && request_path(ctx.path).starts_with("/api/") {
            inspection.reuse = runner_option_reuse(body)?;
        }
        Ok(inspection)
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.settings.clock.now();
        let ps = self.observer.get_json("/api/ps").await?;
        let now = unix_seconds(SystemTime::now());
        Ok(ModelObservation {
            taken_at,
            models: parse_ps(&ps, now)?,
            foreign_work: None,
        })
    }

    fn render_refusal(&self, refusal: &Refusal) -> RenderedRefusal {
        render_ollama(refusal)
    }
}

/// The top level of a native request, reading `options` keys only; every
/// other member (prompt, messages) is skipped unparsed.
#[derive(Deserialize)]
struct NativeRequest {
    #[serde(default)]
    options: Option<std::collections::BTreeMap<String, IgnoredAny>>,
}

/// RES-04: whether a native request's `options` name a runner option.
fn runner_option_reuse(body: &[u8]) -> Result<RequestReuse, InspectError> {
    // The body already passed `inspect_json_body`: a JSON object in UTF-8.
    let request: NativeRequest = serde_json::from_slice(body).map_err(|e| {
        InspectError::invalid(format!(
            "\"options\" must be an object of option names and values, named once: {e}"
        ))
    })?;
    let set = request
        .options
        .into_iter()
        .flat_map(|o| o.into_keys())
        .find(|key| RUNNER_OPTIONS.contains(&key.as_str()));
    Ok(match set {
        Some(key) => RequestReuse::Cannot(format!("the request sets runner option {key}")),
        None => RequestReuse::Reuses,
    })
}

/// The models `/api/ps` lists, each with its RES-03 evidence at `now` (Unix seconds).
fn parse_ps(v: &Value, now: i64) -> Result<Vec<ObservedModel>, ObserveError> {
    let malformed = |why: String| ObserveError::Malformed(format!("GET /api/ps: {why}"));
    let list = v
        .get("models")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("the answer has no \"models\" list".into()))?;
    let mut models = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let name = entry
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(format!("model {i} has no string \"name\"")))?;
        let expires = entry
            .get("expires_at")
            .and_then(Value::as_str)
            .and_then(parse_rfc3339)
            .ok_or_else(|| malformed(format!("model {i} has no RFC 3339 \"expires_at\"")))?;
        let left = expires.saturating_sub(now);
        let evidence = if left >= MIN_UNLOAD_SECS {
            ResidencyEvidence::Proven
        } else {
            ResidencyEvidence::NotProven(format!("unloads in {} s", left.max(0)))
        };
        models.push(ObservedModel {
            name: name.to_owned(),
            ready: true,
            evidence,
        });
    }
    Ok(models)
}

/// Whole seconds since the Unix epoch (negative before it).
fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// An RFC 3339 date-time (`2024-06-04T14:38:31.83753-07:00`, `...Z`) as
/// whole Unix seconds, fractions dropped; `None` if it is not one.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(r)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > month_days || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hm = [*h1, *h2, *m1, *m2];
            if !hm.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let h = i64::from(hm[0] - b'0') * 10 + i64::from(hm[1] - b'0');
            let m = i64::from(hm[2] - b'0') * 10 + i64::from(hm[3] - b'0');
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'+' { secs } else { -secs }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::common::testing::check_shared_inspection;
    use http::Method;
    use vacancy::config::Management;
    use vacancy::traits::{RoutePolicy, route_policy};
    use vacancy::{EntryId, MonotonicClock, RefusalCode};

    fn adapter() -> OllamaAdapter {
        OllamaAdapter::new(AdapterSettings::new(
            "http://127.0.0.1:11434".parse().unwrap(),
            MonotonicClock::new(),
        ))
        .unwrap()
    }

    fn inspect(a: &OllamaAdapter, path: &str, body: &str) -> Result<Inspection, InspectError> {
        let RouteClass::Work(route) = a.classify(&Method::POST, path) else {
            panic!("POST {path} is not work");
        };
        let headers = http::HeaderMap::new();
        let ctx = InspectContext {
            entry: EntryId::from_u128(1),
            method: &Method::POST,
            path,
            headers: &headers,
        };
        a.inspect(&route, ctx, body.as_bytes())
    }

    #[test]
    fn every_route_of_the_table_is_classified() {
        // ROUTE-01, ROUTE-08, ROUTE-12; DONE-01 for work.
        let a = adapter();
        let work = RouteClass::Work(WorkRoute::response_end());
        let d = RouteClass::Discovery;
        let m = RouteClass::Management;
        let expected = [
            (Method::POST, "/api/generate", work),
            (Method::POST, "/api/chat", work),
            (Method::POST, "/api/embed", work),
            (Method::POST, "/api/embeddings", work),
            (Method::POST, "/v1/chat/completions", work),
            (Method::POST, "/v1/completions", work),
            (Method::POST, "/v1/embeddings", work),
            (Method::POST, "/v1/responses", work),
            (Method::GET, "/api/tags", d),
            (Method::GET, "/api/version", d),
            (Method::GET, "/v1/models", d),
            (Method::GET, "/v1/models/llama3:latest", d),
            (Method::GET, "/", d),
            (Method::POST, "/api/pull", m),
            (Method::POST, "/api/push", m),
            (Method::POST, "/api/create", m),
            (Method::POST, "/api/copy", m),
            (Method::DELETE, "/api/delete", m),
            (Method::POST, "/api/blobs/sha256:abc", m),
            (Method::GET, "/api/blobs/sha256:abc", m),
            (Method::GET, "/api/ps", m),
            (Method::POST, "/api/show", m),
        ];
        for (method, path, class) in &expected {
            assert_eq!(a.classify(method, path), *class, "{method} {path}");
        }
        assert_eq!(ROUTES.len(), expected.len());
        assert_eq!(a.name(), "ollama");
    }

    #[test]
    fn head_reads_follow_their_get() {
        // ROUTE-12 (HEAD / is Ollama's liveness check), ROUTE-08 (HEAD blobs).
        let a = adapter();
        assert_eq!(a.classify(&Method::HEAD, "/"), RouteClass::Discovery);
        assert_eq!(
            a.classify(&Method::HEAD, "/api/tags"),
            RouteClass::Discovery
        );
        assert_eq!(
            a.classify(&Method::HEAD, "/api/blobs/sha256:abc"),
            RouteClass::Management
        );
    }

    #[test]
    fn management_and_owner_data_are_refused_unless_allowed() {
        // ROUTE-08, ROUTE-09: 403 by default, forwarded without a reservation with "allow".
        let a = adapter();
        for (method, path) in [
            (Method::POST, "/api/pull"),
            (Method::POST, "/api/show"),
            (Method::GET, "/api/ps"),
            (Method::DELETE, "/api/delete"),
            (Method::HEAD, "/api/blobs/sha256:abc"),
        ] {
            let class = a.classify(&method, path);
            let RoutePolicy::Refuse(code) = route_policy(class, &method, Management::Deny) else {
                panic!("{method} {path} is not refused");
            };
            assert_eq!(code, RefusalCode::RouteForbidden, "{method} {path}");
            assert_eq!(
                route_policy(class, &method, Management::Allow),
                RoutePolicy::Forward,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn unknown_routes_follow_the_route_policy() {
        // ROUTE-02, ROUTE-03: unlisted GET is 403, another method 501.
        let a = adapter();
        assert_eq!(a.classify(&Method::GET, "/api/secret"), RouteClass::Unknown);
        assert_eq!(a.classify(&Method::PUT, "/api/chat"), RouteClass::Unknown);
        assert_eq!(a.classify(&Method::GET, "/api/chat"), RouteClass::Unknown);
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::PUT, Management::Allow),
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        );
        assert!(matches!(
            a.classify(&Method::POST, "/api/chat?x=1"),
            RouteClass::Work(_)
        ));
    }

    #[test]
    fn the_shared_inspection_holds() {
        // MEM-06, ROUTE-05..07.
        check_shared_inspection(&adapter());
    }

    #[test]
    fn a_runner_option_forfeits_resident_credit() {
        // RES-04
        let a = adapter();
        for (path, body, key) in [
            (
                "/api/generate",
                r#"{"model":"llama3","prompt":"hi","options":{"num_gpu":10}}"#,
                "num_gpu",
            ),
            (
                "/api/chat",
                r#"{"model":"llama3","messages":[],"options":{"temperature":0.2,"num_thread":4}}"#,
                "num_thread",
            ),
            (
                "/api/embed",
                r#"{"model":"m","input":"x","options":{"use_mmap":false,"num_ctx":2048}}"#,
                "use_mmap",
            ),
        ] {
            let i = inspect(&a, path, body).unwrap();
            assert_eq!(
                i.reuse,
                RequestReuse::Cannot(format!("the request sets runner option {key}")),
                "{body}"
            );
        }
    }

    #[test]
    fn num_ctx_and_sampling_options_keep_resident_credit() {
        // RES-04: num_ctx is allowed; sampling options are not runner options.
        let a = adapter();
        for body in [
            r#"{"model":"llama3","prompt":"hi"}"#,
            r#"{"model":"llama3","prompt":"hi","options":null}"#,
            r#"{"model":"llama3","prompt":"hi","options":{"num_ctx":8192}}"#,
            r#"{"model":"llama3","prompt":"hi","options":{"temperature":0.1,"top_p":0.9,"top_k":40,"seed":7,"num_predict":4,"stop":["x"],"repeat_penalty":1.1}}"#,
            r#"{"model":"llama3","prompt":"","keep_alive":0}"#,
        ] {
            let i = inspect(&a, "/api/generate", body).unwrap();
            assert_eq!(i.reuse, RequestReuse::Reuses, "{body}");
            assert_eq!(i.model.as_deref(), Some("llama3"));
        }
        // /v1 has no options: Ollama does not read them there.
        let i = inspect(
            &a,
            "/v1/chat/completions",
            r#"{"model":"llama3","messages":[],"options":{"num_gpu":1}}"#,
        )
        .unwrap();
        assert_eq!(i.reuse, RequestReuse::Reuses);
    }

    #[test]
    fn options_that_are_not_an_object_are_invalid() {
        let a = adapter();
        for body in [
            r#"{"model":"m","options":"num_gpu"}"#,
            r#"{"model":"m","options":[1]}"#,
            r#"{"model":"m","options":{},"options":{}}"#,
        ] {
            assert_eq!(
                inspect(&a, "/api/chat", body).unwrap_err().code,
                RefusalCode::InvalidRequest,
                "{body}"
            );
        }
    }

    #[test]
    fn refusals_speak_ollamas_dialect() {
        let r =
            adapter().render_refusal(&Refusal::new(RefusalCode::ResourceBusy, "gpu0 is reserved"));
        assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "resource_busy: gpu0 is reserved"})
        );
    }

    #[test]
    fn rfc3339_times_parse_to_unix_seconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2024-03-01T00:00:00.000001Z"),
            Some(1_709_251_200)
        );
        assert_eq!(
            parse_rfc3339("2024-06-04T14:38:31.83753-07:00"),
            Some(1_717_537_111)
        );
        assert_eq!(
            parse_rfc3339("2024-06-04T21:38:31+00:00"),
            Some(1_717_537_111)
        );
        assert!(parse_rfc3339("2318-02-23T22:51:18.123456789+01:00").unwrap() > 10_000_000_000);
        for bad in [
            "",
            "2024-06-04",
            "2024-06-04T14:38:31",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-06-04T14:38:31.Z",
            "2024-06-04T14:38:31+0700",
            "2024-06-04T14:38:31Zjunk",
            "soon",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn ps_credits_only_models_unloading_30_s_or_more_ahead() {
        // RES-03
        let now = 1_717_537_111;
        let ps = serde_json::json!({"models": [
            {"name": "a:latest", "expires_at": "2024-06-04T21:39:01Z"},
            {"name": "b:latest", "expires_at": "2024-06-04T21:39:00Z"},
            {"name": "c:latest", "expires_at": "2024-06-04T21:00:00Z"},
        ]});
        let models = parse_ps(&ps, now).unwrap();
        let evidence: Vec<_> = models
            .iter()
            .map(|m| (m.name.as_str(), m.ready, &m.evidence))
            .collect();
        assert_eq!(
            evidence,
            [
                ("a:latest", true, &ResidencyEvidence::Proven),
                (
                    "b:latest",
                    true,
                    &ResidencyEvidence::NotProven("unloads in 29 s".into())
                ),
                (
                    "c:latest",
                    true,
                    &ResidencyEvidence::NotProven("unloads in 0 s".into())
                ),
            ]
        );
        assert_eq!(
            parse_ps(&serde_json::json!({"models": []}), now),
            Ok(vec![])
        );
    }

    #[test]
    fn a_malformed_ps_is_no_observation() {
        // OBS-03
        for bad in [
            serde_json::json!({}),
            serde_json::json!([]),
            serde_json::json!({"models": {}}),
            serde_json::json!({"models": [{"expires_at": "2024-06-04T21:39:01Z"}]}),
            serde_json::json!({"models": [{"name": "a"}]}),
            serde_json::json!({"models": [{"name": "a", "expires_at": "tomorrow"}]}),
        ] {
            assert!(
                matches!(parse_ps(&bad, 0), Err(ObserveError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
