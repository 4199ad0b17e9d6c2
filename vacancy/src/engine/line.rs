//! The wait line: an opt-in, owner-aware queue for requests refused only
//! because a resource they need is reserved (issue 22).
//!
//! # Behavior
//!
//! - Off unless an upstream has a [`QueueSpec`] (`[upstream.queue]`) or a
//!   request brings its own wait ([`WorkRequest::wait`], Python's
//!   `admit(wait_s=)`). Off, every decision is the seed's.
//! - Only `resource_busy` waits. Any other refusal (owner present, lending
//!   paused, resource switched off, pressure) answers at once, for a new
//!   request and for every waiter the next time it asks: the shell is woken
//!   by [`Effect::WakeWaiters`] whenever such an input changes.
//! - Fairness: one line across all upstreams, in arrival order (in turn
//!   order with borrowers, below). A request
//!   may take its resources only when no request ahead of it in the line
//!   needs any of them. So requests on the same resources are served first
//!   come, first served, and a multi-resource request is never overtaken
//!   on a resource it needs by a later single-resource one: it cannot
//!   starve. The cost: a later request on a resource a waiter ahead needs
//!   waits even while that resource alone is free. Requests that do not
//!   wait (their upstream has no line) never overtake a waiter either; they
//!   are refused `resource_busy` as before.
//! - A waiter is admitted by the full admission check, after the post-job
//!   sample (ADM-04..06), whose 4 s bound counts from the moment it was its
//!   turn. It leaves at its deadline (`resource_busy`), when refused, when
//!   admitted, or when the shell says it left ([`Engine::leave_line`]). A
//!   waiter whose resident observation was only too old (RES-20) keeps its
//!   place while the shell observes once more ([`Decision::Reobserve`]).
//! - The vacancy sign follows the line: `admitting` only when a new request
//!   would be admitted now, `queueing` when it would wait its turn
//!   ([`Engine::vacancy`], from `Engine::ahead_of`, as admission itself).
//! - Nothing in the line is reserved or recorded: a restart forgets it.
//!
//! # With borrowers (issue 34)
//!
//! With a borrower table ([`Engine::set_borrowers`]) "ahead" is no longer
//! arrival order but a turn order, and every rule above holds with "ahead"
//! read that way: a request takes its resources only when no waiter with an
//! earlier turn needs any of them, so nothing runs on a busy resource, a
//! multi-resource waiter is never overtaken on a resource it needs by a
//! waiter with a later turn, and every waiter is answered by its deadline;
//! an owner's return still answers every waiter at once (hard refusals come
//! before turns).
//!
//! - Turns: start-time fair queueing by borrower, weighted by `share`, one
//!   virtual clock per class (`Engine::turns`). A borrower's 50 waiters
//!   take turns 1..50 of its own; another borrower's single waiter takes
//!   the current turn, so it waits about one job (two if its borrower had
//!   the latest turn), not fifty. An idle borrower saves no credit.
//! - Classes: interactive waiters go ahead of batch ones. A batch waiter
//!   that has waited `batch_max_wait` is overdue and goes ahead of every
//!   waiter that is not (overdue ones among themselves by their batch
//!   turns): it waits at most `batch_max_wait`, then the job in service
//!   and the post-job sample, behind only earlier overdue batch turns.
//! - No starvation: turns only grow, so the waiters that can ever be
//!   ahead of one are bounded (each borrower's turns between the clock and
//!   its own); and each still leaves at its deadline.
//! - A waiter whose borrower runs its `max_running` jobs stands aside: it
//!   is not ahead of anyone until one of its borrower's jobs ends, so its
//!   limit never idles a resource another borrower could use.
//! - Admissions count as turns whether or not they waited, so a borrower
//!   who is admitted straight away also moves its turns on.

use std::time::Duration;

use super::borrowers::Claim;
use super::effect::Effect;
use super::refusal::{Refusal, RefusalCode};
use super::who::Priority;
use super::work::{Charge, Decision, EntryId, WorkRequest};
use super::{Blocked, Engine};
use crate::time::Moment;

/// An upstream's wait line settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSpec {
    /// How many of the upstream's requests may wait at once.
    pub max_waiting: u32,
    /// How long one may wait.
    pub max_wait: Duration,
}

/// How long past its deadline a waiter that never asked again stays in line:
/// a shell asks at the deadline, so one that has not by then is gone (a
/// shell that never said it left) and must not block those behind it.
pub const LINE_EXPIRY_GRACE: Duration = Duration::from_secs(60);

/// Requests that may wait without an upstream line (a per-request wait).
const PER_REQUEST_MAX_WAITING: u32 = 1024;

