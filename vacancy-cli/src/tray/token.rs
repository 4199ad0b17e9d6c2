//! The owner's token for the tray's pause and resume, kept for the user who
//! signs in: sealed with the Windows data-protection API (DPAPI) in
//! `%LOCALAPPDATA%\vacancyd\tray-token`, so only that user on that machine
//! can open it. `vacancyd tray --save-token` stores it.

use std::path::PathBuf;

/// Why the token could not be kept or read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// `%LOCALAPPDATA%` is not set (no user profile).
    #[error("LOCALAPPDATA is not set: run the tray as a signed-in user")]
    NoProfile,
    /// The file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// DPAPI could not seal or open it.
    #[error(
        "the data-protection API could not {what} the token in {path}: {source}; save it again with `vacancyd tray --save-token`"
    )]
    Sealing {
        /// seal | open.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Where the sealed token lives.
pub fn path() -> Result<PathBuf, TokenError> {
    let base = std::env::var_os("LOCALAPPDATA").ok_or(TokenError::NoProfile)?;
    Ok(PathBuf::from(base).join("vacancyd").join("tray-token"))
}

/// Seal `token` for this user and keep it; the file it is in.
pub fn save(token: &str) -> Result<PathBuf, TokenError> {
    let path = path()?;
    let sealed =
        vacancy_win32::dpapi::protect(token.as_bytes()).map_err(|source| TokenError::Sealing {
            what: "seal",
            path: path.clone(),
            source,
        })?;
    let io = |source| TokenError::Io {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(&path, sealed).map_err(io)?;
    Ok(path)
}

/// The kept token, or `None` when none was saved.
pub fn load() -> Result<Option<String>, TokenError> {
    let path = path()?;
    let sealed = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TokenError::Io { path, source }),
    };
    let open = vacancy_win32::dpapi::unprotect(&sealed).map_err(|source| TokenError::Sealing {
        what: "open",
        path: path.clone(),
        source,
    })?;
    Ok(Some(String::from_utf8_lossy(&open).trim().to_owned()))
}
