//! Control-plane tokens: only their SHA-256 is stored (`[[server.token]]`),
//! and a presented token is compared by hash in constant time.

use sha2::{Digest, Sha256};

use crate::config::{Scope, TokenConfig};

/// The lowercase hex SHA-256 of a token, as `[[server.token]] sha256` stores it.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    hex
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Equal without an early exit, so timing does not reveal how much matched.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh random token: 32 bytes from the operating system, hex-encoded.
///
/// # Errors
///
/// The operating system's random source failed.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    let mut out = String::from("vac_");
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    Ok(out)
}

/// Why a request was not authorized. The messages never say which tokens exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `Authorization: Bearer` header, or a token that matches no configured hash (401).
    #[error(
        "a valid bearer token is required (Authorization: Bearer <token>); create one with `vacancyd token new`"
    )]
    Unauthenticated,
    /// A valid token without the needed scope (403).
    #[error("this token's scope does not allow this action; it needs scope {0}")]
    Forbidden(&'static str),
}

/// The configured tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    tokens: Vec<TokenConfig>,
}

impl Tokens {
    /// The tokens of `[[server.token]]`.
    pub fn new(tokens: Vec<TokenConfig>) -> Self {
        Tokens { tokens }
    }

    /// The token presented in an `Authorization` header value, if it matches
    /// a configured hash. Every configured hash is compared, matched or not.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<&TokenConfig> {
        // RFC 9110 §11.1: the scheme is case-insensitive and followed by
        // one or more spaces.
        let (scheme, rest) = authorization?.trim_start().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let presented = Some(rest.trim()).filter(|t| !t.is_empty())?;
        let hash = hash_token(presented);
        let mut found = None;
        for t in &self.tokens {
            if constant_time_eq(hash.as_bytes(), t.sha256.to_ascii_lowercase().as_bytes())
                && found.is_none()
            {
                found = Some(t);
            }
        }
        found
    }

    /// Authenticate and check that the token grants `needed`.
    pub fn authorize(
        &self,
        authorization: Option<&str>,
        needed: Scope,
    ) -> Result<&TokenConfig, AuthError> {
        let token = self
            .authenticate(authorization)
            .ok_or(AuthError::Unauthenticated)?;
        if token.grants(needed) {
            Ok(token)
        } else {
            Err(AuthError::Forbidden(needed.as_str()))
        }
    }
}

/// The keys of a checked keys file (issue 34), for telling who a borrower
/// request is for.
///
/// # Behavior
///
/// A presented key is hashed (SHA-256) and looked up by its hash; the hash
/// found is compared again in constant time. The lookup's timing depends
/// only on the hash of what was presented, which tells an attacker nothing
/// about any key, and no key is ever stored or logged.
#[derive(Debug, Clone, Default)]
pub struct BorrowerKeys {
    by_hash: std::collections::HashMap<[u8; 32], usize>,
    names: Vec<std::sync::Arc<str>>,
    file: crate::config::KeysFile,
}

impl BorrowerKeys {
    /// The keys of `file`.
    pub fn new(file: crate::config::KeysFile) -> Self {
        let mut by_hash = std::collections::HashMap::new();
        let mut names = Vec::new();
        for (i, b) in file.borrowers.iter().enumerate() {
            if let Some(hash) = digest_of_hex(&b.key_sha256) {
                by_hash.insert(hash, i);
            }
            names.push(std::sync::Arc::from(b.name.as_str()));
        }
        BorrowerKeys {
            by_hash,
            names,
            file,
        }
    }

    /// Read and check the keys file at `path` ([`KeysFile::load`](crate::config::KeysFile::load)).
    ///
    /// # Errors
    ///
    /// Every problem of the file, each with its key and line.
    pub fn load(path: &std::path::Path) -> Result<Self, crate::config::ConfigErrors> {
        crate::config::KeysFile::load(path).map(Self::new)
    }

    /// The borrower whose key `presented` is, if any.
    pub fn identify(&self, presented: &str) -> Option<&std::sync::Arc<str>> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let &i = self.by_hash.get(&digest)?;
        let stored = digest_of_hex(&self.file.borrowers[i].key_sha256)?;
        constant_time_eq(&stored, &digest).then(|| &self.names[i])
    }

    /// How many borrowers the file names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The file the keys come from.
    pub fn file(&self) -> &crate::config::KeysFile {
        &self.file
    }

    /// The engine's borrower table under `config`'s terms.
    pub fn spec(&self, config: &crate::config::BorrowersConfig) -> crate::engine::BorrowersSpec {
        self.file.spec(config)
    }
}

