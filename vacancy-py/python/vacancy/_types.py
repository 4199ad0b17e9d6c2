"""Dict shapes the engine takes and gives, for type checkers."""

from __future__ import annotations

import typing


# A Union of one-value Literals (not one Literal) so that stubtest sees a Union at run time.
RefusalCode: typing.TypeAlias = typing.Union[  # noqa: UP007
    typing.Literal["resource_busy"],
    typing.Literal["owner_present"],
    typing.Literal["pressure"],
    typing.Literal["insufficient_memory"],
    typing.Literal["lending_paused"],
    typing.Literal["resource_disabled"],
    typing.Literal["capacity_unknown"],
    typing.Literal["invalid_request"],
    typing.Literal["invalid_submission"],
    typing.Literal["unsupported_request"],
    typing.Literal["body_too_large"],
    typing.Literal["route_forbidden"],
    typing.Literal["route_not_supported"],
    typing.Literal["upstream_unreachable"],
    typing.Literal["ledger_unavailable"],
    typing.Literal["outside_lending_hours"],
    typing.Literal["on_battery"],
    typing.Literal["gpu_too_hot"],
    typing.Literal["gpu_power_limit"],
    typing.Literal["unknown_borrower"],
    typing.Literal["quota_exhausted"],
    typing.Literal["borrower_limit"],
]
"""Every refusal code the engine and the daemon answer with (``Refused.code``)."""

ControlCode: typing.TypeAlias = typing.Union[  # noqa: UP007
    typing.Literal["unauthorized"],
    typing.Literal["forbidden"],
    typing.Literal["missing_intent"],
    typing.Literal["invalid_request"],
    typing.Literal["not_found"],
    typing.Literal["conflict"],
    typing.Literal["ledger_unavailable"],
    typing.Literal["internal"],
]
"""The control API's error codes: ``Refused.code`` from a ``vacancy.Client`` call."""


class ObservedModel(typing.TypedDict, total=False):
    """One loaded model in ``Engine.observe``; a bare name means ready and proven."""

    name: typing.Required[str]
    """The model's name exactly as requests name it."""
    ready: bool
    """Loaded and ready to serve (default ``True``)."""
    proven: bool
    """The upstream's own evidence proves reuse, e.g. an idle slot (default ``True``)."""
    reason: str | None
    """Why reuse is not proven, shown in refusals (with ``proven=False``, or
    for requests of other kinds with ``kinds``)."""
    kinds: list[str]
    """Proven only for requests of these kinds (``Engine.admit(kind=...)``),
    e.g. the Ollama request kinds known to reuse the loaded context (RES-05)."""


class Lesson(typing.TypedDict):
    """What ``Engine.take_lesson`` returns: a finished request of a known kind (RES-07)."""

    model: str
    """The model identity (canonical model) of the finished request."""
    kind: str
    """Its kind, as given to ``Engine.admit(kind=...)``."""
    finished_at: float
    """When it was released, in the engine's seconds."""


class Charge(typing.TypedDict):
    """What a reservation charged on one resource."""

    resource: str
    required_mib: int
    """MiB required above the reserve (0 for a dependency no requirement names)."""
    free_mib: int
    """Free MiB in the sample admission decided on."""


class BreakerSnapshot(typing.TypedDict):
    """A crash-loop breaker's state: the shape of a slot's ``metadata["breaker"]``."""

    state: typing.Literal["backoff", "parked", "half-open"]
    failures: int
    retry_after_s: int
    """Seconds until the next start is allowed: the cooldown left; in half-open
    0 while the trial is free, else the trial's budget left."""
    trial_in_flight: bool
    """A half-open trial was taken by ``check()`` and not yet recorded, given
    back (``give_back_trial``) or expired (after ``trial_budget_s``)."""


# ---- Engine.status() -----------------------------------------------------------


class OwnerVeto(typing.TypedDict):
    """Whether the owner's presence refuses host-scoped work now, and why."""

    active: bool
    reason: str | None
    exempt_upstreams: list[str]


class HeatReading(typing.TypedDict):
    """A GPU's temperature, power draw and fan with its last sample (issue 35)."""

    temperature_c: int | None
    power_w: int | None
    fan_percent: int | None


class NextChange(typing.TypedDict):
    """The lending hours' next opening or closing."""

    change: typing.Literal["opens", "closes"]
    at: str
    in_s: int


class TermStatus(typing.TypedDict):
    """One of the owner's terms in force beyond presence (issue 35)."""

    term: typing.Literal["lending_hours", "battery", "heat"]
    resource: str | None
    in_force: str
    state: str
    now: str
    refusing: bool
    code: RefusalCode | None
    reason: str | None
    next_change: NextChange | None


class ResourceStatus(typing.TypedDict):
    """One resource in ``Engine.status()["resources"]``."""

    name: str
    kind: typing.Literal["gpu", "memory", "cpu"]
    free_mib: int | None
    total_mib: int | None
    busy_pct: int | None
    reserve_mib: int
    sample_age_ms: int | None
    """Milliseconds since the last good sample (``None``: never sampled)."""
    capacity_unknown: str | None
    """Why capacity is unknown (a failed or stale sample), else ``None``."""
    awaiting_fresh_sample: bool
    enabled: bool
    pressure: str
    reserved_by: str | None
    """The entry ID holding it."""
    heat: HeatReading | None
    """A GPU with heat or power limits: its last reading (``None`` without limits)."""


