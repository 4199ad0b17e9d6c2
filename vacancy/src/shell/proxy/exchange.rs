//! One borrowed request from its admission to the moment its end is known
//! (ARCHITECTURE.md#the-request-path).
//!
//! An [`Exchange`] owns the entry: whoever holds it is the one place that may
//! end it, and it ends exactly once, in [`Exchange::finish`], with what was
//! [`Observed`] of the exchange. What that means for the reservation is a
//! pure function of the observation, [`outcome`], so every case can be read
//! (and tested) in one table. The only end decided by dropping an unfinished
//! exchange is [`Observed::Abandoned`]: held once forwarded, released before.

use std::sync::Arc;
use std::time::Instant;

use crate::engine::{EntryId, ReleaseOutcome};
use crate::shell::state::lender::Lender;
use crate::shell::state::live::CutSignal;
use crate::shell::state::metrics::RequestPhase;
use crate::shell::upstream::forward::UpstreamConnection;
use crate::shell::upstream::route::UpstreamRoute;
use crate::traits::TrackedEnd;

/// What was seen of one exchange with the upstream: the only input to its
/// outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The request never left: its record could not be made durable, or it
    /// could not be built (DONE-02).
    NotForwarded,
    /// Connecting to the upstream was refused or failed: nothing of the
    /// request reached it (DONE-02).
    ConnectFailed(String),
    /// The connection was made, then the exchange failed before a response
    /// head (DONE-03).
    FailedAfterConnect(String),
    /// The upstream's response ended cleanly: its last byte was read
    /// (DONE-01), whether the borrower was still there or the reply was
    /// drained after the borrower left.
    Ended,
    /// The upstream's response broke off (DONE-03), while relayed or while
    /// drained after the borrower left.
    BrokeOff(String),
    /// A drained reply did not end within `completion_timeout_s`.
    DrainTimedOut {
        /// The bound, in seconds.
        bound_s: u64,
    },
    /// The exchange was cut, by a reclaim (RECL-15) or because the borrower
    /// left under `on_borrower_disconnect = "cut"`; `stop_proven` says
    /// whether the adapter proved that the upstream stopped (DONE-04).
    Cut {
        /// Why it was cut.
        why: String,
        /// The adapter proved the stop.
        stop_proven: bool,
    },
    /// Tracked work (COMFY-01): the adapter's tracker followed the job.
    Tracked(TrackedEnd),
    /// Tracked work whose submission reply did not come within
    /// `completion_timeout_s` (COMFY-11).
    ReplyTimedOut(String),
    /// A gated WebSocket tunnel closed (ROUTE-10).
    TunnelClosed,
    /// The exchange was dropped before anything above was seen.
    Abandoned {
        /// Whether the request had been forwarded.
        forwarded: bool,
    },
}

/// What an observation means for the reservation: released only on proof
/// of the end, or when nothing reached the upstream; held otherwise.
pub fn outcome(observed: &Observed) -> ReleaseOutcome {
    use ReleaseOutcome::{Completed, NotForwarded, Uncertain};
    match observed {
        Observed::NotForwarded
        | Observed::ConnectFailed(_)
        | Observed::Abandoned { forwarded: false } => NotForwarded,
        Observed::Ended
        | Observed::Cut {
            stop_proven: true, ..
        }
        | Observed::Tracked(TrackedEnd::Released(_)) => Completed,
        Observed::FailedAfterConnect(e) => Uncertain(format!(
            "the exchange failed after the connection was made: {e}"
        )),
        Observed::BrokeOff(e) => Uncertain(format!("the upstream response broke off: {e}")),
        Observed::DrainTimedOut { bound_s } => Uncertain(format!(
            "the upstream reply did not end within completion_timeout_s = {bound_s}"
        )),
        Observed::Cut {
            why,
            stop_proven: false,
        } => Uncertain(format!(
            "{why}, and the adapter could not prove the upstream stopped"
        )),
        Observed::Tracked(TrackedEnd::Held(why)) | Observed::ReplyTimedOut(why) => {
            Uncertain(why.clone())
        }
        Observed::TunnelClosed => Uncertain(
            "a gated WebSocket closed; WebSockets carry no completion guarantee".to_owned(),
        ),
        Observed::Abandoned { forwarded: true } => {
            Uncertain("the proxy lost track of the exchange before its end".to_owned())
        }
    }
}

/// One admitted entry on its way through the proxy, and the one place it
/// ends.
pub struct Exchange {
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    entry: EntryId,
    forwarded: bool,
    /// When the upstream's response head came (the relay phase's start).
    head_at: Option<Instant>,
    finished: bool,
    /// Its upstream connection, closed once the exchange is gone: after
    /// the release, and after the borrower's last byte is handed on.
    connection: Option<UpstreamConnection>,
}

impl Exchange {
    /// The exchange of an admitted entry not forwarded yet.
    pub fn admitted(lender: Arc<Lender>, route: Arc<UpstreamRoute>, entry: EntryId) -> Self {
        Exchange {
            lender,
            route,
            entry,
            forwarded: false,
            head_at: None,
            finished: false,
            connection: None,
        }
    }

    /// The entry it owns.
    pub fn entry(&self) -> EntryId {
        self.entry
    }

