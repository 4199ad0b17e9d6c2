//! Driving a [`PromptTracker`] with real reads: the async shell around the
//! sans-IO tracker, and what a submission reply decides before tracking.

use async_trait::async_trait;
use tracing::{debug, info};
use vacancy::MonotonicClock;
use vacancy::traits::{Submission, TrackedEnd, TrackingEvents};

use super::submission::{SubmissionReply, classify_reply};
use super::tracker::{Action, Follow, History, Location, PromptTracker, TrackingTimes};
use super::version::ReportedVersion;

/// The three reads tracking needs, one prompt at a time (COMFY-21).
#[async_trait]
pub trait PromptReads: Send + Sync {
    /// Where ComfyUI holds the prompt: `/api/jobs/<id>` on 0.6.0 and later,
    /// else `/queue` read up to the prompt (COMFY-21..23).
    async fn locate(&self, prompt_id: &str) -> Result<Location, String>;
    /// Whether the prompt's history records its end (COMFY-16).
    async fn history(&self, prompt_id: &str) -> Result<History, String>;
    /// The release `/system_stats` reports (COMFY-37).
    async fn version(&self) -> Result<ReportedVersion, String>;
    /// The release last read (by observation or [`version`](Self::version)),
    /// without asking again; `None` if none was read yet.
    fn known_version(&self) -> Option<ReportedVersion> {
        None
    }
}

/// What a submission decides: released at once, or followed under an ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A recognized validation rejection: never queued (COMFY-28).
    Rejected(String),
    /// Follow this prompt ID this way.
    Follow {
        /// The ID to follow: ComfyUI's own where it reported one (COMFY-06).
        prompt_id: String,
        /// How.
        how: Follow,
    },
}

/// What a submission exchange decides (COMFY-06, COMFY-09, COMFY-17, COMFY-28, COMFY-29).
///
/// # Behavior
///
/// - A reply naming a prompt ID acknowledges it: followed by its queue
///   presence and history under the ID the reply names, which is vacancy's
///   on 0.3.45 and later and ComfyUI's own before (REC-04).
/// - A recognized validation rejection is [`Plan::Rejected`].
/// - Any other reply, or one that broke off, follows the assigned ID by its
///   history only (COMFY-09, COMFY-24).
/// - A connection that failed before any of the reply arrived is a lost
///   submission (COMFY-17).
pub fn plan(assigned: &str, submission: &Submission) -> Plan {
    let follow = |prompt_id: &str, how| Plan::Follow {
        prompt_id: prompt_id.to_owned(),
        how,
    };
    match submission {
        Submission::Reply { status, body } => match classify_reply(*status, body) {
            SubmissionReply::Acknowledged { prompt_id } => follow(&prompt_id, Follow::Acknowledged),
            SubmissionReply::Rejected { error_type } => Plan::Rejected(format!(
                "ComfyUI rejected the prompt in validation ({error_type}); it was never queued"
            )),
            SubmissionReply::Unusable { .. } => follow(assigned, Follow::HistoryOnly),
        },
        Submission::Broken(_) => follow(assigned, Follow::HistoryOnly),
        Submission::Lost(_) => follow(assigned, Follow::Lost),
    }
}

/// Follow `prompt_id` with `reads` until the tracker releases or holds it.
pub async fn drive(
    mut tracker: PromptTracker,
    prompt_id: &str,
    reads: &dyn PromptReads,
    clock: MonotonicClock,
) -> TrackedEnd {
    loop {
        let now = clock.now();
        match tracker.next(now) {
            Action::WaitUntil(at) => {
                let until = tokio::time::Instant::from_std(clock.instant(at));
                tokio::time::sleep_until(until).await;
            }
            Action::Locate => {
                let found = reads.locate(prompt_id).await;
                if let Err(e) = &found {
                    debug!(prompt_id, error = %e, "queue check failed; it counts as neither present nor absent");
                }
                tracker.located(found);
            }
            Action::ReadHistory => {
                let read = reads.history(prompt_id).await;
                if let Err(e) = &read {
                    debug!(prompt_id, error = %e, "history read failed");
                }
                if let Some(end) = tracker.history(read, clock.now()) {
                    return verdict(end);
                }
            }
            Action::ReadVersion => {
                let v = reads.version().await;
                tracker.version(v, clock.now());
            }
            other => return verdict(other),
        }
    }
}

