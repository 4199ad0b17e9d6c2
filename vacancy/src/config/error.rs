//! Configuration errors and warnings, each with its key path and line.

use std::fmt;

/// One problem in a configuration: where it is and what to do about it.
///
/// Displays as `line 12: upstream[0] ("ollama").also_requires: unknown resource "gpu9"; ...`.
/// Either part before the message is left out when unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The key path, e.g. `upstream[0] ("ollama").also_requires`; empty for the
    /// file as a whole (a syntax error, an unreadable file).
    pub path: String,
    /// The 1-based line the problem is on, when known.
    pub line: Option<usize>,
    /// What is wrong and, where useful, what to do.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_located(f, &self.path, self.line, &self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Something in a configuration that is valid but probably not what was meant
/// or worth knowing (SCOPE-19). Displays like [`ConfigError`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The key path; empty for the configuration as a whole.
    pub path: String,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// What was noticed.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_located(f, &self.path, self.line, &self.message)
    }
}

/// Every problem found in one configuration, all at once.
///
/// Displays one error per line, each prefixed with the origin
/// (`/etc/vacancyd/vacancyd.toml: line 3: server.lisen: unknown key ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    /// Where the configuration came from: a file path or `<embedded default>`.
    pub origin: String,
    /// The problems, ordered by line; never empty.
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            if !self.origin.is_empty() {
                write!(f, "{}: ", self.origin)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    /// An error about the file as a whole (no key path, no line).
    pub(crate) fn whole(origin: &str, message: String) -> Self {
        ConfigErrors {
            origin: origin.to_owned(),
            errors: vec![ConfigError {
                path: String::new(),
                line: None,
                message,
            }],
        }
    }
}

/// `line N: path: message`, leaving out what is not known: how errors and
/// warnings both display.
fn write_located(
    f: &mut fmt::Formatter<'_>,
    path: &str,
    line: Option<usize>,
    message: &str,
) -> fmt::Result {
    if let Some(line) = line {
        write!(f, "line {line}: ")?;
    }
    if !path.is_empty() {
        write!(f, "{path}: ")?;
    }
    f.write_str(message)
}
