//! Following one borrowed ComfyUI prompt until its end is proven or it can
//! never run (COMFY-10..27). Sans-IO: the tracker says what to read next and
//! is told what the read found, with `now` from outside, so the 5-second
//! checks, the 5-minute wait and `completion_timeout_s` are tested with
//! injected time.
//!
//! One check (COMFY-13): where ComfyUI holds the prompt (running or pending),
//! then its history. ComfyUI moves a prompt from pending to running and from
//! running to history under one lock, the lock its queue reads take too, so a
//! prompt an acknowledged check finds neither queued nor running, and then not
//! in history, has been removed and will never run.

use std::time::Duration;

use vacancy::Moment;

use super::version::ReportedVersion;

/// The tracker's clocks (COMFY-13, COMFY-17, COMFY-26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackingTimes {
    /// Between checks: 5 s.
    pub check_every: Duration,
    /// How long a lost submission waits before its version is read: 5 min.
    pub lost_wait: Duration,
    /// `completion_timeout_s`: tracking stops and the work is held after it (default 3600 s).
    pub timeout: Duration,
}

impl Default for TrackingTimes {
    fn default() -> Self {
        TrackingTimes {
            check_every: Duration::from_secs(5),
            lost_wait: Duration::from_secs(300),
            timeout: Duration::from_secs(3600),
        }
    }
}

/// How a prompt came to be tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// The submission reply named the prompt's ID (COMFY-12): its absence
    /// from the queue, twice, proves it will never run (COMFY-14).
    Acknowledged,
    /// The reply could not be used (COMFY-09) or the release ignores assigned
    /// IDs: only its history releases it (COMFY-24).
    HistoryOnly,
    /// The connection failed after sending, before any of the reply arrived
    /// (COMFY-17): history during a 5-minute wait, then the version decides.
    Lost,
}

/// Where a queue read (or `/api/jobs/<id>`) found the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Running now.
    Running,
    /// Waiting in the queue.
    Pending,
    /// Neither running nor pending.
    Absent,
}

/// What the prompt's history says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum History {
    /// A finished entry (success or failure) under the prompt's ID (COMFY-16).
    Finished {
        /// `status_str` was `success`.
        success: bool,
    },
    /// No finished entry (none at all, or one without a final status).
    NotFinished,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing until this moment (then ask again).
    WaitUntil(Moment),
    /// Find where ComfyUI holds the prompt, then report with [`PromptTracker::located`].
    Locate,
    /// Read the prompt's history, then report with [`PromptTracker::history`].
    ReadHistory,
    /// Read the release from `/system_stats`, then report with [`PromptTracker::version`].
    ReadVersion,
    /// Proven finished, or it will never run: release the reservation.
    Release(String),
    /// Tracking expired without proof: keep the reservation held for an
    /// administrator (COMFY-27).
    Hold(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// COMFY-13/14 checks: locate, then history.
    Checking,
    /// History only (COMFY-24).
    HistoryOnly,
    /// A lost submission inside its 5-minute wait: history only (COMFY-17 reading).
    LostWaiting,
    /// A lost submission past the wait: the version decides (COMFY-18/19).
    LostDeciding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Idle until the next check.
    Idle(Moment),
    /// A locate read is due or in flight.
    Locate,
    /// The history read of this check is due or in flight, after a locate
    /// that found this (`None`: it failed, or the mode does not locate).
    History(Option<Location>),
    /// A version read is due or in flight.
    Version,
    /// Released or held: nothing more.
    Done,
}

/// The tracking of one prompt. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct PromptTracker {
    times: TrackingTimes,
    mode: Mode,
    step: Step,
    deadline: Moment,
    lost_until: Moment,
    absent_checks: u8,
    /// Whether the prompt was ever found queued or running.
    found: bool,
    /// Whether it is a lost submission now checked like an acknowledged one (COMFY-18).
    lost: bool,
}

impl PromptTracker {
    /// Start following a prompt admitted at `admitted_at` (the timeout counts
    /// from there, COMFY-26), first check at `now`.
    pub fn new(follow: Follow, times: TrackingTimes, admitted_at: Moment, now: Moment) -> Self {
        let mode = match follow {
            Follow::Acknowledged => Mode::Checking,
            Follow::HistoryOnly => Mode::HistoryOnly,
            Follow::Lost => Mode::LostWaiting,
        };
        PromptTracker {
            times,
            mode,
            step: Step::Idle(now),
            deadline: admitted_at.after(times.timeout),
            lost_until: now.after(times.lost_wait),
            absent_checks: 0,
            found: false,
            lost: false,
        }
    }