/// One request waiting in line.
#[derive(Debug, Clone)]
pub(super) struct Waiter {
    pub(super) id: EntryId,
    pub(super) upstream: usize,
    pub(super) deps: Vec<usize>,
    pub(super) joined: Moment,
    pub(super) until: Moment,
    /// When it was first its turn with a post-job sample pending: the ADM-06
    /// bound counts from here.
    pub(super) ready_since: Option<Moment>,
    /// Its borrower and class, with borrowers on.
    pub(super) borrower: Option<Claim>,
}

/// A waiter's place in the turn order, lowest first: its rank (0 overdue
/// batch, 1 interactive, 2 batch), its turn's start in its class's virtual
/// time, its arrival.
type Turn = (u8, u64, usize);

/// The waiters ahead of a request that need a resource it needs.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ahead {
    /// The resource the first of them needs.
    pub(super) first: Option<usize>,
    /// How many they are.
    pub(super) count: u32,
}

/// One upstream's line, for `/status` (`{"waiting": 2, "oldest_wait_s": 1.5}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct LineStatus {
    /// Requests waiting.
    pub waiting: u32,
    /// How long the oldest has waited.
    #[serde(rename = "oldest_wait_s", serialize_with = "seconds")]
    pub oldest_wait: Option<Duration>,
}

fn seconds<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&((d.as_secs_f64() * 1000.0).round() / 1000.0)),
        None => s.serialize_none(),
    }
}

impl Engine {
    /// The borrower of request `id` left while it waited (a disconnect):
    /// it leaves the line, reserving nothing. No-op when it is not in line.
    pub fn leave_line(&mut self, id: EntryId) {
        if let Some(i) = self.line.iter().position(|w| w.id == id) {
            self.leave_at(i);
        }
    }

    /// How many waiters are ahead of request `id` on a resource it needs
    /// (in turn order with borrowers): its place in line for the borrower
    /// (`vacancy-line-position`, issue 34); `None` when it does not wait.
    pub fn line_position(&self, id: EntryId, now: Moment) -> Option<u32> {
        let seat = self.seat(id)?;
        let w = &self.line[seat];
        Some(self.ahead_of(w.upstream, Some(seat), w.borrower, now).count)
    }

    /// Whether request `id` waits in line.
    pub fn in_line(&self, id: EntryId) -> bool {
        self.seat(id).is_some()
    }

    /// Drop waiters gone past their deadline by [`LINE_EXPIRY_GRACE`].
    pub(super) fn expire_line(&mut self, now: Moment) {
        let before = self.line.len();
        let mut gone = Vec::new();
        self.line.retain(|w| {
            let keep = now < w.until.after(LINE_EXPIRY_GRACE);
            if !keep {
                gone.push(w.borrower);
            }
            keep
        });
        for claim in gone {
            self.count_left_line(claim);
        }
        if self.line.len() != before {
            self.wake_waiters();
        }
    }

    /// Where request `id` waits, if it does.
    pub(super) fn seat(&self, id: EntryId) -> Option<usize> {
        self.line.iter().position(|w| w.id == id)
    }

    /// When the ADM-06 bound of a request counts from: its arrival, or for
    /// a waiter the moment it became its turn (now, if it just did).
    pub(super) fn line_arrival(
        &self,
        req: &WorkRequest,
        seat: Option<usize>,
        now: Moment,
    ) -> Moment {
        match seat {
            Some(i) => self.line[i].ready_since.unwrap_or(now),
            None => req.arrived_at,
        }
    }

    /// One upstream's line now.
    pub fn line_status(&self, upstream: usize, now: Moment) -> LineStatus {
        let mut status = LineStatus::default();
        for w in self.line.iter().filter(|w| w.upstream == upstream) {
            status.waiting += 1;
            let waited = now.since(w.joined);
            status.oldest_wait = Some(status.oldest_wait.map_or(waited, |o| o.max(waited)));
        }
        status
    }

