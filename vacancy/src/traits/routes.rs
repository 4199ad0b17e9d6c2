//! Route tables as data: what each adapter recognizes, and what vacancyd does with it.

use crate::engine::{CompletionMethod, RefusalCode};

/// The HTTP methods a route entry matches. `Get` also matches `HEAD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteMethod {
    /// GET (and HEAD).
    Get,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// DELETE.
    Delete,
    /// PATCH.
    Patch,
}

impl RouteMethod {
    /// Whether `method` is this one (`Get` matches `HEAD` too).
    pub fn matches(self, method: &http::Method) -> bool {
        match self {
            RouteMethod::Get => method == http::Method::GET || method == http::Method::HEAD,
            RouteMethod::Post => method == http::Method::POST,
            RouteMethod::Put => method == http::Method::PUT,
            RouteMethod::Delete => method == http::Method::DELETE,
            RouteMethod::Patch => method == http::Method::PATCH,
        }
    }
}

/// A route that is work: admitted, reserved, and completed by its method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRoute {
    /// How the end of the work is proven.
    pub completion: CompletionMethod,
    /// Whether the body must be read (bounded) for the model and validation.
    pub inspect_body: bool,
    /// A gated WebSocket: the reservation is kept after close (ROUTE-10).
    pub websocket: bool,
}

impl WorkRoute {
    /// An HTTP work route whose clean response end releases it (DONE-01).
    pub const fn response_end() -> Self {
        WorkRoute {
            completion: CompletionMethod::ResponseEnd,
            inspect_body: true,
            websocket: false,
        }
    }
}

/// What a route is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// Borrowed work: admitted only if everything it needs is free.
    Work(WorkRoute),
    /// A borrower's read of results (e.g. an execution lookup): forwarded without admission.
    BorrowerRead,
    /// Discovery (model lists, health): forwarded without admission, also while lending is refused (ROUTE-12).
    Discovery,
    /// Manages the upstream or reads the owner's data: 403 unless `management = "allow"` (ROUTE-08).
    Management,
    /// Not in the table (ROUTE-01).
    Unknown,
}

impl RouteClass {
    /// The class's name in metrics labels (`work`, `borrower_read`,
    /// `discovery`, `management`, `unknown`).
    pub fn label(&self) -> &'static str {
        match self {
            RouteClass::Work(_) => "work",
            RouteClass::BorrowerRead => "borrower_read",
            RouteClass::Discovery => "discovery",
            RouteClass::Management => "management",
            RouteClass::Unknown => "unknown",
        }
    }
}

/// A path segment check for `{param}` segments (e.g. VOICE-07's ID shape).
pub type ParamCheck = fn(&str) -> bool;

/// One entry of a route table.
#[derive(Debug, Clone, Copy)]
pub struct RouteSpec {
    /// The method it matches.
    pub method: RouteMethod,
    /// The path pattern: literal segments and `{name}` parameters, e.g. `/v1/audio/executions/{id}`.
    pub path: &'static str,
    /// What it is.
    pub class: RouteClass,
    /// A check every `{param}` segment must pass; failing it leaves the route unmatched.
    pub param_check: Option<ParamCheck>,
}

impl RouteSpec {
    /// An entry without a parameter check.
    pub const fn new(method: RouteMethod, path: &'static str, class: RouteClass) -> Self {
        RouteSpec {
            method,
            path,
            class,
            param_check: None,
        }
    }

    /// Whether this entry matches `method` and `path` (query ignored),
    /// `{param}` segments passing the entry's check.
    pub fn matches(&self, method: &http::Method, path: &str) -> bool {
        self.method.matches(method) && self.matches_path(before_query(path))
    }