    /// What to do at `now`.
    ///
    /// # Behavior
    ///
    /// Past `completion_timeout_s`, [`Action::Hold`] (COMFY-27), whatever was
    /// due. Otherwise the next read of the current check, or
    /// [`Action::WaitUntil`] the next check.
    pub fn next(&mut self, now: Moment) -> Action {
        if self.step == Step::Done {
            return Action::WaitUntil(Moment::from_nanos(u64::MAX));
        }
        if now >= self.deadline {
            self.step = Step::Done;
            return Action::Hold(format!(
                "tracking expired after completion_timeout_s ({} s) without proof that the prompt finished; release it as an administrator once ComfyUI no longer holds it",
                self.times.timeout.as_secs()
            ));
        }
        match self.step {
            Step::Idle(at) if now < at => Action::WaitUntil(at.min(self.deadline)),
            Step::Idle(_) => {
                self.step = match self.mode {
                    Mode::Checking => Step::Locate,
                    Mode::LostWaiting if now >= self.lost_until => Step::Version,
                    Mode::LostDeciding => Step::Version,
                    Mode::HistoryOnly | Mode::LostWaiting => Step::History(None),
                };
                self.next(now)
            }
            Step::Locate => Action::Locate,
            Step::History(_) => Action::ReadHistory,
            Step::Version => Action::ReadVersion,
            Step::Done => Action::WaitUntil(Moment::from_nanos(u64::MAX)),
        }
    }

    /// The result of [`Action::Locate`]: `Err` is a failed or unreadable
    /// check, which counts as neither present nor absent (COMFY-15).
    pub fn located(&mut self, found: Result<Location, String>) {
        if self.step != Step::Locate {
            return;
        }
        let location = match found {
            Ok(l) => Some(l),
            Err(_) => {
                self.absent_checks = 0;
                None
            }
        };
        if matches!(location, Some(Location::Running | Location::Pending)) {
            self.absent_checks = 0;
            self.found = true;
        }
        self.step = Step::History(location);
    }

    /// The result of [`Action::ReadHistory`] at `now`; `Some` action when it
    /// ends the tracking.
    pub fn history(&mut self, read: Result<History, String>, now: Moment) -> Option<Action> {
        let Step::History(location) = self.step else {
            return None;
        };
        match read {
            Ok(History::Finished { success }) => {
                self.step = Step::Done;
                let how = if success { "succeeded" } else { "failed" };
                return Some(Action::Release(format!(
                    "ComfyUI's history shows the prompt {how}"
                )));
            }
            Ok(History::NotFinished) => {
                if self.mode == Mode::Checking && location == Some(Location::Absent) {
                    // COMFY-14: absent from the queue, then not in history.
                    self.absent_checks += 1;
                    if self.absent_checks >= 2 {
                        self.step = Step::Done;
                        let what = if self.lost && !self.found {
                            "the lost submission"
                        } else {
                            "the acknowledged prompt"
                        };
                        return Some(Action::Release(format!(
                            "two consecutive checks found {what} neither queued, running nor in history: it will never run"
                        )));
                    }
                }
            }
            Err(_) => self.absent_checks = 0, // COMFY-15
        }
        self.step = Step::Idle(now.after(self.times.check_every));
        None
    }

