//! Compatible voice servers (adapter `chatterbox`): speech and durable
//! executions as work, capability and result reads without admission, and
//! engine residency from `GET /status` (VOICE-01..20).
//!
//! The routes are the compatible-voice-server contract
//! (docs/operator-guide.md#voice-servers). Of
//! chatterbox-tts-api's published routes (its README's "core TTS
//! endpoints"), `POST /v1/audio/speech` (also with `stream_format: "sse"`),
//! `/v1/audio/speech/stream`, `/v1/audio/speech/upload` and
//! `/v1/audio/speech/stream/upload` (a voice file with the text) are work
//! here; `GET /health`, `/status` and `/v1/models` are discovery. Its voice
//! library and configuration routes are unlisted: reads 403 unless
//! `management = "allow"`, writes 501. Its long-text jobs answer before the
//! audio exists, like background responses, so they are unlisted too (501):
//! their end could not be proven.

use async_trait::async_trait;
use vacancy::config::{SettingProblem, VoiceRoutesConfig};
use vacancy::engine::ModelObservation;
use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{
    Adapter, InspectContext, InspectResult, ObserveError, RouteClass, RouteMethod, RouteSpec,
    RouteTable, WorkRoute,
};

mod inspect;
mod observe;

pub use inspect::GENERIC_ALIASES;

use crate::common::routes::WORK;
use crate::common::{AdapterCore, AdapterSettings};