class VacancyStatus(typing.TypedDict):
    """Whether an upstream would admit work now."""

    admitting: bool
    """Whether a new request would be admitted now."""
    queueing: int | None
    """When a new request would wait in the upstream's wait line: how many
    requests that came earlier wait ahead of it; else ``None``."""
    code: RefusalCode | None
    reason: str | None


class LineStatus(typing.TypedDict):
    """An upstream's wait line."""

    waiting: int
    oldest_wait_s: float | None


class UpstreamStatus(typing.TypedDict):
    """One upstream in ``Engine.status()["upstreams"]``."""

    name: str
    owner_scope: typing.Literal["host", "resource"]
    resources: list[str]
    vacancy: VacancyStatus
    line: LineStatus


class WorkStatus(typing.TypedDict):
    """One work entry in ``Engine.status()["work"]``."""

    id: str
    upstream: str
    model: str | None
    resources: list[str]
    age_s: int
    completion: typing.Literal["response_end", "tracked", "held_on_close"]
    phase: typing.Literal["forwarding", "tracking", "verifying", "held"]
    held_reason: str | None
    upstream_ref: str | None
    borrower: str | None


class ReclaimStatus(typing.TypedDict):
    """One reclaim in progress in ``Engine.status()["reclaims"]``."""

    id: str
    upstream: str
    trigger: str
    mode: str
    stage: str
    deadline_in_ms: int | None
    holds: bool


class EngineStatus(typing.TypedDict):
    """What ``Engine.status()`` returns: the engine part of the daemon's ``GET /status``."""

    lending: bool
    owner: typing.Literal["present", "away", "unknown"]
    owner_veto: OwnerVeto
    resources: list[ResourceStatus]
    upstreams: list[UpstreamStatus]
    work: list[WorkStatus]
    reclaims: list[ReclaimStatus]
    terms: list[TermStatus]
    """The owner's terms in force beyond presence and which refuse now."""


class BudgetStatus(typing.TypedDict):
    """One budget of a borrower in ``Engine.status()["borrowers"]``."""

    kind: typing.Literal["gpu", "memory", "cpu"]
    period: typing.Literal["day", "week"]
    allowed_s: int
    used_s: float
    """Used in the current UTC period so far, running jobs included."""
    left_s: float
    resets_unix_s: int
    resets: str
    """The reset in words: ``2026-12-04 00:00 UTC``."""


class BorrowerTotals(typing.TypedDict):
    """What a borrower used since the engine started."""

    jobs: int
    reserved_s: dict[typing.Literal["gpu", "memory", "cpu"], float]
    refusals: dict[str, int]
    waited_s: float
    held: int


class BorrowerStatus(typing.TypedDict):
    """One borrower in ``Engine.status()["borrowers"]``: the key is there
    only while the engine has a borrower table (``Engine(config, borrowers=...)``)."""

    name: str
    priority: typing.Literal["interactive", "batch"]
    share: int
    running: int
    waiting: int
    held: int
    max_running: int | None
    max_waiting: int | None
    totals: BorrowerTotals
    budgets: list[BudgetStatus]


# ---- Engine.reclaim_step() / pressure_sample() -------------------------------------


class ReclaimStarted(typing.TypedDict):
    """A reclaim began. ``deadline`` is absolute: seconds on the engine's own
    timeline (what ``Engine.now()`` reads), not a duration; ``None`` when it
    waits without one."""

    kind: typing.Literal["started"]
    id: str
    upstream: str
    trigger: str
    mode: str
    deadline: float | None
    entries: list[str]


class ReclaimAct(typing.TypedDict):
    """Do this now: cancel ``cancel``, then unload when ``unload``; then
    ``Engine.reclaim_done(id)``. ``held`` lists ``[id, reason]`` pairs that keep
    their reservations; ``cancel_held`` held entries to cancel at the upstream too."""

    kind: typing.Literal["act"]
    id: str
    upstream: str
    cancel: list[str]
    unload: bool
    held: list[list[str]]
    cancel_held: list[str]


class ReclaimEnded(typing.TypedDict):
    """A reclaim stood down (its trigger cleared) or finished; ``elapsed`` in seconds."""

    kind: typing.Literal["stood_down", "finished"]
    id: str
    upstream: str
    elapsed: float


ReclaimCommand: typing.TypeAlias = ReclaimStarted | ReclaimAct | ReclaimEnded
"""One command of ``Engine.reclaim_step()``; tell them apart by ``kind``."""


class PressureTriggerInfo(typing.TypedDict):
    """A pressure edge that reclaims the GPU's work at the next ``reclaim_step``."""

    kind: typing.Literal["engaged", "uncalibrated", "gap"]
    why: str


class PressureUpdate(typing.TypedDict):
    """What ``Engine.pressure_sample`` and ``pressure_miss`` return."""

    resource: str
    reading: typing.Literal["quiet", "rising", "engaged", "releasing", "uncalibrated", "unavailable"]
    refuses: str | None
    cleared: bool
    trigger: PressureTriggerInfo | None