    fn matches_path(&self, path: &str) -> bool {
        // A pattern without parameters matches its own text only: one
        // comparison instead of a walk over the segments (issue 31: route
        // classification runs on every request).
        if !self.path.as_bytes().contains(&b'{') {
            return self.path == path;
        }
        let mut want = self.path.split('/');
        let mut got = path.split('/');
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some(w), Some(g)) if is_param(w) => {
                    if g.is_empty() || self.param_check.is_some_and(|check| !check(g)) {
                        return false;
                    }
                }
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

/// `path` without its query string. A byte search: a `char` pattern's
/// searcher cost more than the rest of a literal route's match (issue 31).
fn before_query(path: &str) -> &str {
    path.bytes()
        .position(|b| b == b'?')
        .map_or(path, |i| &path[..i])
}

fn is_param(segment: &str) -> bool {
    segment.len() > 2 && segment.starts_with('{') && segment.ends_with('}')
}

/// Two entries of one table could match the same request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route table overlaps: {method:?} {first} and {second} can match the same request")]
pub struct RouteOverlap {
    /// The method both match.
    pub method: RouteMethod,
    /// The first pattern.
    pub first: &'static str,
    /// The second pattern.
    pub second: &'static str,
}

/// An adapter's route table, checked once when built: no method and path can
/// match two entries.
#[derive(Debug, Clone)]
pub struct RouteTable {
    entries: Vec<RouteSpec>,
}

impl RouteTable {
    /// A table, refused if two entries overlap.
    pub fn new(entries: Vec<RouteSpec>) -> Result<Self, RouteOverlap> {
        for (i, a) in entries.iter().enumerate() {
            for b in &entries[i + 1..] {
                if a.method == b.method && patterns_overlap(a.path, b.path) {
                    return Err(RouteOverlap {
                        method: a.method,
                        first: a.path,
                        second: b.path,
                    });
                }
            }
        }
        Ok(RouteTable { entries })
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[RouteSpec] {
        &self.entries
    }

    /// Classify a request. The query string, if any, is ignored.
    pub fn classify(&self, method: &http::Method, path: &str) -> RouteClass {
        let path = before_query(path);
        self.entries
            .iter()
            .find(|e| e.method.matches(method) && e.matches_path(path))
            .map_or(RouteClass::Unknown, |e| e.class)
    }
}

fn patterns_overlap(a: &str, b: &str) -> bool {
    let (sa, sb): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
    sa.len() == sb.len()
        && sa
            .iter()
            .zip(&sb)
            .all(|(x, y)| is_param(x) || is_param(y) || x == y)
}

/// What vacancyd does with a classified request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePolicy {
    /// Admit as work, then forward.
    Admit(WorkRoute),
    /// Forward without admission or reservation.
    Forward,
    /// Refuse before anything is forwarded or reserved.
    Refuse(RefusalCode),
}

/// The route rules of seed 000 in one place.
///
/// # Behavior
///
/// - Work is admitted (ROUTE-01: only listed work ever is).
/// - Borrower reads and discovery are forwarded without admission (VOICE-06, ROUTE-12).
/// - Management routes, and GET/HEAD the table does not list, are refused with
///   403 `route_forbidden` unless `management = "allow"`, which forwards them
///   without a reservation (ROUTE-02, ROUTE-08, ROUTE-09).
/// - Any other method on an unlisted route is refused with 501
///   `route_not_supported`, even with `management = "allow"` (ROUTE-03 and the
///   ROUTE-09 Ambiguity reading).
pub fn route_policy(
    class: RouteClass,
    method: &http::Method,
    management: Management,
) -> RoutePolicy {
    let read = method == http::Method::GET || method == http::Method::HEAD;
    match class {
        RouteClass::Work(w) => RoutePolicy::Admit(w),
        RouteClass::BorrowerRead | RouteClass::Discovery => RoutePolicy::Forward,
        RouteClass::Management | RouteClass::Unknown if read || class == RouteClass::Management => {
            match management {
                Management::Allow => RoutePolicy::Forward,
                Management::Deny => RoutePolicy::Refuse(RefusalCode::RouteForbidden),
            }
        }
        RouteClass::Management | RouteClass::Unknown => {
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        }
    }
}

/// Whether an upstream's management routes are forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Management {
    /// Refused.
    #[default]
    Deny,
    /// Forwarded, never reserved.
    Allow,
}

