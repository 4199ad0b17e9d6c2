//! Borrowers with names (issue 34): who asks for work, their turn in the
//! wait line, their limits and budgets, and what they used.
//!
//! # Behavior
//!
//! - Off unless the shell gives the engine a [`BorrowersSpec`]
//!   ([`Engine::set_borrowers`]). Off, every decision is the anonymous one:
//!   nothing here runs and no effect of it is queued.
//! - On, each request names its borrower ([`WorkRequest::borrower`]); a name
//!   the table does not hold is refused `unknown_borrower` (the daemon
//!   answers it 401), and a request naming none is refused the same way
//!   unless [`BorrowersSpec::anonymous`] lets it in as one more borrower.
//! - Priority: each borrower has a class, [`Priority::Interactive`] or
//!   [`Priority::Batch`]; a request may lower its own class
//!   ([`WorkRequest::priority`]), never raise it.
//! - Limits: at most `max_running` jobs at once (held ones count: they
//!   still hold their resources) and `max_waiting` in line at once; either
//!   refuses `borrower_limit`, or with a line the request at `max_running`
//!   waits for one of its borrower's own jobs to end.
//! - Budgets of reservation time per resource kind, per UTC day or ISO week
//!   (Monday 00:00 UTC): a second of one resource of that kind held from
//!   admission to release. Checked at admission against what was used in
//!   the period so far, running jobs included; spent, the request is refused
//!   `quota_exhausted` with `Retry-After` at the reset. A job admitted with
//!   budget left runs to its end even past the budget: only the next one
//!   is refused. A reservation across a period boundary counts in each
//!   period for the part inside it.
//! - Wall time comes in as lending hours do: the shell anchors the engine's
//!   timeline to UTC ([`Engine::set_wall_clock`]); without an anchor the
//!   timeline's origin is 1970-01-01 00:00 UTC (simulations).
//! - Accounting: every finished reservation of a named (or anonymous)
//!   borrower queues one [`Effect::Account`] with its [`UsageRecord`], before
//!   its `Forget`; `EngineStatus::borrowers` shows who runs and waits now,
//!   their totals, and each budget's use and reset.
//!
//! The turn order of the line is in the `line` module's docs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::Engine;
use super::capacity::ResourceKind;
use super::effect::Effect;
use super::refusal::{Refusal, RefusalCode};
use super::terms::in_words;
use super::usage::{KindTimes, UsageRecord, seconds};
use super::who::{BorrowerId, BorrowerRef, BorrowerTag, Priority};
use super::work::WorkRequest;
use crate::time::Moment;

/// The most a borrower's `share` may be: turns are counted in whole
/// fractions of one turn (`TURN`), so a larger share would round its turn to nothing.
pub const MAX_SHARE: u32 = 1000;

/// The length of one turn of a borrower of share 1 in the line's virtual time.
pub(super) const TURN: u64 = 1_000_000;

/// The period a budget is counted over, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    /// 00:00 UTC to 00:00 UTC.
    Day,
    /// Monday 00:00 UTC to the next Monday 00:00 UTC.
    Week,
}

impl BudgetPeriod {
    /// `day` or `week`.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
        }
    }

    /// The start of the period holding `unix_s`, in Unix seconds.
    pub fn start_of(self, unix_s: i64) -> i64 {
        const DAY: i64 = 86_400;
        match self {
            BudgetPeriod::Day => unix_s.div_euclid(DAY) * DAY,
            // 1970-01-05 was a Monday.
            BudgetPeriod::Week => (unix_s - 4 * DAY).div_euclid(7 * DAY) * 7 * DAY + 4 * DAY,
        }
    }

    /// Its length.
    pub fn length(self) -> Duration {
        match self {
            BudgetPeriod::Day => Duration::from_secs(86_400),
            BudgetPeriod::Week => Duration::from_secs(7 * 86_400),
        }
    }

    fn index(self) -> usize {
        match self {
            BudgetPeriod::Day => 0,
            BudgetPeriod::Week => 1,
        }
    }
}

/// A budget of reservation time on one kind of resource per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBudget {
    /// The kind of resource it counts.
    pub kind: ResourceKind,
    /// Day or week.
    pub period: BudgetPeriod,
    /// How much reservation time the period allows (one second of one
    /// resource of `kind` held counts one second).
    pub allowed: Duration,
}

