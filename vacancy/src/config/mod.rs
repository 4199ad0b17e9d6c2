//! Configuration: the TOML schema and its validation.

/// TEMPORARY (replaced by the config module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OwnerScope {
    /// host
    #[default]
    Host,
    /// resource
    Resource,
}
impl OwnerScope {
    /// name
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerScope::Host => "host",
            OwnerScope::Resource => "resource",
        }
    }
}
/// TEMPORARY (replaced by the config module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Management {
    /// deny
    #[default]
    Deny,
    /// allow
    Allow,
}
