"""hal0's slot lifecycle, from Rust (``vacancy::slots``), in Python idiom.

States and transitions (SLOT), the typed ``slot.*`` errors (SERR), the
crash-loop breaker (BRK), eviction (EVICT), the ``state.json`` record (PERS),
the slot-write guards and ``autoload`` (SLOTCFG), the lifecycle budget,
launch-argv composition with provenance, self-managed providers (PROV) and the
output-sanity gate (GATE). Rule IDs are those of hal0's rule catalog.

Nothing here reads a clock or starts a process: time is an argument or the
breaker's ``clock``, and callers own the side effects. See ``docs/python.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import typing
import collections.abc as _abc

from vacancy import _vacancy as _v
from vacancy._errors import (
    IllegalSlotTransition,
    NpuExclusivityViolation,
    SeamTimeout,
    SlotConfigError,
    SlotCrashLooping,
    SlotError,
    SlotHealthFailed,
    SlotIllegalTransition,
    SlotLlamaEnvDenied,
    SlotNotFound,
    SlotNotReady,
    SlotOutputSanityFailed,
    SlotPinned,
    SlotProfileMissing,
    SlotRemovedKeyDenied,
    SlotSpawnFailed,
    SlotTerminateTimeout,
    SlotTuningKeyDenied,
    SlotUnconverted,
    StateRecordCorrupt,
    StateRecordError,
    StateRecordIOError,
)
from vacancy._types import BreakerSnapshot
from vacancy._vacancy import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    BUDGET_EVICTION_UNLOADS,
    DEFAULT_PRIORITY,
    LIFECYCLE_OVERHEAD,
    LRU_RETIRED_EVENT,
    MAX_PRELOAD_VICTIMS,
    PARK_BASE_S,
    PARK_CAP_S,
    DEFAULT_TRIAL_BUDGET_S,
    PARK_THRESHOLD,
    STATE_FILE_NAME,
    CrashLoopBreaker,
    LruRetirementWarnings,
    autoload_for_create,
    bound_model,
    canonical_flag,
    clamp_priority,
    cooldown_s,
    guard_slot_write_payload,
    is_activated,
    is_gated,
    llama_device_arg,
    llama_env_keys,
    priority_from_value,
    provider_requires_model,
    reject_retired_lru,
    removed_keys,
    selection_rank,
    tuning_keys,
    validate_priority,
)

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "BUDGET_EVICTION_UNLOADS",
    "DEFAULT_PINNED_ANCHORS",
    "DEFAULT_PRIORITY",
    "DISPATCHABLE_STATES",
    "GATE_CHAT_PROMPT",
    "GATE_EXPECTED",
    "GATE_PROMPT",
    "LEGAL_TRANSITIONS",
    "LIFECYCLE_OVERHEAD",
    "LRU_RETIRED_EVENT",
    "MAX_PRELOAD_VICTIMS",
    "PARK_BASE_S",
    "PARK_CAP_S",
    "DEFAULT_TRIAL_BUDGET_S",
    "PARK_THRESHOLD",
    "SELF_MANAGED_PROVIDERS",
    "STATE_FILE_NAME",
    "Autoload",
    "BreakerSnapshot",
    "ConversionBlocked",
    "CrashLoopBreaker",
    "EvictionCandidate",
    "EvictionPlan",
    "GateOptions",
    "GateOutcome",
    "IllegalSlotTransition",
    "LaunchFlag",
    "LruRetirementWarnings",
    "NpuExclusivityViolation",
    "ResolvedLaunch",
    "SeamTimeout",
    "SlotConfigError",
    "SlotCrashLooping",
    "SlotError",
    "SlotHealthFailed",
    "SlotIllegalTransition",
    "SlotLlamaEnvDenied",
    "SlotNotFound",
    "SlotNotReady",
    "SlotOutputSanityFailed",
    "SlotPinned",
    "SlotPlacement",
    "SlotProfileMissing",
    "SlotRemovedKeyDenied",
    "SlotSpawnFailed",
    "SlotState",
    "SlotStateRecord",
    "SlotTerminateTimeout",
    "SlotTuningKeyDenied",
    "SlotUnconverted",
    "StateRecordCorrupt",
    "StateRecordError",
    "StateRecordIOError",
    "autoload_for_create",
    "bound_model",
    "canonical_flag",
    "check_npu_exclusivity",
    "check_output_sanity",
    "check_pinned",
    "check_transition",
    "check_unconverted",
    "clamp_priority",
    "compose_launch_argv",
    "conversion_blocked",
    "cooldown_s",
    "eviction_order",
    "guard_slot_write_payload",
    "is_activated",
    "is_eviction_candidate",
    "is_gated",
    "is_pinned",
    "llama_device_arg",
    "llama_env_keys",
    "parse_launch_args",
    "plan_preload_eviction",
    "priority_from_value",
    "provider_requires_model",
    "read_state_record",
    "reject_retired_lru",
    "removed_keys",
    "resolve_autoload",
    "selection_rank",
    "slot_lifecycle_budget",
    "sort_by_selection",
    "state_after_exit",
    "state_after_health",
    "state_record_path",
    "tuning_keys",
    "validate_priority",
    "write_state_record",
]

# ---- states (SLOT) ----------------------------------------------------------


class SlotState(enum.StrEnum):
    """The nine slot states; each is its lower-case string (``SlotState.READY == "ready"``)."""

    OFFLINE = "offline"
    PULLING = "pulling"
    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    SERVING = "serving"
    IDLE = "idle"
    UNLOADING = "unloading"
    ERROR = "error"


LEGAL_TRANSITIONS: _abc.Mapping[SlotState, frozenset[SlotState]] = {
    SlotState(k): frozenset(SlotState(s) for s in v) for k, v in _v.SLOT_TRANSITIONS.items()
}
"""Every state's legal next states (SLOT-01)."""

