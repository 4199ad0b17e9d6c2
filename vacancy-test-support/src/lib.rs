//! Test harness for vacancy.