/// Whether a result-read ID may pass without management permission
/// (VOICE-07): 8 to 80 ASCII letters, digits, `_` or `-`.
pub fn is_result_id(id: &str) -> bool {
    (8..=80).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

const fn result_read(path: &'static str) -> RouteSpec {
    RouteSpec {
        method: RouteMethod::Get,
        path,
        class: RouteClass::BorrowerRead,
        param_check: Some(is_result_id),
    }
}

/// The voice route table, as data.
///
/// # Behavior
///
/// - Work, released at the clean end of the response (DONE-01, VOICE-03):
///   `POST /v1/audio/speech` (and chatterbox's `/v1/audio/speech/stream`,
///   `/v1/audio/speech/upload`, `/v1/audio/speech/stream/upload`),
///   `POST /v1/audio/executions` (durable
///   synthesis: the server holds the response open until the audio and
///   receipt are published, VOICE-01..04), `POST /v1/audio/transcriptions`.
/// - Borrower reads without admission (VOICE-05/06): `GET
///   /v1/audio/capabilities`, `GET /v1/audio/executions/{id}` and
///   `/v1/audio/executions/{id}/audio`, with `{id}` matching
///   `^[A-Za-z0-9_-]{8,80}$` (VOICE-07); another ID leaves the route
///   unmatched, so it is an unlisted read.
/// - Discovery (ROUTE-12): `GET /health`, `/status`, `/v1/models`.
/// - Everything else is unlisted: a read is 403 unless `management = "allow"`
///   (VOICE-08), another method 501 (ROUTE-03).
pub const ROUTES: &[RouteSpec] = crate::join_routes![
    crate::routes![
        Post WORK => [
            "/v1/audio/speech", "/v1/audio/speech/stream", "/v1/audio/speech/upload",
            "/v1/audio/speech/stream/upload", "/v1/audio/executions", "/v1/audio/transcriptions",
        ];
        Get RouteClass::BorrowerRead => ["/v1/audio/capabilities"];
    ],
    &[
        result_read("/v1/audio/executions/{id}"),
        result_read("/v1/audio/executions/{id}/audio"),
    ],
    crate::routes![Get RouteClass::Discovery => ["/health", "/status", "/v1/models"]],
];

/// [`ROUTES`] as a checked [`RouteTable`].
///
/// Refused if two entries could match the same request (docs/adapter-guide.md#route-classes).
pub fn route_table() -> Result<RouteTable, RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

/// The route table for the paths in `routes` (`[upstream.voice_routes]`):
/// [`ROUTES`] with the speech, executions, capability, lookup and replay
/// paths replaced; chatterbox's `/stream` and `/upload` variants follow the
/// speech path.
///
/// # Behavior
///
/// The default paths give [`ROUTES`] itself. Other paths are kept for the
/// life of the process (route tables hold `&'static str` patterns; a daemon
/// builds each adapter once), so building tables in a loop leaks them.
pub fn route_table_for(routes: &VoiceRoutesConfig) -> Result<RouteTable, RouteOverlap> {
    if *routes == VoiceRoutesConfig::default() {
        return route_table();
    }
    let table = ROUTES
        .iter()
        .map(|spec| RouteSpec {
            path: configured_path(spec.path, routes),
            ..*spec
        })
        .collect();
    RouteTable::new(table)
}

/// Every problem in `[upstream.voice_routes]` (`routes`), each keyed
/// `voice_routes.<key>` in the `[[upstream]]` table: the paths are absolute
/// without a query or an empty segment, the result reads (`execution`,
/// `execution_audio`) have an `{id}` segment and the others none, and no two
/// routes share a path. Overlaps the table would still have are refused when
/// the adapter is built ([`route_table_for`]).
pub fn check_voice_routes(routes: &VoiceRoutesConfig) -> Vec<SettingProblem> {
    let paths = [
        ("speech", &routes.speech, false),
        ("executions", &routes.executions, false),
        ("capabilities", &routes.capabilities, false),
        ("execution", &routes.execution, true),
        ("execution_audio", &routes.execution_audio, true),
    ];
    let mut problems = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (key, path, with_id) in paths {
        let key = format!("voice_routes.{key}");
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let has_id = segments.contains(&"{id}");
        let other_param = segments
            .iter()
            .any(|s| *s != "{id}" && (s.contains('{') || s.contains('}')));
        let problem = if !path.starts_with('/')
            || path.contains(['?', '#', ' '])
            || segments.iter().any(|s| s.is_empty())
        {
            Some(format!(
                "{path:?} is not an absolute path such as \"/v1/audio/speech\" (no query, no empty segment)"
            ))
        } else if with_id && !has_id {
            Some(format!(
                "{path:?} needs an {{id}} segment for the result ID"
            ))
        } else if (!with_id && has_id) || other_param {
            Some(format!(
                "{path:?} may not have parameters other than one {{id}} segment in a result read"
            ))
        } else if seen.contains(&path.as_str()) {
            Some(format!("{path:?} is given to two voice routes"))
        } else {
            None
        };
        if let Some(message) = problem {
            problems.push(SettingProblem::in_upstream(key, message));
        }
        seen.push(path);
    }
    problems
}

/// `path`, an entry of [`ROUTES`], where `routes` puts it: the speech path's
/// own entries follow the configured speech path, the executions, capability,
/// lookup and replay paths are replaced, anything else stays.
fn configured_path(path: &'static str, routes: &VoiceRoutesConfig) -> &'static str {
    let defaults = VoiceRoutesConfig::default();
    let replaced = [
        (&defaults.executions, &routes.executions),
        (&defaults.capabilities, &routes.capabilities),
        (&defaults.execution, &routes.execution),
        (&defaults.execution_audio, &routes.execution_audio),
    ]
    .into_iter()
    .find(|(default, _)| default.as_str() == path)
    .map(|(_, configured)| configured.clone())
    .or_else(|| {
        path.strip_prefix(defaults.speech.trim_end_matches('/'))
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .map(|rest| format!("{}{rest}", routes.speech.trim_end_matches('/')))
    });
    match replaced {
        Some(configured) if configured != path => Box::leak(configured.into_boxed_str()),
        _ => path,
    }
}

/// The kind string an engine's requests carry: resident credit on an
/// engine-reporting server needs the loaded engine's kind (VOICE-12).
pub(super) fn engine_kind(engine: &str) -> String {
    format!("voice engine {engine}")
}

/// The adapter for compatible voice servers (name `chatterbox`).
///
/// # Behavior
///
/// - Routes: [`ROUTES`] (VOICE-05..08). No retries, no queue and no
///   authorization are added (VOICE-09, VOICE-20): an upstream error after
///   forwarding is passed to the borrower as it came, and the reservation
///   ends as the response does.
/// - Inspection: JSON bodies by [`inspect_json_body`](crate::common::inspect_json_body) (the top-level
///   `model` selects the budget exactly, VOICE-02, MEM-06), multipart uploads
///   and transcriptions by [`multipart_model`](crate::common::multipart_model). A request naming an engine
///   carries that engine's kind; a [`GENERIC_ALIASES`] name (or none) cannot
///   reuse a loaded engine, so it is never credited (VOICE-14; on a legacy
///   server too, where it would prove no more).
/// - Observation (`GET /status` `{"loaded", "engine", "busy"}`, OBS-01/02):
///   - `engine` present: a loaded, idle server naming a valid engine is
///     that engine, resident for requests naming it (VOICE-11, VOICE-12); a
///     request for another engine pays its cold-load budget (VOICE-13); a
///     `null`, empty, non-string or invalid engine proves nothing (VOICE-16);
///   - `engine` absent (a legacy server): fixed-model residency: each model
///     `GET /v1/models` lists is resident while the server is loaded and
///     idle (VOICE-15);
///   - `busy: true` is work the server runs; with no job of vacancy's on
///     the resource it refuses new work as `resource_busy` (ADM-09);
///   - a reply without a boolean `loaded` and `busy` is malformed (OBS-03).
#[derive(Debug)]
pub struct ChatterboxAdapter {
    core: AdapterCore,
}

impl ChatterboxAdapter {
    /// The adapter's name in configuration (`adapter = "chatterbox"`).
    ///
    /// What [`Adapter::name`] answers.
    pub const NAME: &'static str = "chatterbox";

    /// An adapter for the voice server at `settings.target`.
    ///
    /// Builds and checks [`ROUTES`]; connects nothing.
    pub fn new(settings: AdapterSettings) -> Result<Self, RouteOverlap> {
        Ok(ChatterboxAdapter {
            core: AdapterCore::new(settings, ROUTES)?,
        })
    }

    /// The same adapter answering at the paths of `[upstream.voice_routes]`
    /// (docs/config.md#upstreamvoice_routes: each path configurable per upstream).
    ///
    /// See [`route_table_for`]; two paths that could match the same request
    /// are refused.
    pub fn with_routes(mut self, routes: &VoiceRoutesConfig) -> Result<Self, RouteOverlap> {
        self.core = self.core.with_table(route_table_for(routes)?);
        Ok(self)
    }

    /// The settings it was built with.
    ///
    /// As given to [`ChatterboxAdapter::new`].
    pub fn settings(&self) -> &AdapterSettings {
        self.core.settings()
    }
}

#[async_trait]
impl Adapter for ChatterboxAdapter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn routes(&self) -> &RouteTable {
        self.core.routes()
    }

    fn inspect(&self, route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        inspect::inspect(route, ctx, body)
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        self.observe_now().await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::observe::valid_engine;
    use super::*;
    use http::Method;
    use vacancy::config::Management;
    use vacancy::engine::RequestReuse;
    use vacancy::traits::Inspection;
    use vacancy::traits::{RoutePolicy, route_policy};
    use vacancy::{EntryId, MonotonicClock, RefusalCode};

    fn adapter() -> ChatterboxAdapter {
        ChatterboxAdapter::new(AdapterSettings::new(
            "http://127.0.0.1:4123".parse().unwrap(),
            MonotonicClock::new(),
        ))
        .unwrap()
    }

    #[test]
    fn every_route_of_the_table_is_classified() {
        // VOICE-01, VOICE-05..08, ROUTE-12
        let a = adapter();
        let work = RouteClass::Work(WorkRoute::response_end());
        for path in [
            "/v1/audio/speech",
            "/v1/audio/speech/stream",
            "/v1/audio/speech/upload",
            "/v1/audio/speech/stream/upload",
            "/v1/audio/executions",
            "/v1/audio/transcriptions",
        ] {
            assert_eq!(a.classify(&Method::POST, path), work, "{path}");
        }
        for path in [
            "/v1/audio/capabilities",
            "/v1/audio/executions/exec_0123456789",
            "/v1/audio/executions/exec_0123456789/audio",
            "/v1/audio/executions/AbCdEfGh",
        ] {
            assert_eq!(
                a.classify(&Method::GET, path),
                RouteClass::BorrowerRead,
                "{path}"
            );
        }
        for path in ["/health", "/status", "/v1/models"] {
            assert_eq!(
                a.classify(&Method::GET, path),
                RouteClass::Discovery,
                "{path}"
            );
        }
        assert_eq!(a.name(), "chatterbox");
    }

    #[test]
    fn configured_voice_routes_replace_the_default_paths_and_keep_the_rest() {
        // VOICE-01, VOICE-05..07 under `[upstream.voice_routes]` (docs/config.md#upstreamvoice_routes)
        let routes = VoiceRoutesConfig {
            speech: "/tts/".to_owned(),
            executions: "/jobs".to_owned(),
            capabilities: "/caps".to_owned(),
            execution: "/jobs/{id}".to_owned(),
            execution_audio: "/jobs/{id}/wav".to_owned(),
        };
        let table = route_table_for(&routes).unwrap();
        let work = RouteClass::Work(WorkRoute::response_end());
        for path in [
            "/tts",
            "/tts/stream",
            "/tts/upload",
            "/tts/stream/upload",
            "/jobs",
            "/v1/audio/transcriptions",
        ] {
            assert_eq!(table.classify(&Method::POST, path), work, "{path}");
        }
        for path in [
            "/caps",
            "/jobs/exec_0123456789",
            "/jobs/exec_0123456789/wav",
        ] {
            assert_eq!(
                table.classify(&Method::GET, path),
                RouteClass::BorrowerRead,
                "{path}"
            );
        }
        // The ID check stays with the lookup routes; discovery is unchanged.
        assert_eq!(
            table.classify(&Method::GET, "/jobs/short"),
            RouteClass::Unknown
        );
        assert_eq!(
            table.classify(&Method::GET, "/status"),
            RouteClass::Discovery
        );
        for gone in [
            "/v1/audio/speech",
            "/v1/audio/executions",
            "/v1/audio/capabilities",
        ] {
            assert_eq!(
                table.classify(&Method::POST, gone),
                RouteClass::Unknown,
                "{gone}"
            );
            assert_eq!(
                table.classify(&Method::GET, gone),
                RouteClass::Unknown,
                "{gone}"
            );
        }
        assert_eq!(table.entries().len(), ROUTES.len());
    }

    #[test]
    fn result_ids_outside_the_pattern_are_unlisted_reads() {
        // VOICE-07, VOICE-08
        let a = adapter();
        for path in [
            "/v1/audio/executions/short",
            "/v1/audio/executions/has.dot.in.it",
            "/v1/audio/executions/percent%2Fslash",
            &format!("/v1/audio/executions/{}", "x".repeat(81)),
            "/v1/audio/executions/exec_0123456789/other",
            "/v1/voices",
            "/config",
        ] {
            let class = a.classify(&Method::GET, path);
            assert_eq!(class, RouteClass::Unknown, "{path}");
            assert_eq!(
                route_policy(class, &Method::GET, Management::Deny),
                RoutePolicy::Refuse(RefusalCode::RouteForbidden),
                "{path}"
            );
            assert_eq!(
                route_policy(class, &Method::GET, Management::Allow),
                RoutePolicy::Forward,
                "{path}"
            );
        }
        // ROUTE-03: an unlisted write (chatterbox's long-text jobs, voice
        // library changes) is 501 even with management allowed.
        for path in [
            "/v1/audio/speech/long",
            "/voices",
            "/v1/audio/executions/exec_0123456789",
        ] {
            let class = a.classify(&Method::POST, path);
            assert_eq!(
                route_policy(class, &Method::POST, Management::Allow),
                RoutePolicy::Refuse(RefusalCode::RouteNotSupported),
                "{path}"
            );
        }
        assert!(is_result_id(&"a".repeat(80)));
        assert!(!is_result_id(&"a".repeat(7)));
    }

    #[test]
    fn malformed_bodies_are_400_and_the_model_is_kept_exactly() {
        // VOICE-02 (budget by the exact top-level model, MEM-06); bad input → 400.
        let a = adapter();
        let headers = http::HeaderMap::new();
        for path in ["/v1/audio/speech", "/v1/audio/executions"] {
            let ctx = InspectContext {
                entry: EntryId::from_u128(1),
                method: &Method::POST,
                path,
                headers: &headers,
            };
            let route = WorkRoute::response_end();
            for bad in ["", "not json", "[1]", r#"{"model": 3}"#, "{\"model\":"] {
                let e = a.inspect(&route, ctx, bad.as_bytes()).unwrap_err();
                assert_eq!(e.code, RefusalCode::InvalidRequest, "{path} {bad:?}");
            }
            let i = a
                .inspect(&route, ctx, br#"{"model":" Qwen-Design ","input":"x"}"#)
                .unwrap();
            assert_eq!(i.model.as_deref(), Some(" Qwen-Design "), "{path}");
        }
    }

    fn inspect(body: &str) -> Inspection {
        let a = adapter();
        let headers = http::HeaderMap::new();
        let ctx = InspectContext {
            entry: EntryId::from_u128(1),
            method: &Method::POST,
            path: "/v1/audio/executions",
            headers: &headers,
        };
        a.inspect(&WorkRoute::response_end(), ctx, body.as_bytes())
            .unwrap()
    }

    #[test]
    fn engine_requests_carry_their_engine_and_aliases_never_match_one() {
        // VOICE-12, VOICE-14
        let i = inspect(r#"{"model":"qwen","input":"hi"}"#);
        assert_eq!(i.model.as_deref(), Some("qwen"));
        assert_eq!(i.reuse, RequestReuse::ReusesAs("voice engine qwen".into()));
        for alias in GENERIC_ALIASES {
            let i = inspect(&format!(r#"{{"model":"{alias}","input":"hi"}}"#));
            assert!(
                matches!(&i.reuse, RequestReuse::Cannot(why) if why.contains("generic alias")),
                "{alias}: {:?}",
                i.reuse
            );
        }
        assert!(matches!(
            inspect(r#"{"input":"hi"}"#).reuse,
            RequestReuse::Cannot(_)
        ));
    }

    #[test]
    fn the_voice_paths_are_configurable_per_upstream() {
        // docs/config.md#upstreamvoice_routes, VOICE-05..07 on other paths.
        let routes = VoiceRoutesConfig {
            speech: "/tts/speak".into(),
            executions: "/tts/jobs".into(),
            capabilities: "/tts/caps".into(),
            execution: "/tts/jobs/{id}".into(),
            execution_audio: "/tts/jobs/{id}/wav".into(),
        };
        let a = adapter().with_routes(&routes).unwrap();
        let work = RouteClass::Work(WorkRoute::response_end());
        for path in [
            "/tts/speak",
            "/tts/speak/stream",
            "/tts/speak/upload",
            "/tts/jobs",
        ] {
            assert_eq!(a.classify(&Method::POST, path), work, "{path}");
        }
        assert_eq!(
            a.classify(&Method::POST, "/v1/audio/speech"),
            RouteClass::Unknown
        );
        assert_eq!(
            a.classify(&Method::GET, "/tts/caps"),
            RouteClass::BorrowerRead
        );
        assert_eq!(
            a.classify(&Method::GET, "/tts/jobs/exec_0123456789/wav"),
            RouteClass::BorrowerRead
        );
        assert_eq!(
            a.classify(&Method::GET, "/tts/jobs/bad.id"),
            RouteClass::Unknown
        );
        // The defaults are the contract's table.
        let d = adapter()
            .with_routes(&VoiceRoutesConfig::default())
            .unwrap();
        assert_eq!(d.classify(&Method::POST, "/v1/audio/speech"), work);
        // Overlapping paths are refused.
        let clash = VoiceRoutesConfig {
            executions: "/v1/audio/speech".into(),
            ..VoiceRoutesConfig::default()
        };
        assert!(adapter().with_routes(&clash).is_err());
    }

    #[test]
    fn engine_names_must_be_visible_ascii() {
        // VOICE-16
        assert!(valid_engine("qwen"));
        assert!(valid_engine("breeze-2.1_q8"));
        for bad in ["", " ", "qwen 2", "q\nwen", "引擎", &"x".repeat(129)] {
            assert!(!valid_engine(bad), "{bad:?}");
        }
    }
}
