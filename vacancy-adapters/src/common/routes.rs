//! Route entries several adapters share, written once: the OpenAI `/v1`
//! block that Ollama, llama-server, OpenAI-compatible servers and vLLM all
//! serve, [`routes!`](crate::routes) to write a table as one line per method
//! and class, and [`join_routes!`](crate::join_routes) to build an adapter's
//! `const` table from such blocks and its own entries.

use vacancy::traits::{RouteClass, RouteMethod, RouteSpec, WorkRoute};

/// A work route released at the clean end of its response (DONE-01): what
/// most adapters' work routes are.
pub const WORK: RouteClass = RouteClass::Work(WorkRoute::response_end());

/// The OpenAI `/v1` routes every OpenAI-compatible upstream here serves.
///
/// # Behavior
///
/// - Work (DONE-01): `POST /v1/chat/completions`, `/v1/completions`,
///   `/v1/embeddings`, `/v1/responses` (its background mode refused,
///   ROUTE-05..07, by the inspection).
/// - Discovery (ROUTE-12): `GET` (and `HEAD`) `/v1/models` and
///   `/v1/models/{id}` (one path segment: an ID containing `/` is not
///   matched, and so refused as an unlisted read).
pub const OPENAI_V1: &[RouteSpec] = crate::routes![
    Post WORK => ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"];
    Get RouteClass::Discovery => ["/v1/models", "/v1/models/{id}"];
];

/// OpenAI's audio input routes, work sent as `multipart/form-data` uploads:
/// `POST /v1/audio/transcriptions` and `/v1/audio/translations`.
pub const OPENAI_AUDIO_INPUT: &[RouteSpec] = crate::routes![
    Post WORK => ["/v1/audio/transcriptions", "/v1/audio/translations"];
];

/// A `&'static [RouteSpec]` written as one line per method and class: each
/// line names a [`RouteMethod`] variant, a [`RouteClass`] and the paths that
/// have both, in the order the entries take.
///
/// ```
/// use vacancy::traits::RouteClass;
/// use vacancy_adapters::common::routes::WORK;
///
/// const ROUTES: &[vacancy::traits::RouteSpec] = vacancy_adapters::routes![
///     Post WORK => ["/generate", "/embed"];
///     Get RouteClass::Discovery => ["/health"];
/// ];
/// assert_eq!(ROUTES.len(), 3);
/// assert_eq!(ROUTES[1].path, "/embed");
/// ```
#[macro_export]
macro_rules! routes {
    ($($method:ident $class:expr => [$($path:literal),+ $(,)?]);+ $(;)?) => {
        &[$($(::vacancy::traits::RouteSpec::new(
            ::vacancy::traits::RouteMethod::$method,
            $path,
            $class,
        ),)+)+]
    };
}

/// The number of entries in `parts` together.
///
/// For [`join_routes!`](crate::join_routes), which sizes the joined array with it.
pub const fn joined_len(parts: &[&[RouteSpec]]) -> usize {
    let mut len = 0;
    let mut i = 0;
    while i < parts.len() {
        len += parts[i].len();
        i += 1;
    }
    len
}

/// `parts`, one after the other, as one array of `N` entries.
///
/// # Behavior
///
/// `N` must be [`joined_len`] of `parts`; anything else fails to compile
/// where the table is a `const` (and panics elsewhere). Prefer
/// [`join_routes!`](crate::join_routes), which passes the right `N`.
pub const fn join<const N: usize>(parts: &[&[RouteSpec]]) -> [RouteSpec; N] {
    assert!(
        joined_len(parts) == N,
        "join: N is not the number of entries"
    );
    // Any entry will do: every one is overwritten below.
    let mut out = [RouteSpec::new(RouteMethod::Get, "/", RouteClass::Unknown); N];
    let (mut at, mut i) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[at] = parts[i][j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    out
}

/// A `&'static [RouteSpec]` of route blocks joined in order, for an
/// adapter's `const ROUTES` table.
///
/// ```
/// use vacancy::traits::{RouteClass, RouteMethod, RouteSpec};
/// use vacancy_adapters::common::routes::{OPENAI_V1, WORK};
///
/// const OWN: &[RouteSpec] = &[RouteSpec::new(RouteMethod::Post, "/rerank", WORK)];
/// const ROUTES: &[RouteSpec] = vacancy_adapters::join_routes![OPENAI_V1, OWN];
/// assert_eq!(ROUTES.len(), OPENAI_V1.len() + 1);
/// ```
#[macro_export]
macro_rules! join_routes {
    ($($part:expr),+ $(,)?) => {{
        const PARTS: &[&[::vacancy::traits::RouteSpec]] = &[$($part),+];
        const JOINED: [::vacancy::traits::RouteSpec; $crate::common::routes::joined_len(PARTS)] =
            $crate::common::routes::join(PARTS);
        &JOINED
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &[RouteSpec] = &[RouteSpec::new(RouteMethod::Post, "/own", WORK)];
    const JOINED: &[RouteSpec] = crate::join_routes![OWN, OPENAI_V1, OPENAI_AUDIO_INPUT];

    #[test]
    fn joined_blocks_keep_every_entry_in_order() {
        let paths: Vec<&str> = JOINED.iter().map(|r| r.path).collect();
        let want: Vec<&str> = OWN
            .iter()
            .chain(OPENAI_V1)
            .chain(OPENAI_AUDIO_INPUT)
            .map(|r| r.path)
            .collect();
        assert_eq!(paths, want);
        assert!(vacancy::traits::RouteTable::new(JOINED.to_vec()).is_ok());
    }
}