/// One borrower: a name, a class, a weight in the line, limits, budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BorrowerSpec {
    /// The name, unique in the table.
    pub name: String,
    /// Its class; a request may lower it, never raise it.
    pub priority: Priority,
    /// Its weight in the line's turns, 1 to [`MAX_SHARE`]: a borrower of
    /// share 2 gets two turns for another's one while both wait.
    pub share: u32,
    /// At most this many jobs at once; `None`: no limit.
    pub max_running: Option<u32>,
    /// At most this many requests in line at once; `None`: no limit
    /// beyond the line's own.
    pub max_waiting: Option<u32>,
    /// Budgets of reservation time.
    pub budgets: Vec<TimeBudget>,
}

impl BorrowerSpec {
    /// An interactive borrower of share 1 with no limits.
    pub fn new(name: &str) -> Self {
        BorrowerSpec {
            name: name.to_owned(),
            priority: Priority::Interactive,
            share: 1,
            max_running: None,
            max_waiting: None,
            budgets: Vec::new(),
        }
    }
}

/// The borrower table and how the line treats it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BorrowersSpec {
    /// The borrowers.
    pub borrowers: Vec<BorrowerSpec>,
    /// A batch waiter that has waited this long is overdue: it goes ahead
    /// of every waiter that is not, so batch work never starves.
    pub batch_max_wait: Duration,
    /// Requests that name no borrower are admitted as one more borrower
    /// with these terms (its name is ignored; status calls it
    /// [`ANONYMOUS`]); `None`: they are refused `unknown_borrower`.
    pub anonymous: Option<BorrowerSpec>,
}

/// The name status and accounting give requests that named no borrower.
pub const ANONYMOUS: &str = "(anonymous)";

/// A borrower table the engine cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BorrowerSpecError {
    /// Two borrowers share a name.
    #[error("borrower {0:?} is listed twice; give each borrower a unique name")]
    Duplicate(String),
    /// A name is empty or the reserved anonymous name.
    #[error("borrower name {0:?} is empty or reserved; choose another")]
    BadName(String),
    /// A share outside 1..=MAX_SHARE.
    #[error("borrower {name:?} has share {share}; a share is 1 to {MAX_SHARE}")]
    Share {
        /// The borrower.
        name: String,
        /// Its share.
        share: u32,
    },
}

/// One borrower now, for `/status` and the borrower's own view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BorrowerStatus {
    /// The name.
    pub name: String,
    /// Its class.
    pub priority: Priority,
    /// Its weight.
    pub share: u32,
    /// Jobs it has now (held ones included).
    pub running: u32,
    /// Requests it has in line now.
    pub waiting: u32,
    /// Its entries held now.
    pub held: u32,
    /// Its limits.
    pub max_running: Option<u32>,
    /// Its limits.
    pub max_waiting: Option<u32>,
    /// Totals since the engine started.
    pub totals: BorrowerTotals,
    /// Each budget: what the period used and when it resets.
    pub budgets: Vec<BudgetStatus>,
}

/// What a borrower used since the engine started.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct BorrowerTotals {
    /// Jobs admitted.
    pub jobs: u64,
    /// Reservation time of finished jobs per resource kind.
    #[serde(rename = "reserved_s")]
    pub reserved: KindTimes,
    /// Refusals by code.
    pub refusals: BTreeMap<&'static str, u64>,
    /// How long its admitted requests waited in line.
    #[serde(rename = "waited_s", serialize_with = "seconds")]
    pub waited: Duration,
    /// Entries that turned held.
    pub held: u64,
}

/// One budget's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetStatus {
    /// gpu | memory | cpu.
    pub kind: ResourceKind,
    /// day | week.
    pub period: BudgetPeriod,
    /// Seconds the period allows.
    pub allowed_s: u64,
    /// Used in the period so far, running jobs included.
    #[serde(rename = "used_s", serialize_with = "seconds")]
    pub used: Duration,
    /// Left (zero once spent).
    #[serde(rename = "left_s", serialize_with = "seconds")]
    pub left: Duration,
    /// When the period ends, in Unix seconds.
    pub resets_unix_s: i64,
    /// When the period ends, in words (`2026-12-04 00:00 UTC`).
    pub resets: String,
}

/// The engine's timeline anchored to UTC: `at` is `unix_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct WallAnchor {
    at: Moment,
    unix_ms: i64,
}