    /// Settle a request's place in the line after its admission check:
    /// `Ok` with the charges when it may take its resources now, else the
    /// decision to answer (never `Admitted`; boxing it would allocate on
    /// every refusal of the hot path).
    #[allow(clippy::result_large_err)]
    // Long: the wait line's one decision table (admit, wait, refuse, leave); its arms share the seat and the charges.
    pub(super) fn line_turn(
        &mut self,
        req: &WorkRequest,
        seat: Option<usize>,
        evaluated: Result<Vec<Charge>, Blocked>,
        claim: Option<Claim>,
        now: Moment,
    ) -> Result<Vec<Charge>, Decision> {
        let up = req.upstream.0;
        let deps: Vec<usize> = self.upstreams[up].deps.iter().map(|d| d.res).collect();
        let behind = self.ahead_of(up, seat, claim, now).first;
        let busy = match (evaluated, behind) {
            (Ok(charges), None) => {
                if let Some(i) = seat {
                    self.leave_at(i);
                }
                return Ok(charges);
            }
            (Ok(_), Some(res)) => self.line_busy(res),
            // A borrower at its max_running waits, as for a reserved resource.
            (Err(Blocked::Refused(r)), _)
                if matches!(
                    r.code,
                    RefusalCode::ResourceBusy | RefusalCode::BorrowerLimit
                ) =>
            {
                r
            }
            (Err(Blocked::Wait { until, resources }), _) => {
                let until = match seat {
                    Some(i) if now >= self.line[i].until => {
                        // Its deadline came while the post-job sample was
                        // still awaited: answered, as every waiter is.
                        let waited = now.since(self.line[i].joined).as_secs_f64();
                        self.leave_at(i);
                        return Err(Decision::Refused(Refusal::new(
                            RefusalCode::ResourceBusy,
                            format!(
                                "the resource's capacity after the last job is not measured yet (waited {waited:.1} s in line, its limit); retry in 2 s"
                            ),
                        )));
                    }
                    Some(i) => {
                        let w = &mut self.line[i];
                        if behind.is_none() {
                            w.ready_since.get_or_insert(now);
                        }
                        until.min(w.until)
                    }
                    None => until,
                };
                return Err(Decision::Wait { until, resources });
            }
            // RES-20: only the resident observation's age stood in the way.
            // The shell observes once more and asks again; a waiter keeps
            // its place meanwhile (issue 30), and leaves only if the shell
            // gives up ([`Engine::leave_line`]).
            (Err(Blocked::Reobserve(r)), _) => return Err(Decision::Reobserve(r)),
            (Err(other), _) => {
                if let Some(i) = seat {
                    self.leave_at(i);
                }
                return Err(other.into());
            }
        };
        // Only a reserved resource stands in the way. The owner comes first:
        // anything else that would refuse answers now.
        if let Some(hard) = self.hard_refusal(up, now) {
            if let Some(i) = seat {
                self.leave_at(i);
            }
            return Err(Decision::Refused(hard));
        }
        let queue = match (req.wait, self.upstreams[up].spec.queue) {
            (Some(wait), q) => Some(QueueSpec {
                max_waiting: q.map_or(PER_REQUEST_MAX_WAITING, |q| q.max_waiting),
                max_wait: wait,
            }),
            (None, q) => q,
        };
        let Some(queue) = queue else {
            if let Some(i) = seat {
                self.leave_at(i);
            }
            return Err(Decision::Refused(busy));
        };
        match seat {
            Some(i) => {
                let w = &mut self.line[i];
                w.ready_since = None;
                if now >= w.until {
                    let waited = now.since(w.joined).as_secs_f64();
                    self.leave_at(i);
                    let mut busy = busy;
                    busy.reason
                        .push_str(&format!(" (waited {waited:.1} s in line, its limit)"));
                    return Err(Decision::Refused(busy));
                }
                Err(Decision::Wait {
                    until: w.until,
                    resources: Vec::new(),
                })
            }
            None => {
                if let Err(why) = self.line_room(up, queue) {
                    let mut busy = busy;
                    busy.reason.push_str(&why);
                    return Err(Decision::Refused(busy));
                }
                if let Some(limit) = self.waiting_limit(claim) {
                    return Err(Decision::Refused(limit));
                }
                let until = now.after(queue.max_wait);
                self.adjust_counts(claim, |n| n.waiting += 1);
                self.line.push(Waiter {
                    id: req.id,
                    upstream: up,
                    deps,
                    joined: now,
                    until,
                    ready_since: None,
                    borrower: claim,
                });
                Err(Decision::Wait {
                    until,
                    resources: Vec::new(),
                })
            }
        }
    }

    /// The waiters ahead of a request of upstream `up` (at `seat`, or a
    /// newcomer of borrower `claim` at the back) that need a resource it
    /// needs: it may take its resources only when there are none. Waiters
    /// gone past their deadline by [`LINE_EXPIRY_GRACE`] no longer count.
    /// With borrowers, "ahead" is the turn order, and a waiter whose
    /// borrower runs its `max_running` jobs stands aside until one ends.
    pub(super) fn ahead_of(
        &self,
        up: usize,
        seat: Option<usize>,
        claim: Option<Claim>,
        now: Moment,
    ) -> Ahead {
        let deps = &self.upstreams[up].deps;
        let mut ahead = Ahead::default();
        if self.borrowers.is_none() {
            let end = seat.unwrap_or(self.line.len());
            for w in &self.line[..end] {
                if now >= w.until.after(LINE_EXPIRY_GRACE) {
                    continue;
                }
                if let Some(d) = deps.iter().find(|d| w.deps.contains(&d.res)) {
                    ahead.first.get_or_insert(d.res);
                    ahead.count += 1;
                }
            }
            return ahead;
        }
        if self.line.is_empty() {
            // Nothing to order: no per-borrower work on the admission path.
            return ahead;
        }
        let (turns, newcomer) = self.turns(claim, now);
        let mine = seat.map_or(newcomer, |i| turns[i]);
        let mut first: Option<(Turn, usize)> = None;
        for (j, w) in self.line.iter().enumerate() {
            if Some(j) == seat || turns[j] >= mine || now >= w.until.after(LINE_EXPIRY_GRACE) {
                continue;
            }
            if w.borrower.is_some_and(|c| self.at_max_running(c.slot)) {
                continue;
            }
            if let Some(d) = deps.iter().find(|d| w.deps.contains(&d.res)) {
                if first.is_none_or(|(t, _)| turns[j] < t) {
                    first = Some((turns[j], d.res));
                }
                ahead.count += 1;
            }
        }
        ahead.first = first.map(|(_, res)| res);
        ahead
    }