DISPATCHABLE_STATES: frozenset[SlotState] = frozenset(SlotState(s) for s in _v.SLOT_DISPATCHABLE)
"""The states a request may be dispatched to: ready, serving, idle."""


def check_transition(from_state: str, to_state: str) -> None:
    """Raise :class:`IllegalSlotTransition` (409) unless the move is legal (SLOT-01).

    A string that names no state raises ``ValueError``.
    """
    _v.check_transition(from_state, to_state)


def state_after_health(
    outcome: typing.Literal["ready", "empty_models", "not_ready", "unresolved"],
) -> SlotState:
    """The state a health-probe outcome leads to."""
    return SlotState(_v.state_after_health(outcome))


def state_after_exit(exit: typing.Literal["clean_stop", "crashed"]) -> SlotState:
    """The state a unit exit leads to: a clean stop is offline, a crash error."""
    return SlotState(_v.state_after_exit(exit))


_T = typing.TypeVar("_T")


def sort_by_selection(candidates: _abc.Iterable[_T], state_of: _abc.Callable[[_T], str]) -> list[_T]:
    """``candidates`` sorted by :func:`selection_rank` of their state, stable (SLOT-15)."""
    return sorted(candidates, key=lambda c: selection_rank(state_of(c)))


# ---- breaker (BRK) ---------------------------------------------------------


# ---- eviction (EVICT) --------------------------------------------------------

DEFAULT_PINNED_ANCHORS: tuple[str, ...] = tuple(_v.DEFAULT_PINNED_ANCHORS)
"""Slots pinned unless they say otherwise: ``("agent",)``."""


@dataclasses.dataclass(frozen=True)
class EvictionCandidate:
    """A resident slot as eviction sees it. Any object (or mapping) with these
    attribute names may be passed instead."""

    name: str
    state: str
    priority: int = DEFAULT_PRIORITY
    pinned: bool | None = None
    in_flight: int = 0
    last_used_s: float = 0.0
    resident_mib: int = 0


_CANDIDATE_FIELDS = tuple(f.name for f in dataclasses.fields(EvictionCandidate))


def _as_dict(obj: object, fields: _abc.Sequence[str]) -> dict[str, typing.Any]:
    if isinstance(obj, _abc.Mapping):
        return {k: obj[k] for k in fields if k in obj}
    return {k: getattr(obj, k) for k in fields if hasattr(obj, k)}


def _candidates(slots: _abc.Iterable[object]) -> tuple[list[typing.Any], list[dict[str, typing.Any]]]:
    items = list(slots)
    return items, [_as_dict(s, _CANDIDATE_FIELDS) for s in items]


def is_pinned(
    name: str, pinned: bool | None = None, anchors: _abc.Iterable[str] = DEFAULT_PINNED_ANCHORS
) -> bool:
    """A slot's own ``pinned`` if set, else whether it is one of ``anchors``."""
    return _v.is_pinned(name, pinned, list(anchors))


def is_eviction_candidate(slot: object, anchors: _abc.Iterable[str] = DEFAULT_PINNED_ANCHORS) -> bool:
    """Ready or idle, nothing in flight, not pinned (EVICT)."""
    return _v.is_eviction_candidate(_as_dict(slot, _CANDIDATE_FIELDS), list(anchors))