impl WallAnchor {
    pub(super) fn unix_ms(self, m: Moment) -> i64 {
        let (a, b) = (m.as_nanos(), self.at.as_nanos());
        let delta_ms = if a >= b {
            i64::try_from((a - b) / 1_000_000).unwrap_or(i64::MAX)
        } else {
            -i64::try_from((b - a) / 1_000_000).unwrap_or(i64::MAX)
        };
        self.unix_ms.saturating_add(delta_ms)
    }

    /// The moment of Unix second `unix_s` on the timeline (the origin if earlier).
    pub(super) fn moment(self, unix_s: i64) -> Moment {
        let delta_ms = unix_s.saturating_mul(1000).saturating_sub(self.unix_ms);
        let at = i128::from(self.at.as_nanos()) + i128::from(delta_ms) * 1_000_000;
        Moment::from_nanos(u64::try_from(at.max(0)).unwrap_or(u64::MAX))
    }
}

/// Reservation time per kind in one period.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tally {
    /// The period's start in Unix seconds.
    start: i64,
    used: [Duration; 3],
}

/// The current UTC period on the engine's timeline, cached so that the
/// admission path does no calendar arithmetic while `now` stays inside it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Window {
    /// The period's start in Unix seconds.
    start_unix: i64,
    /// Its start and end on the timeline.
    from: Moment,
    until: Moment,
    valid: bool,
}

impl Window {
    /// Whether it is filled in and holds `now`.
    fn holds(&self, now: Moment) -> bool {
        self.valid && self.from <= now && now < self.until
    }
}

/// What the engine keeps per borrower.
#[derive(Debug, Clone)]
pub(super) struct BorrowerState {
    pub(super) spec: BorrowerSpec,
    /// Its name, shared with each accounting row.
    name: Arc<str>,
    /// Left the table at a reload: unknown to new requests, kept while its
    /// jobs run (they are accounted to it).
    pub(super) retired: bool,
    /// The virtual time at which its next turn starts, per class.
    pub(super) finish: [u64; 2],
    /// Finished reservation time per period (day, week).
    tallies: [Tally; 2],
    pub(super) totals: Totals,
    /// What it has now, kept as entries and waiters come and go so that
    /// admission never scans them (`Engine::recount_borrowers` rebuilds it).
    pub(super) now: NowCounts,
    /// Its turn length in virtual time, divided out once here rather than
    /// at every admission.
    cost: u64,
}

/// A borrower's entries (held ones included), held entries and waiters now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NowCounts {
    pub(super) running: u32,
    pub(super) held: u32,
    pub(super) waiting: u32,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Totals {
    pub(super) jobs: u64,
    pub(super) reserved: [Duration; 3],
    pub(super) refusals: BTreeMap<RefusalCode, u64>,
    pub(super) waited: Duration,
    pub(super) held: u64,
}

impl BorrowerState {
    fn new(spec: BorrowerSpec) -> Self {
        BorrowerState {
            name: Arc::from(spec.name.as_str()),
            cost: TURN / u64::from(spec.share.clamp(1, MAX_SHARE)),
            spec,
            retired: false,
            finish: [0; 2],
            tallies: [Tally::default(); 2],
            totals: Totals::default(),
            now: NowCounts::default(),
        }
    }

    /// Reservation time of `kind` its finished jobs used in window `w`.
    fn finished_in(&self, kind: ResourceKind, period: BudgetPeriod, w: &Window) -> Duration {
        let tally = &self.tallies[period.index()];
        if tally.start == w.start_unix {
            tally.used[kind_index(kind)]
        } else {
            Duration::ZERO
        }
    }

    /// Its turn length in virtual time.
    pub(super) fn cost(&self) -> u64 {
        self.cost
    }
}

/// The borrower table in force.
#[derive(Debug, Clone)]
pub(super) struct Borrowers {
    pub(super) state: Vec<BorrowerState>,
    index: HashMap<String, usize>,
    /// The anonymous slot's index, if anonymous requests are let in.
    anonymous: Option<usize>,
    pub(super) batch_max_wait: Duration,
    /// The line's virtual time per class: the start of the last turn served.
    pub(super) vtime: [u64; 2],
    /// The current day and week ([`Engine::set_wall_clock`] clears them).
    windows: [Window; 2],
}

pub(super) fn kind_index(kind: ResourceKind) -> usize {
    match kind {
        ResourceKind::Gpu => 0,
        ResourceKind::Memory => 1,
        ResourceKind::Cpu => 2,
    }
}

/// A borrower's claim on a request: its slot and its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) slot: usize,
    pub(super) class: Priority,
}