names! {
    Management { Deny => "deny", Allow => "allow" }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::Method;

    fn id_shape(s: &str) -> bool {
        (8..=80).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    fn table() -> RouteTable {
        RouteTable::new(vec![
            RouteSpec::new(
                RouteMethod::Post,
                "/v1/chat/completions",
                RouteClass::Work(WorkRoute::response_end()),
            ),
            RouteSpec::new(RouteMethod::Get, "/v1/models", RouteClass::Discovery),
            RouteSpec::new(RouteMethod::Get, "/slots", RouteClass::Management),
            RouteSpec {
                param_check: Some(id_shape),
                ..RouteSpec::new(
                    RouteMethod::Get,
                    "/v1/audio/executions/{id}",
                    RouteClass::BorrowerRead,
                )
            },
        ])
        .unwrap()
    }

    #[test]
    fn classifies_listed_routes_and_ignores_the_query() {
        let t = table();
        assert!(matches!(
            t.classify(&Method::POST, "/v1/chat/completions?x=1"),
            RouteClass::Work(_)
        ));
        assert_eq!(
            t.classify(&Method::HEAD, "/v1/models"),
            RouteClass::Discovery
        );
        assert_eq!(
            t.classify(&Method::GET, "/v1/chat/completions"),
            RouteClass::Unknown
        );
        assert_eq!(
            t.classify(&Method::GET, "/v1/models/extra"),
            RouteClass::Unknown
        );
    }

    #[test]
    fn classify_agrees_with_each_entrys_own_match() {
        // The table's answer is its first entry's own: classification
        // ignores the query as each entry's match does.
        let t = table();
        for method in [Method::GET, Method::HEAD, Method::POST] {
            for path in [
                "/v1/models",
                "/v1/models?x=1",
                "/v1/models/",
                "/slots",
                "/v1/chat/completions",
                "/v1/audio/executions/abc_1234",
                "/v1/audio/executions/{id}",
                "/v1/audio/executions/",
                "/",
            ] {
                let by_entries = t
                    .entries()
                    .iter()
                    .find(|e| e.matches(&method, path))
                    .map_or(RouteClass::Unknown, |e| e.class);
                assert_eq!(t.classify(&method, path), by_entries, "{method} {path}");
            }
        }
    }

    #[test]
    fn param_segments_must_pass_their_check() {
        // VOICE-07
        let t = table();
        assert_eq!(
            t.classify(&Method::GET, "/v1/audio/executions/abc_1234"),
            RouteClass::BorrowerRead
        );
        assert_eq!(
            t.classify(&Method::GET, "/v1/audio/executions/short"),
            RouteClass::Unknown
        );
        assert_eq!(
            t.classify(&Method::GET, "/v1/audio/executions/has.dot.in.it"),
            RouteClass::Unknown
        );
        assert_eq!(
            t.classify(&Method::GET, "/v1/audio/executions/"),
            RouteClass::Unknown
        );
    }

    /// ROUTE-01's match written plainly: segment by segment.
    fn matches_by_segments(pattern: &str, path: &str) -> bool {
        let (want, got): (Vec<&str>, Vec<&str>) =
            (pattern.split('/').collect(), path.split('/').collect());
        want.len() == got.len()
            && want
                .iter()
                .zip(&got)
                .all(|(w, g)| if is_param(w) { !g.is_empty() } else { w == g })
    }

    proptest::proptest! {
        #[test]
        fn route_01_a_path_matches_a_pattern_segment_by_segment(
            pattern in proptest::sample::select(vec![
                "/v1/models", "/v1/chat/completions", "/", "/api/jobs/{id}", "/a/{x}/b", "/{p}",
            ]),
            segments in proptest::collection::vec(
                proptest::sample::select(vec!["v1", "models", "chat", "completions", "", "api", "jobs", "a", "b", "7"]),
                0..5,
            ),
        ) {
            let path = format!("/{}", segments.join("/"));
            let spec = RouteSpec::new(RouteMethod::Get, pattern, RouteClass::Discovery);
            proptest::prop_assert_eq!(spec.matches_path(&path), matches_by_segments(pattern, &path), "{} {}", pattern, path);
        }
    }

    #[test]
    fn overlapping_entries_are_refused_when_the_table_is_built() {
        let err = RouteTable::new(vec![
            RouteSpec::new(RouteMethod::Get, "/api/jobs/{id}", RouteClass::Management),
            RouteSpec::new(RouteMethod::Get, "/api/jobs/list", RouteClass::Discovery),
        ])
        .unwrap_err();
        assert_eq!(err.second, "/api/jobs/list");
        // Same path, different methods: fine.
        RouteTable::new(vec![
            RouteSpec::new(RouteMethod::Get, "/slots", RouteClass::Management),
            RouteSpec::new(RouteMethod::Post, "/slots", RouteClass::Management),
        ])
        .unwrap();
    }

    #[test]
    fn unknown_reads_are_403_and_other_unknown_methods_501() {
        // ROUTE-01, ROUTE-02, ROUTE-03
        let deny = Management::Deny;
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::GET, deny),
            RoutePolicy::Refuse(RefusalCode::RouteForbidden)
        );
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::HEAD, deny),
            RoutePolicy::Refuse(RefusalCode::RouteForbidden)
        );
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::POST, deny),
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        );
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::DELETE, deny),
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        );
    }

    #[test]
    fn management_is_403_unless_allowed_then_forwarded_without_admission() {
        // ROUTE-08, ROUTE-09 (and its Ambiguity: 501 stays)
        assert_eq!(
            route_policy(RouteClass::Management, &Method::POST, Management::Deny),
            RoutePolicy::Refuse(RefusalCode::RouteForbidden)
        );
        assert_eq!(
            route_policy(RouteClass::Management, &Method::POST, Management::Allow),
            RoutePolicy::Forward
        );
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::GET, Management::Allow),
            RoutePolicy::Forward
        );
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::PUT, Management::Allow),
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        );
    }

    #[test]
    fn reads_and_discovery_are_forwarded_and_work_is_admitted() {
        // VOICE-06, ROUTE-12
        assert_eq!(
            route_policy(RouteClass::Discovery, &Method::GET, Management::Deny),
            RoutePolicy::Forward
        );
        assert_eq!(
            route_policy(RouteClass::BorrowerRead, &Method::GET, Management::Deny),
            RoutePolicy::Forward
        );
        let w = WorkRoute::response_end();
        assert_eq!(
            route_policy(RouteClass::Work(w), &Method::POST, Management::Deny),
            RoutePolicy::Admit(w)
        );
    }
}
