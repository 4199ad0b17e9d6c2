//! Ollama model names and request kinds (RES-06).
//!
//! Ollama resolves a model name the way `types/model/name.go` (v0.32.15)
//! parses it: `[host/][namespace/]model[:tag][@digest]`, with the defaults
//! host `registry.ollama.ai`, namespace `library` and tag `latest`, compared
//! without regard to case. `/api/ps` reports the shortest display form
//! (`llama3:latest`, `user/model:q4`, `hf.co/user/repo:Q4_K_M`).

use std::fmt;
use std::str::FromStr;

const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const DEFAULT_TAG: &str = "latest";

/// The canonical form of an Ollama model name: lowercase, shortest display
/// form, tag filled in.
///
/// # Behavior
///
/// `llama3`, `llama3:latest`, `library/llama3`, `LLaMA3` and
/// `registry.ollama.ai/library/llama3:latest` are all `llama3:latest`;
/// `user/model` is `user/model:latest`; `hf.co/u/r:Q4` stays `hf.co/u/r:q4`;
/// a host with a port (`localhost:5000/ns/m`) is not mistaken for a tag; an
/// `@digest` suffix is kept. Configuration lookups never use this: they stay
/// exact (MEM-06).
pub fn canonical_model(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    let (base, digest) = match lower.split_once('@') {
        Some((b, d)) => (b, Some(d)),
        None => (lower.as_str(), None),
    };
    let last_slash = base.rfind('/');
    let (path, tag) = match base.rfind(':') {
        Some(i) if last_slash.is_none_or(|s| i > s) => (&base[..i], &base[i + 1..]),
        _ => (base, ""),
    };
    // Whitespace around a part is not part of the name: trimming each part,
    // not only the whole, keeps the result a fixed point (the fuzzer's
    // `registry.ollama.ai/ ibrary/llama3` left " ibrary/llama3", which a
    // second pass trimmed).
    let tag = tag.trim();
    let tag = if tag.is_empty() { DEFAULT_TAG } else { tag };
    let digest = digest.map(str::trim);
    let parts: Vec<&str> = path.split('/').map(str::trim).collect();
    let (host, namespace, model) = match parts.as_slice() {
        [model] => (DEFAULT_HOST, DEFAULT_NAMESPACE, *model),
        [namespace, model] => (DEFAULT_HOST, *namespace, *model),
        // Ollama names have one namespace part; a longer path keeps its first.
        [host, namespace, .., model] => (*host, *namespace, *model),
        [] => (DEFAULT_HOST, DEFAULT_NAMESPACE, ""),
    };
    let mut out = String::with_capacity(base.len() + 8);
    if host != DEFAULT_HOST {
        out.push_str(host);
        out.push('/');
        out.push_str(namespace);
        out.push('/');
    } else if namespace != DEFAULT_NAMESPACE {
        out.push_str(namespace);
        out.push('/');
    }
    out.push_str(model);
    out.push(':');
    out.push_str(tag);
    if let Some(d) = digest {
        out.push('@');
        out.push_str(d);
    }
    out
}

/// Which of Ollama's API families a request came through.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// The native `/api/...` routes, which read `options.num_ctx`.
    Api,
    /// The OpenAI-compatible `/v1/...` routes, which never set `num_ctx`.
    V1,
}

impl Family {
    /// `/api` or `/v1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Api => "/api",
            Family::V1 => "/v1",
        }
    }
}

/// A request's kind (RES-06): the canonical model, the explicit `num_ctx` or
/// its absence, and the route family. Learned contexts are keyed by it.
///
/// # Behavior
///
/// Its `Display` form is the kind string the engine matches
/// (`llama3:latest, num_ctx 8192, /api`; `llama3:latest, num_ctx unset, /v1`)
/// and shows in refusals and `/status`; [`FromStr`] reads it back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKind {
    /// The canonical model ([`canonical_model`]).
    pub model: String,
    /// `options.num_ctx` when the request sets it.
    pub num_ctx: Option<u64>,
    /// The route family.
    pub family: Family,
}