impl Borrowers {
    fn build(spec: BorrowersSpec, old: Option<Borrowers>) -> Result<Borrowers, BorrowerSpecError> {
        let mut state: Vec<BorrowerState> = Vec::new();
        let mut index = HashMap::new();
        for b in spec.borrowers {
            if b.name.is_empty() || b.name == ANONYMOUS {
                return Err(BorrowerSpecError::BadName(b.name));
            }
            if b.share == 0 || b.share > MAX_SHARE {
                return Err(BorrowerSpecError::Share {
                    name: b.name,
                    share: b.share,
                });
            }
            if index.insert(b.name.clone(), state.len()).is_some() {
                return Err(BorrowerSpecError::Duplicate(b.name));
            }
            state.push(BorrowerState::new(b));
        }
        let anonymous = match spec.anonymous {
            Some(mut a) => {
                a.name = ANONYMOUS.to_owned();
                a.share = a.share.clamp(1, MAX_SHARE);
                state.push(BorrowerState::new(a));
                Some(state.len() - 1)
            }
            None => None,
        };
        let mut vtime = [0; 2];
        if let Some(old) = old {
            // A reload keeps what each remaining name used and its turns;
            // a removed one stays, retired, for its jobs and waiters.
            vtime = old.vtime;
            for prev in old.state {
                let slot = if prev.spec.name == ANONYMOUS {
                    anonymous
                } else {
                    index.get(&prev.spec.name).copied()
                };
                match slot {
                    Some(i) => {
                        let s = &mut state[i];
                        s.finish = prev.finish;
                        s.tallies = prev.tallies;
                        s.totals = prev.totals;
                    }
                    None => state.push(BorrowerState {
                        retired: true,
                        ..prev
                    }),
                }
            }
        }
        Ok(Borrowers {
            state,
            index,
            anonymous,
            batch_max_wait: spec.batch_max_wait,
            vtime,
            windows: [Window::default(); 2],
        })
    }

    /// The slot of a request's borrower, or its refusal.
    fn resolve(&self, who: Option<&BorrowerRef>) -> Result<usize, Refusal> {
        let unknown = |why: String| Refusal::new(RefusalCode::UnknownBorrower, why);
        match who {
            None => self.anonymous.ok_or_else(|| {
                unknown(
                    "this lender serves named borrowers only; send your key (Authorization: Bearer <key>)"
                        .to_owned(),
                )
            }),
            Some(BorrowerRef::Name(name)) => self
                .index
                .get(name)
                .copied()
                .ok_or_else(|| unknown("the key or borrower is not known to this lender; ask its owner for a key".to_owned())),
            Some(BorrowerRef::Id(id)) => match self.state.get(id.0) {
                Some(s) if !s.retired => Ok(id.0),
                _ => Err(unknown(
                    "the borrower is no longer known to this lender; ask its owner for a key"
                        .to_owned(),
                )),
            },
        }
    }
}

impl Engine {
    /// The borrower table (issue 34); `None` switches borrowers off. A new
    /// table replaces the last (a keys file reload): each name that stays
    /// keeps its use, budgets and turns; a removed one is refused from now
    /// on (its waiters too, the next time they ask) while its jobs run to
    /// their end and are accounted to it.
    pub fn set_borrowers(&mut self, spec: Option<BorrowersSpec>) -> Result<(), BorrowerSpecError> {
        let old = self.borrowers.take();
        let rebuilt = spec.map(|spec| Borrowers::build(spec, old.clone()));
        match rebuilt.transpose() {
            Ok(b) => {
                let remap = |slot: usize| {
                    let name = &old.as_ref()?.state.get(slot)?.spec.name;
                    b.as_ref()?.state.iter().position(|s| &s.spec.name == name)
                };
                for e in self.entries.values_mut() {
                    e.borrower = e.borrower.and_then(|c| {
                        remap(c.slot).map(|slot| Claim {
                            slot,
                            class: c.class,
                        })
                    });
                }
                for w in &mut self.line {
                    w.borrower = w.borrower.and_then(|c| {
                        remap(c.slot).map(|slot| Claim {
                            slot,
                            class: c.class,
                        })
                    });
                }
                self.borrowers = b;
                self.recount_borrowers();
                self.wake_waiters();
                Ok(())
            }
            Err(e) => {
                self.borrowers = old;
                Err(e)
            }
        }
    }

    /// The tag a reservation of `claim` records: its borrower's name and class.
    pub(super) fn tag_of(&self, claim: Claim) -> Option<BorrowerTag> {
        let s = self.borrowers.as_ref()?.state.get(claim.slot)?;
        Some(BorrowerTag {
            name: Arc::clone(&s.name),
            priority: claim.class,
        })
    }