fn verdict(a: Action) -> TrackedEnd {
    match a {
        Action::Release(why) => TrackedEnd::Released(why),
        Action::Hold(why) => TrackedEnd::Held(why),
        other => TrackedEnd::Held(format!("tracking stopped unexpectedly at {other:?}")),
    }
}

/// The whole of one tracked prompt: plan, record ComfyUI's own ID where it
/// reported one (REC-04), and follow.
pub async fn track(
    assigned: &str,
    admitted_at: vacancy::Moment,
    submission: &Submission,
    times: TrackingTimes,
    reads: &dyn PromptReads,
    events: &dyn TrackingEvents,
    clock: MonotonicClock,
) -> TrackedEnd {
    match plan(assigned, submission) {
        Plan::Rejected(why) => TrackedEnd::Released(why),
        Plan::Follow { prompt_id, how } => {
            if prompt_id != assigned {
                info!(assigned_ref = assigned, upstream_ref = %prompt_id, "ComfyUI queued the prompt under its own ID (a release before 0.3.45); following that");
                events.upstream_ref(&prompt_id).await;
            }
            events.following(&prompt_id).await;
            let tracker = PromptTracker::new(how, times, admitted_at, clock.now());
            drive(tracker, &prompt_id, reads, clock).await
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use std::sync::Mutex;
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::comfyui::version::ComfyVersion;

    /// Scripted reads: each call takes the next answer of its kind.
    #[derive(Default)]
    struct Script {
        locate: Mutex<Vec<Result<Location, String>>>,
        history: Mutex<Vec<Result<History, String>>>,
        version: Mutex<Vec<Result<ReportedVersion, String>>>,
        asked: Mutex<Vec<String>>,
    }

    fn take<T: Clone>(v: &Mutex<Vec<T>>, last: T) -> T {
        let mut v = v.lock().unwrap();
        if v.is_empty() { last } else { v.remove(0) }
    }

    #[async_trait]
    impl PromptReads for Script {
        async fn locate(&self, id: &str) -> Result<Location, String> {
            self.asked.lock().unwrap().push(format!("locate {id}"));
            take(&self.locate, Ok(Location::Absent))
        }
        async fn history(&self, id: &str) -> Result<History, String> {
            self.asked.lock().unwrap().push(format!("history {id}"));
            take(&self.history, Ok(History::NotFinished))
        }
        async fn version(&self) -> Result<ReportedVersion, String> {
            self.asked.lock().unwrap().push("version".into());
            take(
                &self.version,
                Ok(ReportedVersion::Known(ComfyVersion::new(0, 3, 75))),
            )
        }
    }

    #[derive(Default)]
    struct Refs(Mutex<Vec<String>>);

    #[async_trait]
    impl TrackingEvents for Refs {
        async fn upstream_ref(&self, r: &str) {
            self.0.lock().unwrap().push(r.to_owned());
        }
    }

    fn reply(status: u16, body: &str) -> Submission {
        Submission::Reply {
            status,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn replies_decide_the_plan() {
        // COMFY-06, COMFY-09, COMFY-17, COMFY-28, COMFY-29
        let ours = "11111111-2222-3333-4444-555555555555";
        assert_eq!(
            plan(
                ours,
                &reply(
                    200,
                    &format!(r#"{{"prompt_id":"{ours}","number":0,"node_errors":{{}}}}"#)
                )
            ),
            Plan::Follow {
                prompt_id: ours.into(),
                how: Follow::Acknowledged
            }
        );
        assert_eq!(
            plan(
                ours,
                &reply(
                    200,
                    r#"{"prompt_id":"their-own","number":2,"node_errors":{}}"#
                )
            ),
            Plan::Follow {
                prompt_id: "their-own".into(),
                how: Follow::Acknowledged
            }
        );
        assert!(matches!(
            plan(
                ours,
                &reply(
                    400,
                    r#"{"error":{"type":"prompt_no_outputs","message":"m","details":"","extra_info":{}},"node_errors":{}}"#
                )
            ),
            Plan::Rejected(_)
        ));
        for s in [
            reply(500, "500 Internal Server Error"),
            reply(200, "{}"),
            Submission::Broken("cut".into()),
        ] {
            assert_eq!(
                plan(ours, &s),
                Plan::Follow {
                    prompt_id: ours.into(),
                    how: Follow::HistoryOnly
                },
                "{s:?}"
            );
        }
        assert_eq!(
            plan(ours, &Submission::Lost("reset".into())),
            Plan::Follow {
                prompt_id: ours.into(),
                how: Follow::Lost
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_acknowledged_prompt_is_followed_until_its_history_finishes() {
        // COMFY-13, COMFY-16 with real (paused) tokio time.
        let clock = MonotonicClock::new();
        let reads = Script::default();
        *reads.locate.lock().unwrap() = vec![
            Ok(Location::Running),
            Ok(Location::Running),
            Ok(Location::Absent),
        ];
        *reads.history.lock().unwrap() = vec![
            Ok(History::NotFinished),
            Ok(History::NotFinished),
            Ok(History::Finished { success: true }),
        ];
        let refs = Refs::default();
        let end = track(
            "p1",
            clock.now(),
            &reply(200, r#"{"prompt_id":"p1","number":0,"node_errors":{}}"#),
            TrackingTimes::default(),
            &reads,
            &refs,
            clock,
        )
        .await;
        assert!(matches!(end, TrackedEnd::Released(_)), "{end:?}");
        assert_eq!(
            *reads.asked.lock().unwrap(),
            [
                "locate p1",
                "history p1",
                "locate p1",
                "history p1",
                "locate p1",
                "history p1"
            ]
        );
        assert!(refs.0.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_early_release_is_followed_under_its_own_id_which_is_recorded() {
        // COMFY-06, REC-04
        let clock = MonotonicClock::new();
        let reads = Script::default();
        *reads.history.lock().unwrap() = vec![Ok(History::Finished { success: false })];
        let refs = Refs::default();
        let end = track(
            "assigned",
            clock.now(),
            &reply(
                200,
                r#"{"prompt_id":"their-own","number":2,"node_errors":{}}"#,
            ),
            TrackingTimes::default(),
            &reads,
            &refs,
            clock,
        )
        .await;
        assert!(matches!(end, TrackedEnd::Released(_)));
        assert_eq!(*refs.0.lock().unwrap(), ["their-own"]);
        assert_eq!(
            *reads.asked.lock().unwrap(),
            ["locate their-own", "history their-own"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_submission_waits_five_minutes_of_tokio_time() {
        // COMFY-17, COMFY-18 through the driver.
        let clock = MonotonicClock::new();
        let started = tokio::time::Instant::now();
        let reads = Script::default();
        let end = track(
            "lost",
            clock.now(),
            &Submission::Lost("reset".into()),
            TrackingTimes::default(),
            &reads,
            &Refs::default(),
            clock,
        )
        .await;
        assert!(
            matches!(end, TrackedEnd::Released(ref why) if why.contains("lost submission")),
            "{end:?}"
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(305) && waited < Duration::from_secs(320),
            "{waited:?}"
        );
        let asked = reads.asked.lock().unwrap();
        assert_eq!(asked.iter().filter(|a| *a == "version").count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn tracking_ends_held_at_the_timeout() {
        // COMFY-26, COMFY-27
        let clock = MonotonicClock::new();
        let started = tokio::time::Instant::now();
        let times = TrackingTimes {
            timeout: Duration::from_secs(3600),
            ..TrackingTimes::default()
        };
        let end = track(
            "p",
            clock.now(),
            &reply(500, "oops"),
            times,
            &Script::default(),
            &Refs::default(),
            clock,
        )
        .await;
        assert!(matches!(end, TrackedEnd::Held(_)), "{end:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(3600) && waited < Duration::from_secs(3610),
            "{waited:?}"
        );
    }
}
