//! Reaching an upstream: its address and connections, the origin rules, the
//! route (adapter, target, pool) and the request forwarded to it.

pub(crate) mod forward;
pub(crate) mod origin;
pub mod pool;
pub(crate) mod route;
pub(crate) mod target;