    /// The claim of an entry restored after a restart, from its recorded
    /// tag: its borrower's slot, or a retired one for a name the table no
    /// longer holds, so that its release is still accounted to it. `None`
    /// with borrowers off.
    pub(super) fn restore_claim(&mut self, tag: &BorrowerTag) -> Option<Claim> {
        let b = self.borrowers.as_mut()?;
        let known = if &*tag.name == ANONYMOUS {
            b.anonymous
        } else {
            b.index.get(&*tag.name).copied()
        };
        let slot = known
            .or_else(|| b.state.iter().position(|s| s.retired && s.name == tag.name))
            .unwrap_or_else(|| {
                b.state.push(BorrowerState {
                    retired: true,
                    ..BorrowerState::new(BorrowerSpec::new(&tag.name))
                });
                b.state.len() - 1
            });
        Some(Claim {
            slot,
            class: tag.priority,
        })
    }

    /// The handle of borrower `name`, if the table holds it.
    pub fn borrower_id(&self, name: &str) -> Option<BorrowerId> {
        let b = self.borrowers.as_ref()?;
        b.index.get(name).copied().map(BorrowerId)
    }

    /// Anchor the engine's timeline to UTC: `at` on the timeline is
    /// `unix_ms` milliseconds after 1970-01-01 00:00 UTC. Budgets reset at
    /// UTC day and week boundaries through it; the shell re-anchors now and
    /// then, as it projects the lending hours.
    pub fn set_wall_clock(&mut self, at: Moment, unix_ms: i64) {
        self.wall = WallAnchor { at, unix_ms };
        if let Some(b) = &mut self.borrowers {
            b.windows = [Window::default(); 2];
        }
    }

    /// The `period` holding `now`: the cached window, or a fresh one.
    #[inline]
    fn window(&self, period: BudgetPeriod, now: Moment) -> Window {
        if let Some(b) = &self.borrowers {
            let w = b.windows[period.index()];
            if w.holds(now) {
                return w;
            }
        }
        self.fresh_window(period, now)
    }

    /// The `period` holding `now`, computed: the calendar arithmetic that
    /// the cache saves while `now` stays inside the period.
    #[cold]
    fn fresh_window(&self, period: BudgetPeriod, now: Moment) -> Window {
        let start_unix = period.start_of(self.wall.unix_ms(now).div_euclid(1000));
        let len = i64::try_from(period.length().as_secs()).unwrap_or(i64::MAX);
        Window {
            start_unix,
            from: self.wall.moment(start_unix),
            until: self.wall.moment(start_unix.saturating_add(len)),
            valid: true,
        }
    }

    /// Cache the day and week holding `now`.
    #[inline]
    pub(super) fn refresh_windows(&mut self, now: Moment) {
        if let Some(b) = &self.borrowers
            && !(b.windows[0].holds(now) && b.windows[1].holds(now))
        {
            self.cache_windows(now);
        }
    }

    /// Cache fresh windows: a new period began, or the clock was anchored.
    #[cold]
    fn cache_windows(&mut self, now: Moment) {
        let fresh = [
            self.window(BudgetPeriod::Day, now),
            self.window(BudgetPeriod::Week, now),
        ];
        if let Some(b) = &mut self.borrowers {
            b.windows = fresh;
        }
    }

    /// The claim of a request: its borrower's slot and class, `Ok(None)`
    /// with borrowers off, or the refusal of an unknown borrower.
    pub(super) fn claim(&self, req: &WorkRequest) -> Result<Option<Claim>, Refusal> {
        let Some(b) = &self.borrowers else {
            return Ok(None);
        };
        let slot = b.resolve(req.borrower.as_ref())?;
        let class = b.state[slot].spec.priority.lowered_by(req.priority);
        Ok(Some(Claim { slot, class }))
    }

    /// Each borrower's entries, held entries and waiters, counted afresh.
    fn counted_borrowers(&self) -> Vec<NowCounts> {
        let Some(b) = &self.borrowers else {
            return Vec::new();
        };
        let mut counts = vec![NowCounts::default(); b.state.len()];
        for e in self.entries.values() {
            if let Some(n) = e.borrower.and_then(|c| counts.get_mut(c.slot)) {
                n.running += 1;
                if e.phase == super::Phase::Held {
                    n.held += 1;
                }
            }
        }
        for w in &self.line {
            if let Some(n) = w.borrower.and_then(|c| counts.get_mut(c.slot)) {
                n.waiting += 1;
            }
        }
        counts
    }