    /// The result of [`Action::ReadVersion`] at `now` (COMFY-18..20).
    pub fn version(&mut self, read: Result<ReportedVersion, String>, now: Moment) {
        if self.step != Step::Version {
            return;
        }
        match read {
            // COMFY-18: the release keeps assigned IDs: its absence counts.
            Ok(v) if v.keeps_client_id() => {
                self.mode = Mode::Checking;
                self.lost = true;
                self.step = Step::Idle(now);
            }
            // COMFY-19: an older release, or no version: history only.
            Ok(_) => {
                self.mode = Mode::HistoryOnly;
                self.step = Step::Idle(now);
            }
            // COMFY-20: asked again at the next check; history meanwhile.
            Err(_) => {
                self.mode = Mode::LostDeciding;
                self.step = Step::History(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::comfyui::version::ComfyVersion;

    const S: u64 = 1000; // ms per second

    fn t(secs: u64) -> Moment {
        Moment::from_millis(secs * S)
    }

    fn tracker(follow: Follow) -> PromptTracker {
        PromptTracker::new(follow, TrackingTimes::default(), t(0), t(0))
    }

    /// Run one check at `now`: answer a Locate with `loc`, a history read with `hist`.
    fn check(
        tr: &mut PromptTracker,
        now: Moment,
        loc: Result<Location, String>,
        hist: Result<History, String>,
    ) -> Option<Action> {
        match tr.next(now) {
            Action::Locate => tr.located(loc),
            Action::ReadHistory => {}
            other => return Some(other),
        }
        match tr.next(now) {
            Action::ReadHistory => tr.history(hist, now),
            other => Some(other),
        }
    }

    fn released(a: Option<Action>) -> String {
        match a {
            Some(Action::Release(why)) => why,
            other => panic!("expected a release, got {other:?}"),
        }
    }

    #[test]
    fn finished_history_releases_success_or_failure() {
        // COMFY-16
        for success in [true, false] {
            let mut tr = tracker(Follow::Acknowledged);
            assert_eq!(
                check(
                    &mut tr,
                    t(0),
                    Ok(Location::Running),
                    Ok(History::NotFinished)
                ),
                None
            );
            assert_eq!(tr.next(t(1)), Action::WaitUntil(t(5)));
            let why = released(check(
                &mut tr,
                t(5),
                Ok(Location::Absent),
                Ok(History::Finished { success }),
            ));
            assert!(
                why.contains(if success { "succeeded" } else { "failed" }),
                "{why}"
            );
        }
    }

    #[test]
    fn two_consecutive_absent_checks_release_an_acknowledged_prompt() {
        // COMFY-13, COMFY-14: e.g. the owner deleted it from the queue.
        let mut tr = tracker(Follow::Acknowledged);
        assert_eq!(
            check(
                &mut tr,
                t(0),
                Ok(Location::Pending),
                Ok(History::NotFinished)
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(5),
                Ok(Location::Absent),
                Ok(History::NotFinished)
            ),
            None
        );
        let why = released(check(
            &mut tr,
            t(10),
            Ok(Location::Absent),
            Ok(History::NotFinished),
        ));
        assert!(why.contains("two consecutive checks"), "{why}");
        assert!(why.contains("acknowledged"), "{why}");
    }

    #[test]
    fn a_failed_check_restarts_the_count() {
        // COMFY-15: failed locate or failed history count as neither.
        let mut tr = tracker(Follow::Acknowledged);
        assert_eq!(
            check(
                &mut tr,
                t(0),
                Ok(Location::Absent),
                Ok(History::NotFinished)
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(5),
                Err("timeout".into()),
                Ok(History::NotFinished)
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(10),
                Ok(Location::Absent),
                Ok(History::NotFinished)
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(15),
                Ok(Location::Absent),
                Err("malformed".into())
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(20),
                Ok(Location::Absent),
                Ok(History::NotFinished)
            ),
            None
        );
        // Found again in between also restarts it.
        assert_eq!(
            check(
                &mut tr,
                t(25),
                Ok(Location::Running),
                Ok(History::NotFinished)
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(30),
                Ok(Location::Absent),
                Ok(History::NotFinished)
            ),
            None
        );
        released(check(
            &mut tr,
            t(35),
            Ok(Location::Absent),
            Ok(History::NotFinished),
        ));
    }

    #[test]
    fn an_unacknowledged_prompt_is_released_only_by_history() {
        // COMFY-09, COMFY-10, COMFY-24, COMFY-25: absence proves nothing.
        let mut tr = tracker(Follow::HistoryOnly);
        for k in 0..20 {
            assert_eq!(tr.next(t(k * 5)), Action::ReadHistory, "never a queue read");
            assert_eq!(tr.history(Ok(History::NotFinished), t(k * 5)), None);
        }
        assert_eq!(tr.next(t(100)), Action::ReadHistory);
        released(tr.history(Ok(History::Finished { success: true }), t(100)));
    }

    #[test]
    fn tracking_expires_into_a_hold() {
        // COMFY-10, COMFY-26, COMFY-27: no proof within completion_timeout_s.
        let mut tr = tracker(Follow::HistoryOnly);
        let mut now = t(0);
        loop {
            match tr.next(now) {
                Action::ReadHistory => {
                    tr.history(Ok(History::NotFinished), now);
                }
                Action::WaitUntil(at) => now = at,
                Action::Hold(why) => {
                    assert_eq!(now, t(3600));
                    assert!(why.contains("3600 s"), "{why}");
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        // Nothing more after the hold.
        assert!(matches!(tr.next(t(4000)), Action::WaitUntil(_)));
        // A shorter configured timeout, counted from admission.
        let times = TrackingTimes {
            timeout: Duration::from_secs(60),
            ..TrackingTimes::default()
        };
        let mut tr = PromptTracker::new(Follow::Acknowledged, times, t(0), t(30));
        assert!(matches!(tr.next(t(59)), Action::Locate));
        assert!(matches!(tr.next(t(60)), Action::Hold(_)));
    }

    #[test]
    fn a_lost_submission_waits_five_minutes_reading_history_then_asks_the_version() {
        // COMFY-17 (history during the wait), COMFY-18
        let mut tr = tracker(Follow::Lost);
        let mut now = t(0);
        let mut history_reads = 0;
        loop {
            match tr.next(now) {
                Action::ReadHistory => {
                    history_reads += 1;
                    tr.history(Ok(History::NotFinished), now);
                }
                Action::WaitUntil(at) => now = at,
                Action::ReadVersion => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(now, t(300));
        assert_eq!(history_reads, 60);
        tr.version(Ok(ReportedVersion::Known(ComfyVersion::new(0, 3, 75))), now);
        // Now checked like an acknowledged prompt: two absent checks release it.
        assert_eq!(
            check(
                &mut tr,
                t(300),
                Ok(Location::Absent),
                Ok(History::NotFinished)
            ),
            None
        );
        let why = released(check(
            &mut tr,
            t(305),
            Ok(Location::Absent),
            Ok(History::NotFinished),
        ));
        assert!(why.contains("lost submission"), "{why}");
    }

    #[test]
    fn a_lost_prompt_found_queued_is_followed_like_an_acknowledged_one() {
        // COMFY-18
        let mut tr = tracker(Follow::Lost);
        while !matches!(tr.next(t(300)), Action::ReadVersion) {
            tr.history(Ok(History::NotFinished), t(300));
        }
        tr.version(
            Ok(ReportedVersion::Known(ComfyVersion::new(0, 6, 0))),
            t(300),
        );
        assert_eq!(
            check(
                &mut tr,
                t(300),
                Ok(Location::Pending),
                Ok(History::NotFinished)
            ),
            None
        );
        assert_eq!(
            check(
                &mut tr,
                t(305),
                Ok(Location::Running),
                Ok(History::NotFinished)
            ),
            None
        );
        released(check(
            &mut tr,
            t(310),
            Ok(Location::Absent),
            Ok(History::Finished { success: true }),
        ));
    }

    #[test]
    fn a_lost_submission_on_an_old_or_silent_release_follows_history_only() {
        // COMFY-19
        for v in [
            ReportedVersion::NotReported,
            ReportedVersion::Known(ComfyVersion::new(0, 3, 44)),
        ] {
            let mut tr = tracker(Follow::Lost);
            while !matches!(tr.next(t(300)), Action::ReadVersion) {
                tr.history(Ok(History::NotFinished), t(300));
            }
            tr.version(Ok(v), t(300));
            for k in 0..10 {
                assert_eq!(tr.next(t(300 + k * 5)), Action::ReadHistory, "{v:?}");
                assert_eq!(tr.history(Ok(History::NotFinished), t(300 + k * 5)), None);
            }
        }
    }

    #[test]
    fn a_failed_version_read_is_asked_again_at_the_next_check() {
        // COMFY-20
        let mut tr = tracker(Follow::Lost);
        while !matches!(tr.next(t(300)), Action::ReadVersion) {
            tr.history(Ok(History::NotFinished), t(300));
        }
        tr.version(Err("connection refused".into()), t(300));
        assert_eq!(tr.next(t(300)), Action::ReadHistory);
        assert_eq!(tr.history(Ok(History::NotFinished), t(300)), None);
        assert_eq!(tr.next(t(301)), Action::WaitUntil(t(305)));
        assert_eq!(tr.next(t(305)), Action::ReadVersion);
        tr.version(
            Ok(ReportedVersion::Known(ComfyVersion::new(0, 3, 75))),
            t(305),
        );
        assert_eq!(tr.next(t(305)), Action::Locate);
    }

    #[test]
    fn a_lost_submission_finished_in_history_during_the_wait_is_released() {
        // COMFY-17 reading: history is polled during the wait.
        let mut tr = tracker(Follow::Lost);
        assert_eq!(tr.next(t(0)), Action::ReadHistory);
        assert_eq!(tr.history(Ok(History::NotFinished), t(0)), None);
        assert_eq!(tr.next(t(5)), Action::ReadHistory);
        released(tr.history(Ok(History::Finished { success: false }), t(5)));
    }

    #[test]
    fn results_out_of_turn_are_ignored() {
        let mut tr = tracker(Follow::Acknowledged);
        tr.located(Ok(Location::Absent)); // not asked yet
        assert_eq!(tr.history(Ok(History::NotFinished), t(0)), None);
        assert_eq!(tr.next(t(0)), Action::Locate);
        tr.version(Ok(ReportedVersion::NotReported), t(0)); // not asked
        assert_eq!(tr.next(t(0)), Action::Locate);
    }
}
