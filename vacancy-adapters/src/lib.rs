//! Adapters for the upstreams vacancy lends.