    /// Rebuild each borrower's counts from the entries and the line (a new
    /// table moves slots).
    fn recount_borrowers(&mut self) {
        let counts = self.counted_borrowers();
        if let Some(b) = &mut self.borrowers {
            for (s, n) in b.state.iter_mut().zip(counts) {
                s.now = n;
            }
        }
    }

    /// Debug builds: the kept counts match a recount.
    pub(super) fn debug_check_counts(&self) {
        if cfg!(debug_assertions)
            && let Some(b) = &self.borrowers
        {
            let kept: Vec<NowCounts> = b.state.iter().map(|s| s.now).collect();
            debug_assert_eq!(kept, self.counted_borrowers(), "borrower counts drifted");
        }
    }

    /// The counts of borrower `slot` now.
    fn now_of(&self, slot: usize) -> NowCounts {
        self.borrowers
            .as_ref()
            .and_then(|b| b.state.get(slot))
            .map_or_else(NowCounts::default, |s| s.now)
    }

    /// Borrower `slot`'s counts, changed by `f` (with borrowers on).
    pub(super) fn adjust_counts(&mut self, claim: Option<Claim>, f: impl FnOnce(&mut NowCounts)) {
        if let Some(s) = claim.and_then(|c| self.borrowers.as_mut()?.state.get_mut(c.slot)) {
            f(&mut s.now);
        }
    }

    /// A waiter of `claim` left the line.
    pub(super) fn count_left_line(&mut self, claim: Option<Claim>) {
        self.adjust_counts(claim, |n| n.waiting = n.waiting.saturating_sub(1));
    }

    /// Whether borrower `slot` runs as many jobs as it may.
    pub(super) fn at_max_running(&self, slot: usize) -> bool {
        let Some(s) = self.borrowers.as_ref().and_then(|b| b.state.get(slot)) else {
            return false;
        };
        match s.spec.max_running {
            Some(max) => s.now.running >= max,
            None => false,
        }
    }

    /// The `borrower_limit` refusal of a request whose borrower runs
    /// `max_running` jobs; it may wait in line for one to end.
    pub(super) fn running_limit(&self, claim: Option<Claim>) -> Option<Refusal> {
        let c = claim?;
        if !self.at_max_running(c.slot) {
            return None;
        }
        let b = self.borrowers.as_ref()?;
        let s = &b.state[c.slot];
        Some(Refusal::new(
            RefusalCode::BorrowerLimit,
            format!(
                "borrower {} runs {} jobs at once, its limit (max_running); retry when one ends",
                s.spec.name,
                s.spec.max_running.unwrap_or(0)
            ),
        ))
    }

    /// The `borrower_limit` refusal of a request that would join the line
    /// while its borrower has `max_waiting` requests in it.
    pub(super) fn waiting_limit(&self, claim: Option<Claim>) -> Option<Refusal> {
        let c = claim?;
        let s = &self.borrowers.as_ref()?.state[c.slot];
        let max = s.spec.max_waiting?;
        let waiting = s.now.waiting;
        (waiting >= max).then(|| {
            Refusal::new(
                RefusalCode::BorrowerLimit,
                format!(
                    "borrower {} has {waiting} requests waiting in line, its limit (max_waiting); retry when one is served",
                    s.spec.name
                ),
            )
        })
    }

    /// Reservation time borrower `slot` used of `kind` in the `period`
    /// holding `now`: its finished jobs' part inside the period and its
    /// running jobs' part so far.
    fn used(&self, slot: usize, kind: ResourceKind, period: BudgetPeriod, now: Moment) -> Duration {
        let Some(s) = self.borrowers.as_ref().and_then(|b| b.state.get(slot)) else {
            return Duration::ZERO;
        };
        let w = self.window(period, now);
        let mut used = s.finished_in(kind, period, &w);
        if s.now.running == 0 {
            return used;
        }
        let from = w.from;
        for e in self.entries.values() {
            if e.borrower.is_some_and(|c| c.slot == slot) {
                let n = e
                    .deps
                    .iter()
                    .filter(|&&r| self.resources[r].spec.kind == kind)
                    .count();
                let since = e.reservation.admitted_at.max(from);
                used += now.since(since) * u32::try_from(n).unwrap_or(u32::MAX);
            }
        }
        used
    }