def eviction_order(
    slots: _abc.Iterable[_T], anchors: _abc.Iterable[str] = DEFAULT_PINNED_ANCHORS
) -> list[_T]:
    """The eviction candidates among ``slots`` (the same objects), first victim
    first: lowest priority, then least recently used (EVICT)."""
    items, dicts = _candidates(slots)
    return [items[i] for i in _v.eviction_order(dicts, list(anchors))]


@dataclasses.dataclass(frozen=True)
class EvictionPlan:
    """The pre-load planner's answer: whom to evict, and whether the load then fits."""

    victims: list[str]
    freed_mib: int
    fits: bool


def plan_preload_eviction(
    slots: _abc.Iterable[object],
    need_mib: int,
    *,
    free_mib: int,
    headroom_mib: int = 0,
    max_victims: int = MAX_PRELOAD_VICTIMS,
    anchors: _abc.Iterable[str] = DEFAULT_PINNED_ANCHORS,
) -> EvictionPlan:
    """Victims in eviction order until ``free_mib`` covers ``need_mib + headroom_mib``;
    at most ``max_victims``. No victims and ``fits=False`` when it cannot fit."""
    _, dicts = _candidates(slots)
    victims, freed, fits = _v.plan_preload_eviction(
        dicts, list(anchors), need_mib, headroom_mib, free_mib, max_victims
    )
    return EvictionPlan(victims=victims, freed_mib=freed, fits=fits)


def check_pinned(
    name: str,
    pinned: bool | None = None,
    *,
    action: typing.Literal["unload", "delete"] = "unload",
    force: bool = False,
    anchors: _abc.Iterable[str] = DEFAULT_PINNED_ANCHORS,
) -> None:
    """Raise :class:`SlotPinned` (409) when a pinned slot is unloaded or deleted
    without ``force`` (SERR-11)."""
    _v.check_pinned(name, pinned, list(anchors), action, force)


@dataclasses.dataclass(frozen=True)
class SlotPlacement:
    """Where a slot runs, for the NPU check. ``type`` is the slot type (``llm``, ...)."""

    name: str
    device: str = ""
    type: str = ""
    model_default: str = ""


_PLACEMENT_FIELDS = ("name", "device", "type", "model_default")


def check_npu_exclusivity(target: object, others: _abc.Iterable[object]) -> None:
    """Raise :class:`NpuExclusivityViolation` (409) if ``target`` would be a second
    ``device="npu"``, ``type="llm"`` slot with a bound model (SERR-10)."""
    _v.check_npu_exclusivity(
        _as_dict(target, _PLACEMENT_FIELDS), [_as_dict(o, _PLACEMENT_FIELDS) for o in others]
    )


# ---- records (PERS) ------------------------------------------------------------