    /// Each waiter's turn, and the turn a newcomer of `claim` would get.
    ///
    /// Start-time fair queueing, one virtual clock per class: a borrower's
    /// k-th waiter of a class (in arrival order) starts its turn at
    /// `max(the class's virtual time, the borrower's next start) + k * cost`,
    /// `cost` one `TURN` divided by its share.
    /// Admission moves the borrower's next start one cost on and the class's
    /// clock to the admitted turn's start, so a borrower's backlog does not
    /// push another's first waiter back, and an idle borrower saves no credit.
    fn turns(&self, claim: Option<Claim>, now: Moment) -> (Vec<Turn>, Turn) {
        let Some(b) = &self.borrowers else {
            let n = self.line.len();
            return ((0..n).map(|i| (0, 0, i)).collect(), (0, 0, n));
        };
        let mut counts = vec![0u64; b.state.len() * 2];
        let mut turn = |c: Option<Claim>, overdue: bool, i: usize| -> Turn {
            let Some(c) = c else {
                // A waiter from before borrowers were switched on.
                return (1, b.vtime[0], i);
            };
            let k = c.class.index();
            let Some(s) = b.state.get(c.slot) else {
                return (1, b.vtime[0], i);
            };
            let n = &mut counts[c.slot * 2 + k];
            let start = b.vtime[k]
                .max(s.finish[k])
                .saturating_add(n.saturating_mul(s.cost()));
            *n += 1;
            let rank = match (c.class, overdue) {
                (Priority::Batch, true) => 0,
                (Priority::Interactive, _) => 1,
                (Priority::Batch, false) => 2,
            };
            (rank, start, i)
        };
        let turns: Vec<Turn> = self
            .line
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let overdue = now >= w.joined.after(b.batch_max_wait);
                turn(w.borrower, overdue, i)
            })
            .collect();
        let newcomer = match claim {
            Some(c) => turn(Some(c), false, self.line.len()),
            None => (u8::MAX, u64::MAX, self.line.len()),
        };
        (turns, newcomer)
    }

    /// The `resource_busy` refusal of a request that found resource `res`
    /// free but needed by a request that came earlier and waits.
    pub(super) fn line_busy(&self, res: usize) -> Refusal {
        let name = &self.resources[res].spec.name;
        Refusal::new(
            RefusalCode::ResourceBusy,
            format!("requests that came earlier wait in line for resource {name}; retry in 2 s"),
        )
        .on_resource(name)
    }

    /// Whether a new request of upstream `up` finds room in a line of
    /// `queue`: `Err` with what to add to its `resource_busy` reason if not.
    pub(super) fn line_room(&self, up: usize, queue: QueueSpec) -> Result<(), String> {
        let waiting = self.line.iter().filter(|w| w.upstream == up).count();
        if waiting >= queue.max_waiting as usize {
            return Err(format!(" (the wait line is full: {waiting} requests wait)"));
        }
        if queue.max_wait.is_zero() {
            return Err(String::new());
        }
        Ok(())
    }

    /// A refusal other than a reserved resource that applies to upstream
    /// `up` now: the owner's and the machine's reasons, which a waiter
    /// never waits out.
    fn hard_refusal(&self, up: usize, now: Moment) -> Option<Refusal> {
        if let Some(r) = self.presence_refusal(up, now) {
            return Some(r);
        }
        self.upstreams[up].deps.iter().find_map(|d| {
            let r = &self.resources[d.res];
            r.disabled_refusal()
                .or_else(|| r.pressure_refusal())
                .or_else(|| self.heat_refusal(d.res, now))
        })
    }

    pub(super) fn leave_at(&mut self, i: usize) {
        let w = self.line.remove(i);
        self.count_left_line(w.borrower);
        // Those behind may move up.
        self.wake_waiters();
    }

    /// Wake the shell's waiters to ask again: the line moved or an input
    /// that may refuse them changed.
    pub(super) fn wake_waiters(&mut self) {
        if !self.line.is_empty() {
            self.effects.push(Effect::WakeWaiters);
        }
    }
}