    /// The `quota_exhausted` refusal of a request of upstream `up` whose
    /// borrower spent a budget on a kind of resource the upstream holds,
    /// with `Retry-After` at the latest reset among the spent ones.
    pub(super) fn quota_refusal(
        &self,
        claim: Option<Claim>,
        up: usize,
        now: Moment,
    ) -> Option<Refusal> {
        let c = claim?;
        let s = &self.borrowers.as_ref()?.state[c.slot];
        if s.spec.budgets.is_empty() {
            return None;
        }
        let mut spent: Option<(Moment, String)> = None;
        for budget in &s.spec.budgets {
            let needs = self.upstreams[up]
                .deps
                .iter()
                .any(|d| self.resources[d.res].spec.kind == budget.kind);
            if !needs {
                continue;
            }
            // A borrower running nothing used only its finished jobs' time.
            let used = if s.now.running == 0 {
                s.finished_in(budget.kind, budget.period, &self.window(budget.period, now))
            } else {
                self.used(c.slot, budget.kind, budget.period, now)
            };
            if used < budget.allowed {
                continue;
            }
            let w = self.window(budget.period, now);
            let reset_unix = w
                .start_unix
                .saturating_add(i64::try_from(budget.period.length().as_secs()).unwrap_or(0));
            let reset = w.until;
            if spent.as_ref().is_some_and(|(at, _)| *at >= reset) {
                continue;
            }
            let words = format!(
                "borrower {} used {} of {} time this {} (UTC), its budget of {}; it resets at {}, in {}",
                s.spec.name,
                in_words(used),
                budget.kind.as_str(),
                budget.period.as_str(),
                in_words(budget.allowed),
                utc_words(reset_unix),
                in_words(reset.since(now)),
            );
            spent = Some((reset, words));
        }
        let (reset, words) = spent?;
        let mut refusal = Refusal::new(RefusalCode::QuotaExhausted, words);
        refusal.retry_in = Some(reset.since(now).max(Duration::from_secs(1)));
        Some(refusal)
    }

    /// Count a refusal against its borrower.
    pub(super) fn count_refusal(&mut self, claim: Option<Claim>, code: RefusalCode) {
        if let (Some(c), Some(b)) = (claim, &mut self.borrowers) {
            *b.state[c.slot].totals.refusals.entry(code).or_default() += 1;
        }
    }

    /// An admission: the borrower's turn is served (the line's virtual time
    /// moves to its start) and its totals count the job and its wait.
    pub(super) fn count_admission(&mut self, claim: Option<Claim>, waited: Duration) {
        let (Some(c), Some(b)) = (claim, &mut self.borrowers) else {
            return;
        };
        let k = c.class.index();
        let s = &mut b.state[c.slot];
        let start = b.vtime[k].max(s.finish[k]);
        s.finish[k] = start.saturating_add(s.cost());
        s.totals.jobs += 1;
        s.totals.waited += waited;
        // Its entry is inserted next.
        s.now.running += 1;
        b.vtime[k] = b.vtime[k].max(start);
    }

    /// An entry of borrower `claim` turned held.
    pub(super) fn count_held(&mut self, claim: Option<Claim>) {
        if let (Some(c), Some(b)) = (claim, &mut self.borrowers) {
            let s = &mut b.state[c.slot];
            s.totals.held += 1;
            s.now.held += 1;
        }
    }

