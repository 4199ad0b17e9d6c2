//! Who a borrower request is for, with named borrowers on (issue 34).
//!
//! # Behavior
//!
//! - The key a request carries (`x-vacancy-key`, else `Authorization:
//!   Bearer`) is taken off the request and never forwarded: every
//!   `Authorization` header goes, and an upstream that needs a credential
//!   of its own gets its `[upstream.credential]` instead.
//! - Work needs a known key (`require_key`, the default); a missing or
//!   unknown one is refused 401 `unknown_borrower` with what to do.
//!   Discovery and reads stay open unless `reads_need_key`.
//! - `vacancy-priority: batch` lowers a request's class (never raises it);
//!   any other value than `interactive` or `batch` is a 400.
//! - The keys can be replaced while requests run (a keys file reload): each
//!   request reads the table once.

use std::sync::{Arc, RwLock};

use http::HeaderMap;

use crate::auth::BorrowerKeys;
use crate::config::BorrowersConfig;
use crate::engine::{Priority, Refusal, RefusalCode};
use crate::traits::RoutePolicy;

/// The header a borrower may send its key in, besides `Authorization: Bearer`.
pub const KEY_HEADER: &str = "x-vacancy-key";
/// The header that lowers a request's class.
pub const PRIORITY_HEADER: &str = "vacancy-priority";
/// The header on a response to a request that waited in line: its place
/// when it joined, 1 being next.
pub const LINE_POSITION_HEADER: &str = "vacancy-line-position";
/// A borrower's own view of its use, limits and place in line.
pub const ME_PATH: &str = "/v1/vacancy/me";

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No key.
    NoKey,
    /// A key of this borrower.
    Named(Arc<str>),
    /// A key no borrower has (or an `Authorization` that is not a bearer key).
    UnknownKey,
}

impl Caller {
    /// The borrower's name, if the key is known.
    pub fn name(&self) -> Option<&Arc<str>> {
        match self {
            Caller::Named(n) => Some(n),
            _ => None,
        }
    }
}

/// The keys in force and what they open.
#[derive(Debug)]
pub struct BorrowerGate {
    keys: RwLock<Arc<BorrowerKeys>>,
    require_key: bool,
    reads_need_key: bool,
}

impl BorrowerGate {
    /// A gate with `keys` under `config`'s terms.
    pub fn new(keys: BorrowerKeys, config: &BorrowersConfig) -> Self {
        BorrowerGate {
            keys: RwLock::new(Arc::new(keys)),
            require_key: config.require_key,
            reads_need_key: config.reads_need_key,
        }
    }

    /// Replace the keys (a keys file reload).
    pub fn replace_keys(&self, keys: BorrowerKeys) {
        let keys = Arc::new(keys);
        match self.keys.write() {
            Ok(mut k) => *k = keys,
            Err(poisoned) => *poisoned.into_inner() = keys,
        }
    }

