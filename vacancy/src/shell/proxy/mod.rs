//! The request path: one listener per upstream, each connection under its
//! budget and timeouts, each request classified, admitted or refused,
//! forwarded and finished as one exchange.

pub(crate) mod answer;
pub mod arrival;
pub(crate) mod completion;
pub mod conn;
pub(crate) mod exchange;
pub mod host;
pub(crate) mod listen;
pub(crate) mod service;
pub(crate) mod tracked;
pub mod tunnel;
pub(crate) mod woken_only;