    /// A borrower's entry ended: add its time to the borrower's periods and
    /// totals, and queue its accounting row.
    /// Takes the entry, so the record moves its names rather than copying them.
    pub(super) fn account(&mut self, e: super::Entry, now: Moment) {
        let Some(c) = e.borrower else {
            return;
        };
        let was_held = e.phase == super::Phase::Held;
        self.adjust_counts(Some(c), |n| {
            n.running = n.running.saturating_sub(1);
            if was_held {
                n.held = n.held.saturating_sub(1);
            }
        });
        self.refresh_windows(now);
        let released_ms = self.wall.unix_ms(now);
        let Some(b) = &mut self.borrowers else {
            return;
        };
        let windows = b.windows;
        let Some(s) = b.state.get_mut(c.slot) else {
            return;
        };
        let admitted = e.reservation.admitted_at;
        let held_for = now.since(admitted) + e.started_before;
        let mut kinds = [0u32; 3];
        for &r in &e.deps {
            kinds[kind_index(self.resources[r].spec.kind)] += 1;
        }
        for (tally, w) in s.tallies.iter_mut().zip(windows) {
            if tally.start != w.start_unix {
                *tally = Tally {
                    start: w.start_unix,
                    used: [Duration::ZERO; 3],
                };
            }
            let part = now.since(admitted.max(w.from));
            // Kinds it holds none of add nothing: skip their arithmetic.
            for (used, n) in tally.used.iter_mut().zip(kinds) {
                if n != 0 {
                    *used += part * n;
                }
            }
        }
        let per_kind = kinds.map(|n| if n == 0 { Duration::ZERO } else { held_for * n });
        for (total, d) in s.totals.reserved.iter_mut().zip(per_kind) {
            *total += d;
        }
        let record = UsageRecord {
            entry: e.reservation.id,
            borrower: Arc::clone(&s.name),
            upstream: e.reservation.upstream,
            model: e.reservation.model,
            priority: c.class,
            admitted_unix_ms: released_ms
                .saturating_sub(i64::try_from(held_for.as_millis()).unwrap_or(i64::MAX)),
            released_unix_ms: released_ms,
            waited: e.waited,
            held: e.was_held,
            reserved: KindTimes {
                gpu: per_kind[0],
                memory: per_kind[1],
                cpu: per_kind[2],
            },
            resources: e.reservation.charges,
        };
        self.effects.push(Effect::Account(Box::new(record)));
    }

    /// Where borrower `name`'s requests wait now: each one's upstream and
    /// place in its line, 1 being next, in line order.
    pub fn borrower_line(&self, name: &str, now: Moment) -> Vec<(String, u32)> {
        let Some(id) = self.borrower_id(name) else {
            return Vec::new();
        };
        self.line
            .iter()
            .filter(|w| w.borrower.is_some_and(|c| c.slot == id.0))
            .filter_map(|w| {
                let place = self.line_position(w.id, now)?;
                let upstream = self.upstreams.get(w.upstream)?.spec.name.clone();
                Some((upstream, place + 1))
            })
            .collect()
    }

    /// One borrower's own view (`/v1/vacancy/me`): its use, limits and
    /// budgets; `None` for a name the table does not hold.
    pub fn borrower_status(&self, name: &str, now: Moment) -> Option<BorrowerStatus> {
        self.borrower_id(name)?;
        self.borrower_statuses(now)
            .into_iter()
            .find(|b| b.name == name)
    }

    /// Every borrower, for status: those in the table and retired ones
    /// that still run or wait.
    pub(super) fn borrower_statuses(&self, now: Moment) -> Vec<BorrowerStatus> {
        let Some(b) = &self.borrowers else {
            return Vec::new();
        };
        let unix_now = self.wall.unix_ms(now).div_euclid(1000);
        let mut out = Vec::with_capacity(b.state.len());
        for (slot, s) in b.state.iter().enumerate() {
            let NowCounts {
                running,
                held,
                waiting,
            } = self.now_of(slot);
            if s.retired && running == 0 && waiting == 0 {
                continue;
            }
            let budgets = s
                .spec
                .budgets
                .iter()
                .map(|budget| {
                    let used = self.used(slot, budget.kind, budget.period, now);
                    let reset = budget.period.start_of(unix_now)
                        + i64::try_from(budget.period.length().as_secs()).unwrap_or(0);
                    BudgetStatus {
                        kind: budget.kind,
                        period: budget.period,
                        allowed_s: budget.allowed.as_secs(),
                        used,
                        left: budget.allowed.saturating_sub(used),
                        resets_unix_s: reset,
                        resets: utc_words(reset),
                    }
                })
                .collect();
            let t = &s.totals;
            out.push(BorrowerStatus {
                name: s.spec.name.clone(),
                priority: s.spec.priority,
                share: s.spec.share,
                running,
                waiting,
                held,
                max_running: s.spec.max_running,
                max_waiting: s.spec.max_waiting,
                totals: BorrowerTotals {
                    jobs: t.jobs,
                    reserved: KindTimes {
                        gpu: t.reserved[0],
                        memory: t.reserved[1],
                        cpu: t.reserved[2],
                    },
                    refusals: t.refusals.iter().map(|(c, n)| (c.as_str(), *n)).collect(),
                    waited: t.waited,
                    held: t.held,
                },
                budgets,
            });
        }
        out
    }
}

/// A Unix second in words: `2026-12-04 00:00 UTC`.
pub fn utc_words(unix_s: i64) -> String {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60
    )
}

#[cfg(test)]
#[path = "borrowers_tests.rs"]
mod tests;
