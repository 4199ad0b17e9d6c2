//! Configuration: the TOML schema and its validation.