/// The 32 bytes of a hex SHA-256; `None` if it is not one.
fn digest_of_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

/// A fresh borrower key: 32 random bytes from the operating system,
/// hex-encoded after `vbk_`, so a key found in a log or a paste is
/// recognizable as vacancy's.
///
/// # Errors
///
/// The operating system's random source failed.
pub fn new_borrower_key() -> Result<String, getrandom::Error> {
    let token = new_token()?;
    Ok(format!("vbk_{}", token.trim_start_matches("vac_")))
}

/// The hash a keys file stores for `key`.
pub fn hash_borrower_key(key: &str) -> String {
    hash_token(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hashes_are_lowercase_hex_sha256() {
        assert_eq!(
            hash_token("example-token-do-not-use"),
            "3690a4a2ed3b26b46a696e9ab873a300d9da3ae56bc84352e2bf724885c91dfd"
        );
    }

    #[test]
    fn new_tokens_are_random_and_long() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 64);
    }

    #[test]
    fn scopes_nest_and_unknown_tokens_are_unauthenticated() {
        let tokens = Tokens::new(vec![
            TokenConfig {
                name: "reader".into(),
                scopes: vec![Scope::Read],
                sha256: hash_token("r"),
            },
            TokenConfig {
                name: "owner".into(),
                scopes: vec![Scope::Owner],
                sha256: hash_token("o").to_ascii_uppercase(),
            },
            TokenConfig {
                name: "ops".into(),
                scopes: vec![Scope::Admin],
                sha256: hash_token("a"),
            },
        ]);
        assert_eq!(
            tokens
                .authorize(Some("Bearer a"), Scope::Admin)
                .unwrap()
                .name,
            "ops"
        );
        assert_eq!(
            tokens
                .authorize(Some("Bearer a"), Scope::Read)
                .unwrap()
                .name,
            "ops"
        );
        assert_eq!(
            tokens
                .authorize(Some("Bearer o"), Scope::Owner)
                .unwrap()
                .name,
            "owner"
        );
        assert_eq!(
            tokens.authorize(Some("Bearer o"), Scope::Admin),
            Err(AuthError::Forbidden("admin"))
        );
        assert_eq!(
            tokens.authorize(Some("Bearer r"), Scope::Owner),
            Err(AuthError::Forbidden("owner"))
        );
        assert_eq!(
            tokens.authorize(Some("Bearer x"), Scope::Read),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            tokens.authorize(Some("a"), Scope::Read),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            tokens.authorize(None, Scope::Read),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            tokens.authorize(Some("Bearer "), Scope::Read),
            Err(AuthError::Unauthenticated)
        );
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        // Issue 14 item 14, RFC 9110 §11.1.
        let tokens = Tokens::new(vec![TokenConfig {
            name: "ops".into(),
            scopes: vec![Scope::Admin],
            sha256: hash_token("a"),
        }]);
        for header in ["bearer a", "BEARER a", "Bearer  a", "bEaReR a "] {
            assert!(
                tokens.authorize(Some(header), Scope::Admin).is_ok(),
                "{header:?}"
            );
        }
        for header in ["Basic a", "Bearera", "Token a"] {
            assert_eq!(
                tokens.authorize(Some(header), Scope::Read),
                Err(AuthError::Unauthenticated),
                "{header:?}"
            );
        }
    }

    #[test]
    fn a_borrowers_key_names_its_borrower_and_nothing_else_does() {
        // issue 34 item 1
        let text = format!(
            "[[borrower]]\nname = \"alice\"\nkey_sha256 = \"{}\"\n",
            hash_borrower_key("vbk_alice")
        );
        let keys = BorrowerKeys::new(crate::config::KeysFile::parse(&text, "keys").unwrap());
        assert_eq!(keys.identify("vbk_alice").map(|n| &**n), Some("alice"));
        assert_eq!(keys.identify("vbk_alicf"), None);
        assert_eq!(keys.identify(""), None);
        assert_eq!(
            keys.identify(&hash_borrower_key("vbk_alice")),
            None,
            "the hash is not a key"
        );
    }

    #[test]
    fn new_borrower_keys_are_random_long_and_recognizable() {
        let (a, b) = (new_borrower_key().unwrap(), new_borrower_key().unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with("vbk_") && a.len() == 68, "{a}");
    }
}
