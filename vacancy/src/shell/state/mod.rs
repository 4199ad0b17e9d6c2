//! The shell's shared state: the lender that owns the engine and the ledger, the
//! metrics, the console's history the lender keeps, live exchanges, the stop signal, the observation loops' triggers, post-job samples and the proxy's worker threads (and when they yield their CPU) and the histograms they each count in.

pub(crate) mod awake_wait;
pub(crate) mod borrower_metrics;
pub mod busy_turn;
pub mod gate;
pub mod history;
pub(crate) mod lender;
pub mod live;
pub mod metrics;
pub mod observe_trigger;
pub mod post_job;
pub(crate) mod shutdown;
pub mod worker_histogram;
pub mod workers;