@dataclasses.dataclass
class SlotStateRecord:
    """A slot's persisted ``state.json``."""

    name: str
    state: SlotState
    updated_at: float
    model_id: str | None = None
    port: int | None = None
    message: str | None = None
    extra: dict[str, typing.Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = SlotState(self.state)

    def to_json(self) -> dict[str, typing.Any]:
        """The record as the JSON object written to ``state.json``."""
        return {
            "name": self.name,
            "state": str(self.state),
            "model_id": self.model_id,
            "port": self.port,
            "updated_at": self.updated_at,
            "message": self.message,
            "extra": self.extra,
        }


def state_record_path(slot_dir: str | os.PathLike[str]) -> str:
    """``slot_dir/state.json``."""
    return os.fspath(_v.state_record_path(slot_dir))


def write_state_record(path: str | os.PathLike[str], record: SlotStateRecord) -> None:
    """Write ``record`` atomically (temp file, fsync, rename, fsync of the
    directory) with the GIL released. Raises :class:`StateRecordIOError`."""
    _v.write_state_record(path, record.to_json())


def read_state_record(path: str | os.PathLike[str]) -> SlotStateRecord | None:
    """The record at ``path``, or ``None`` when there is none. A torn or non-JSON
    file raises :class:`StateRecordCorrupt` naming the file."""
    d = _v.read_state_record(path)
    if d is None:
        return None
    return SlotStateRecord(**d)


# ---- slot-write guards, activation, autoload (SLOTCFG) ---------------------------


@dataclasses.dataclass(frozen=True)
class ConversionBlocked:
    """Why a slot file cannot be converted, and what to do."""

    reason: str
    fix: str
    keys: list[str]


def conversion_blocked(slot_file: _abc.Mapping[str, typing.Any]) -> ConversionBlocked | None:
    """The block on converting a slot file that still carries tuning keys, if any."""
    r = _v.conversion_blocked(dict(slot_file))
    return None if r is None else ConversionBlocked(*r)


def check_unconverted(
    slot: str, slot_file: _abc.Mapping[str, typing.Any], file: str | None = None
) -> None:
    """Raise :class:`SlotUnconverted` (400) if the slot file carries tuning keys."""
    _v.check_unconverted(slot, file, dict(slot_file))


@dataclasses.dataclass(frozen=True)
class Autoload:
    """A slot's resolved ``autoload``; ``migrated`` when it was derived, not set."""

    autoload: bool
    migrated: bool


def resolve_autoload(slot_file: _abc.Mapping[str, typing.Any]) -> Autoload:
    """``autoload`` as set, else whether the slot is activated (migrated).
    A non-bool value raises :class:`SlotConfigError`."""
    return Autoload(*_v.resolve_autoload(dict(slot_file)))


# ---- budget ----------------------------------------------------------------------


def slot_lifecycle_budget(
    op: typing.Literal["load", "unload", "restart", "swap"],
    *,
    health_poll_s: float,
    output_sanity_cpu_s: float,
    unload_s: float,
) -> float:
    """The server's worst-case seconds for a lifecycle operation, overhead
    included: clients derive their read timeouts from it (SLOTCFG-19..21)."""
    return _v.slot_lifecycle_budget(op, health_poll_s, output_sanity_cpu_s, unload_s)


# ---- launch ----------------------------------------------------------------------


class LaunchFlag(typing.NamedTuple):
    """One flag and the values after it."""

    flag: str
    values: tuple[str, ...] = ()


def parse_launch_args(tokens: _abc.Iterable[str]) -> list[LaunchFlag]:
    """Argv tokens as flags with their values (``--x=v`` splits)."""
    return [LaunchFlag(f, tuple(v)) for f, v in _v.parse_launch_args(list(tokens))]


@dataclasses.dataclass(frozen=True)
class ResolvedLaunch:
    """A composed argv and, per surviving flag, the layer that set it."""

    argv: list[str] | None
    provenance: dict[str, typing.Literal["base", "model", "profile", "slot"]]

    def to_json(self) -> dict[str, typing.Any]:
        """``{"argv": ..., "provenance": {flag: layer}}``."""
        return {"argv": self.argv, "provenance": dict(self.provenance)}


def compose_launch_argv(
    program: str | None,
    layers: _abc.Mapping[str, _abc.Iterable[str | LaunchFlag]],
) -> ResolvedLaunch:
    """Compose base < model < profile < slot, deduplicated last-wins by canonical
    flag (``-c`` is ``--ctx-size``), with the layer of each surviving flag
    (SLOTCFG-22..29). A layer (``base``, ``model``, ``profile`` or ``slot``) is
    argv tokens or :class:`LaunchFlag` s."""
    raw: list[tuple[str, list[tuple[str, list[str]]]]] = []
    for layer, items in layers.items():
        seq = list(items)
        if all(isinstance(i, str) for i in seq):
            flags = _v.parse_launch_args(typing.cast(list[str], seq))
        elif all(isinstance(i, LaunchFlag) for i in seq):
            flags = [(f.flag, list(f.values)) for f in typing.cast(list[LaunchFlag], seq)]
        else:
            raise TypeError(f"layer {layer!r}: give argv tokens (str) or LaunchFlags, not a mix")
        raw.append((layer, flags))
    argv, provenance = _v.compose_launch_argv(program, raw)
    return ResolvedLaunch(
        argv=argv, provenance={flag: typing.cast(typing.Any, layer) for flag, layer in provenance}
    )


# ---- providers (PROV) --------------------------------------------------------------

SELF_MANAGED_PROVIDERS: frozenset[str] = frozenset(_v.SELF_MANAGED_PROVIDERS)
"""Runners that serve a baked-in model, so a slot of theirs needs none."""

# ---- output-sanity gate (GATE) -------------------------------------------------------

GATE_PROMPT: str = _v.GATE_PROMPT
GATE_CHAT_PROMPT: str = _v.GATE_CHAT_PROMPT
GATE_EXPECTED: str = _v.GATE_EXPECTED


@dataclasses.dataclass(frozen=True)
class GateOptions:
    """The gate's budget and what it sends. ``for_device("cpu")`` gives the CPU
    lane's six-times-wider wall clock (GATE-10)."""

    lane: typing.Literal["accelerated", "cpu"] = "accelerated"
    completion_tokens: int = 16
    completion_timeout_s: float = 30.0
    chat_tokens: int = 1024
    chat_timeout_s: float = 120.0
    model: str | None = None
    authorization: str | None = None

    @classmethod
    def accelerated(cls) -> GateOptions:
        """The accelerated lane: 30 s for the completion, 120 s for the chat retry."""
        ct, cs, ht, hs = _v.gate_defaults("accelerated")
        return cls("accelerated", ct, cs, ht, hs)

    @classmethod
    def cpu(cls) -> GateOptions:
        """The CPU lane: the same tokens, six times the wall clock."""
        ct, cs, ht, hs = _v.gate_defaults("cpu")
        return cls("cpu", ct, cs, ht, hs)

    @classmethod
    def for_device(cls, device: str) -> GateOptions:
        """The lane of a slot's ``device`` value (``"cpu"`` in any case is the CPU lane)."""
        return cls.cpu() if device.strip().lower() == "cpu" else cls.accelerated()

    @property
    def worst_case_s(self) -> float:
        """The longest the gate can take: both probes' wall clocks."""
        return self.completion_timeout_s + self.chat_timeout_s


@dataclasses.dataclass(frozen=True)
class GateOutcome:
    """The gate's verdict: ``kind`` is ``passed``, ``wrong`` or ``unanswered``.

    ``heard`` lists ``(probe, said)`` in order; ``message`` names the probe, the
    expected token and what the model said (GATE-05).
    """

    kind: typing.Literal["passed", "wrong", "unanswered"]
    probe: typing.Literal["completion", "chat_completions"]
    message: str
    heard: list[tuple[typing.Literal["completion", "chat_completions"], str]]
    answer: str | None = None
    expected: str | None = None
    actual: str | None = None
    reason: str | None = None

    @property
    def passed(self) -> bool:
        """Only a pass publishes READY (GATE-01)."""
        return self.kind == "passed"

    @property
    def next_state(self) -> SlotState:
        """ready after a pass, error after a wrong answer, warming when unanswered."""
        return {
            "passed": SlotState.READY,
            "wrong": SlotState.ERROR,
            "unanswered": SlotState.WARMING,
        }[self.kind]

    @property
    def stops_unit(self) -> bool:
        """Stop the unit after a wrong answer, never when unanswered (GATE-06, GATE-09)."""
        return self.kind == "wrong"

    @property
    def records_verdict(self) -> bool:
        """A wrong answer records a failed-gate verdict (GATE-07)."""
        return self.kind == "wrong"

    @property
    def clears_verdict(self) -> bool:
        """Only a pass clears an earlier verdict (GATE-08)."""
        return self.kind == "passed"

    @property
    def load_error(self) -> tuple[int, str] | None:
        """``(500, "SlotOutputSanityFailed")`` after a wrong answer, else ``None``."""
        return (500, "SlotOutputSanityFailed") if self.kind == "wrong" else None

    def error(self, slot: str) -> SlotOutputSanityFailed | None:
        """The typed error a load refused by this outcome raises (or ``None``)."""
        if self.kind != "wrong":
            return None
        return SlotOutputSanityFailed(
            self.message,
            code="slot.output_sanity_failed",
            http_status=500,
            details={
                "slot": slot,
                "probe": self.probe,
                "expected": self.expected,
                "actual": self.actual,
            },
        )


def check_output_sanity(base_url: str, options: GateOptions | None = None) -> GateOutcome:
    """Ask the llama-server at ``base_url`` to complete "The capital of France is"
    (greedy ``POST /completion``, one ``/v1/chat/completions`` retry after a
    wrong answer) and judge the answer. Runs on a private Tokio runtime with
    the GIL released; Ctrl-C interrupts it. Never raises for HTTP failures:
    those are ``unanswered`` outcomes."""
    o = options if options is not None else GateOptions()
    d = _v.check_output_sanity(
        base_url,
        o.lane,
        o.completion_tokens,
        o.completion_timeout_s,
        o.chat_tokens,
        o.chat_timeout_s,
        o.model,
        o.authorization,
    )
    return GateOutcome(
        kind=d["kind"],
        probe=d["probe"],
        message=d["message"],
        heard=[(p, s) for p, s in d["heard"]],
        answer=d.get("answer"),
        expected=d.get("expected"),
        actual=d.get("actual"),
        reason=d.get("reason"),
    )