impl fmt::Display for RequestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.num_ctx {
            Some(n) => write!(f, "{}, num_ctx {n}, {}", self.model, self.family.as_str()),
            None => write!(f, "{}, num_ctx unset, {}", self.model, self.family.as_str()),
        }
    }
}

/// A kind string that is not one [`RequestKind`] writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an Ollama request kind: {0:?}")]
pub struct BadKind(String);

impl FromStr for RequestKind {
    type Err = BadKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadKind(s.to_owned());
        let (rest, family) = s.rsplit_once(", ").ok_or_else(bad)?;
        let (model, ctx) = rest.rsplit_once(", ").ok_or_else(bad)?;
        let family = match family {
            "/api" => Family::Api,
            "/v1" => Family::V1,
            _ => return Err(bad()),
        };
        let num_ctx = match ctx.strip_prefix("num_ctx ").ok_or_else(bad)? {
            "unset" => None,
            n => Some(n.parse().map_err(|_| bad())?),
        };
        if model.is_empty() {
            return Err(bad());
        }
        Ok(RequestKind {
            model: model.to_owned(),
            num_ctx,
            family,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn whitespace_around_a_part_is_trimmed_so_canonical_names_are_fixed_points() {
        // RES-06: found by the ollama_model_name fuzz target (CI, 15 s run).
        for (given, canonical) in [
            (
                "registry.ollama.ai/ ibrary/llama3:laxest",
                "ibrary/llama3:laxest",
            ),
            ("registry.ollama.ai/library/ m", "m:latest"),
            ("user / model : q4 ", "user/model:q4"),
            ("m@ sha256:ab ", "m:latest@sha256:ab"),
        ] {
            let c = canonical_model(given);
            assert_eq!(c, canonical, "{given:?}");
            assert_eq!(canonical_model(&c), c, "{given:?}");
        }
    }

    #[test]
    fn names_resolve_as_ollama_resolves_them() {
        // RES-06: the kind's model is the canonical model.
        for (given, canonical) in [
            ("llama3", "llama3:latest"),
            ("llama3:latest", "llama3:latest"),
            ("LLaMA3", "llama3:latest"),
            ("library/llama3", "llama3:latest"),
            ("registry.ollama.ai/library/llama3:latest", "llama3:latest"),
            ("registry.ollama.ai/user/m", "user/m:latest"),
            ("llama3.1:8b", "llama3.1:8b"),
            ("user/model", "user/model:latest"),
            (
                "hf.co/bartowski/Llama-3.2-1B-GGUF:Q4_K_M",
                "hf.co/bartowski/llama-3.2-1b-gguf:q4_k_m",
            ),
            ("hf.co/u/r", "hf.co/u/r:latest"),
            ("localhost:5000/ns/m", "localhost:5000/ns/m:latest"),
            ("localhost:5000/ns/m:v2", "localhost:5000/ns/m:v2"),
            ("m@sha256:abc", "m:latest@sha256:abc"),
            ("m:", "m:latest"),
        ] {
            assert_eq!(canonical_model(given), canonical, "{given}");
        }
    }

    #[test]
    fn kinds_print_and_parse_back() {
        // RES-06
        for kind in [
            RequestKind {
                model: "llama3:latest".into(),
                num_ctx: Some(8192),
                family: Family::Api,
            },
            RequestKind {
                model: "llama3:latest".into(),
                num_ctx: None,
                family: Family::Api,
            },
            RequestKind {
                model: "hf.co/u/r:q4".into(),
                num_ctx: None,
                family: Family::V1,
            },
        ] {
            let s = kind.to_string();
            assert_eq!(s.parse::<RequestKind>().unwrap(), kind, "{s}");
        }
        assert_eq!(
            RequestKind {
                model: "m:latest".into(),
                num_ctx: Some(2048),
                family: Family::Api
            }
            .to_string(),
            "m:latest, num_ctx 2048, /api"
        );
        for bad in [
            "",
            "m",
            "m, num_ctx x, /api",
            "m, num_ctx 1, /v2",
            ", num_ctx 1, /api",
        ] {
            assert!(bad.parse::<RequestKind>().is_err(), "{bad}");
        }
    }
}