    /// The upstream it goes to.
    pub fn route(&self) -> &Arc<UpstreamRoute> {
        &self.route
    }

    /// The lender that holds its reservation.
    pub fn lender(&self) -> &Arc<Lender> {
        &self.lender
    }

    /// Register synchronous work with the live work, so a reclaim can cut
    /// its response (RECL-15); the registration ends with the entry.
    pub fn cut_signal(&self) -> CutSignal {
        self.lender
            .live()
            .register_response(self.entry, self.route.id)
    }

    /// The request is about to leave for the upstream: from now on only a
    /// proven end releases it.
    pub fn forwarding(&mut self) {
        self.forwarded = true;
    }

    /// The upstream's response head came on `connection`: the relay
    /// begins, and the connection stays open as long as the exchange.
    pub fn response_head(&mut self, connection: UpstreamConnection) {
        self.head_at = Some(Instant::now());
        self.connection = Some(connection);
    }

    /// When the upstream's response head came, once it has.
    pub fn head_at(&self) -> Option<Instant> {
        self.head_at
    }

    /// The reply came and the adapter's tracker follows the job now (the
    /// engine's phase turns `tracking`).
    pub fn tracking(&mut self) {
        self.lender.start_tracking(self.entry);
    }

    /// End the entry with what was observed.
    pub fn finish(mut self, observed: Observed) {
        self.end(&observed);
    }

    fn end(&mut self, observed: &Observed) {
        if !self.finished {
            self.finished = true;
            self.lender.release(self.entry, outcome(observed));
            if let (Observed::Ended, Some(head)) = (observed, self.head_at) {
                self.lender
                    .metrics()
                    .phase(RequestPhase::Relay, head.elapsed());
            }
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.end(&Observed::Abandoned {
            forwarded: self.forwarded,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReleaseOutcome::{Completed, NotForwarded};

    fn held(o: &ReleaseOutcome) -> bool {
        matches!(o, ReleaseOutcome::Uncertain(_))
    }

    #[test]
    fn every_observation_has_one_outcome() {
        // DONE-01..04, OBS-03, RECL-13, RECL-15, ROUTE-10, COMFY-11: each
        // case of an exchange's end and what it means for the reservation.
        let why = || "why".to_owned();
        let cases: Vec<(&str, Observed, Option<ReleaseOutcome>)> = vec![
            (
                "DONE-02 never sent",
                Observed::NotForwarded,
                Some(NotForwarded),
            ),
            (
                "DONE-02 connect refused",
                Observed::ConnectFailed(why()),
                Some(NotForwarded),
            ),
            (
                "DONE-03 failed after connect",
                Observed::FailedAfterConnect(why()),
                None,
            ),
            ("DONE-01 clean end", Observed::Ended, Some(Completed)),
            ("DONE-03 broke off", Observed::BrokeOff(why()), None),
            (
                "RECL-13 drain past its bound",
                Observed::DrainTimedOut { bound_s: 30 },
                None,
            ),
            (
                "RECL-15 cut, stop proven",
                Observed::Cut {
                    why: why(),
                    stop_proven: true,
                },
                Some(Completed),
            ),
            (
                "DONE-04 cut, stop not proven",
                Observed::Cut {
                    why: why(),
                    stop_proven: false,
                },
                None,
            ),
            (
                "COMFY tracked to its end",
                Observed::Tracked(TrackedEnd::Released(why())),
                Some(Completed),
            ),
            (
                "OBS-03 tracker without proof",
                Observed::Tracked(TrackedEnd::Held(why())),
                None,
            ),
            (
                "COMFY-11 no submission reply",
                Observed::ReplyTimedOut(why()),
                None,
            ),
            ("ROUTE-10 tunnel closed", Observed::TunnelClosed, None),
            (
                "dropped before forwarding",
                Observed::Abandoned { forwarded: false },
                Some(NotForwarded),
            ),
            (
                "dropped after forwarding",
                Observed::Abandoned { forwarded: true },
                None,
            ),
        ];
        for (what, observed, want) in cases {
            let got = outcome(&observed);
            match want {
                Some(w) => assert_eq!(got, w, "{what}"),
                None => assert!(held(&got), "{what}: {got:?}"),
            }
        }
    }

    #[test]
    fn obs_03_only_proof_of_the_end_completes() {
        // OBS-03: what is unknown, malformed or broken never counts as done.
        for observed in [
            Observed::FailedAfterConnect("garbled".into()),
            Observed::BrokeOff("truncated".into()),
            Observed::Tracked(TrackedEnd::Held("history unreadable".into())),
            Observed::Cut {
                why: "cut".into(),
                stop_proven: false,
            },
        ] {
            assert_ne!(outcome(&observed), Completed, "{observed:?}");
            assert_ne!(outcome(&observed), NotForwarded, "{observed:?}");
        }
    }

    #[test]
    fn a_held_outcome_says_why() {
        // DONE-04: the reason reaches the log and /status.
        let o = outcome(&Observed::Cut {
            why: "the owner came back".into(),
            stop_proven: false,
        });
        assert_eq!(
            o,
            ReleaseOutcome::Uncertain(
                "the owner came back, and the adapter could not prove the upstream stopped".into()
            )
        );
    }
}