    /// The keys in force.
    pub fn keys(&self) -> Arc<BorrowerKeys> {
        match self.keys.read() {
            Ok(k) => Arc::clone(&k),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Take the key off `headers` and say whose it is.
    pub fn take_caller(&self, headers: &mut HeaderMap) -> Caller {
        let bearer = headers.remove(http::header::AUTHORIZATION);
        // `remove` returns the first value and drops the rest.
        let own = headers.remove(KEY_HEADER);
        let presented = match (&own, &bearer) {
            (Some(k), _) => k.to_str().ok().map(str::trim),
            (None, Some(a)) => a.to_str().ok().and_then(bearer_key),
            (None, None) => return Caller::NoKey,
        };
        match presented.filter(|k| !k.is_empty()) {
            None => Caller::UnknownKey,
            Some(key) => match self.keys().identify(key) {
                Some(name) => Caller::Named(Arc::clone(name)),
                None => Caller::UnknownKey,
            },
        }
    }

    /// Why a request of `policy` from `caller` is refused before it is
    /// read, if it is: work without a known key, and reads too with
    /// `reads_need_key`. What the seed refuses anyway is left to its refusal.
    pub fn refusal(&self, caller: &Caller, policy: &RoutePolicy) -> Option<Refusal> {
        match policy {
            RoutePolicy::Admit(_) => self.refuse_work(caller),
            RoutePolicy::Forward => self.refuse_read(caller),
            RoutePolicy::Refuse(_) => None,
        }
    }

    /// Why work from `caller` is refused before it is read, if it is.
    pub fn refuse_work(&self, caller: &Caller) -> Option<Refusal> {
        match caller {
            Caller::Named(_) => None,
            Caller::NoKey if !self.require_key => None,
            Caller::NoKey => Some(no_key()),
            Caller::UnknownKey => Some(unknown_key()),
        }
    }

    /// Why a read (discovery, a status poll) from `caller` is refused, if it is.
    pub fn refuse_read(&self, caller: &Caller) -> Option<Refusal> {
        if !self.reads_need_key {
            return None;
        }
        match caller {
            Caller::Named(_) => None,
            Caller::NoKey => Some(no_key()),
            Caller::UnknownKey => Some(unknown_key()),
        }
    }
}

/// The key of an `Authorization: Bearer <key>` value.
fn bearer_key(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

fn no_key() -> Refusal {
    Refusal::new(
        RefusalCode::UnknownBorrower,
        "this machine lends to named borrowers only: send your key as Authorization: Bearer <key> (the api_key of the openai SDK) or as x-vacancy-key; ask the machine's owner for one",
    )
}

fn unknown_key() -> Refusal {
    Refusal::new(
        RefusalCode::UnknownBorrower,
        "the key sent is not one this machine knows (it may have been removed); check it, or ask the machine's owner for a key",
    )
}

/// The class a request asks for in `vacancy-priority`, taken off `headers`.
///
/// # Errors
///
/// A value other than `interactive` or `batch`, as a 400 refusal.
pub fn take_priority(headers: &mut HeaderMap) -> Result<Option<Priority>, Refusal> {
    let Some(v) = headers.remove(PRIORITY_HEADER) else {
        return Ok(None);
    };
    let text = v.to_str().unwrap_or("").trim().to_ascii_lowercase();
    text.parse().map(Some).map_err(|_| {
        Refusal::new(
            RefusalCode::InvalidRequest,
            "the vacancy-priority header must be interactive or batch",
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::auth::hash_borrower_key;

    fn gate(require_key: bool, reads_need_key: bool) -> BorrowerGate {
        let text = format!(
            "[[borrower]]\nname = \"alice\"\nkey_sha256 = \"{}\"\n",
            hash_borrower_key("vbk_a")
        );
        let config = BorrowersConfig {
            require_key,
            reads_need_key,
            ..BorrowersConfig::default()
        };
        let file = crate::config::KeysFile::parse(&text, "k").unwrap();
        BorrowerGate::new(BorrowerKeys::new(file), &config)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_key_is_taken_off_the_request_and_names_its_borrower() {
        // issue 34 item 1: consumed, never forwarded
        let g = gate(true, false);
        for pairs in [
            vec![("authorization", "Bearer vbk_a")],
            vec![("authorization", "bearer  vbk_a ")],
            vec![
                ("x-vacancy-key", "vbk_a"),
                ("authorization", "Bearer other"),
            ],
        ] {
            let mut h = headers(&pairs);
            assert_eq!(
                g.take_caller(&mut h),
                Caller::Named("alice".into()),
                "{pairs:?}"
            );
            assert!(h.get("authorization").is_none() && h.get(KEY_HEADER).is_none());
        }
        let mut h = headers(&[("authorization", "Basic dXNlcjpwYXNz")]);
        assert_eq!(g.take_caller(&mut h), Caller::UnknownKey);
        assert!(h.is_empty());
        assert_eq!(g.take_caller(&mut HeaderMap::new()), Caller::NoKey);
    }

    #[test]
    fn work_needs_a_known_key_and_reads_stay_open_unless_closed() {
        // issue 34 item 1
        let g = gate(true, false);
        let no = g.refuse_work(&Caller::NoKey).unwrap();
        assert_eq!(no.code, RefusalCode::UnknownBorrower);
        assert!(no.reason.contains("Authorization: Bearer"), "{}", no.reason);
        assert!(g.refuse_work(&Caller::UnknownKey).is_some());
        assert!(g.refuse_work(&Caller::Named("alice".into())).is_none());
        assert!(g.refuse_read(&Caller::NoKey).is_none());
        let open = gate(false, true);
        assert!(open.refuse_work(&Caller::NoKey).is_none());
        assert!(open.refuse_work(&Caller::UnknownKey).is_some());
        assert!(open.refuse_read(&Caller::NoKey).is_some());
    }

    #[test]
    fn a_priority_header_is_interactive_or_batch() {
        // issue 34 item 2
        let mut h = headers(&[("vacancy-priority", "Batch")]);
        assert_eq!(take_priority(&mut h).unwrap(), Some(Priority::Batch));
        assert!(h.is_empty());
        let mut h = headers(&[("vacancy-priority", "urgent")]);
        assert_eq!(
            take_priority(&mut h).unwrap_err().code,
            RefusalCode::InvalidRequest
        );
        assert_eq!(take_priority(&mut HeaderMap::new()).unwrap(), None);
    }
}
