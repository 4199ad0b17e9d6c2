//! The sans-IO admission engine.
