"""Type stubs of the extension module ``vacancy._vacancy`` (checked by mypy.stubtest)."""

import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, final

from vacancy._errors import ConfigProblem
from vacancy._aio import Admitting
from vacancy._types import (
    BreakerSnapshot,
    Charge,
    EngineStatus,
    Lesson,
    ObservedModel,
    PressureUpdate,
    ReclaimCommand,
)


__all__ = [
    "POST_JOB_SAMPLE_WAIT_S",
    "AdmitTicket",
    "Config",
    "Driver",
    "Engine",
    "Reservation",
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "BUDGET_EVICTION_UNLOADS",
    "DEFAULT_PINNED_ANCHORS",
    "DEFAULT_PRIORITY",
    "GATE_CHAT_PROMPT",
    "GATE_EXPECTED",
    "GATE_PROMPT",
    "LIFECYCLE_OVERHEAD",
    "LRU_RETIRED_EVENT",
    "MAX_PRELOAD_VICTIMS",
    "PARK_BASE_S",
    "PARK_CAP_S",
    "DEFAULT_TRIAL_BUDGET_S",
    "PARK_THRESHOLD",
    "SELF_MANAGED_PROVIDERS",
    "SLOT_DISPATCHABLE",
    "SLOT_STATES",
    "SLOT_TRANSITIONS",
    "STATE_FILE_NAME",
    "CrashLoopBreaker",
    "LruRetirementWarnings",
    "check_transition",
    "selection_rank",
    "state_after_health",
    "state_after_exit",
    "cooldown_s",
    "is_pinned",
    "is_eviction_candidate",
    "eviction_order",
    "plan_preload_eviction",
    "check_pinned",
    "check_npu_exclusivity",
    "reject_retired_lru",
    "priority_from_value",
    "clamp_priority",
    "validate_priority",
    "state_record_path",
    "write_state_record",
    "read_state_record",
    "guard_slot_write_payload",
    "check_unconverted",
    "conversion_blocked",
    "bound_model",
    "is_activated",
    "resolve_autoload",
    "autoload_for_create",
    "tuning_keys",
    "llama_env_keys",
    "removed_keys",
    "slot_lifecycle_budget",
    "parse_launch_args",
    "canonical_flag",
    "llama_device_arg",
    "compose_launch_argv",
    "provider_requires_model",
    "gate_defaults",
    "check_output_sanity",
    "is_gated",
]

POST_JOB_SAMPLE_WAIT_S: float

@final
class Config:
    @staticmethod
    def from_toml(text: str, origin: str = "<string>") -> Config: ...
    @staticmethod
    def from_file(path: str | os.PathLike[str]) -> Config: ...
    @staticmethod
    def for_engine(source: str | Mapping[str, Any], origin: str | None = None) -> Config: ...
    @staticmethod
    def for_engine_file(path: str | os.PathLike[str]) -> Config: ...
    @property
    def warnings(self) -> list[ConfigProblem]: ...
    @property
    def resources(self) -> list[str]: ...
    @property
    def upstreams(self) -> list[str]: ...

@final
class Engine:
    def __new__(cls, config: Config, *, borrowers: dict[str, Any] | None = None) -> Engine: ...
    def set_borrowers(self, borrowers: dict[str, Any] | None) -> None: ...
    def set_wall_clock(self, unix_s: float, at: float | None = None) -> None: ...
    def now(self) -> float: ...
    @property
    def simulated(self) -> bool | None: ...
    def sample(
        self,
        resource: str,
        free_mib: int,
        total_mib: int,
        at: float | None = None,
        *,
        busy_pct: int | None = None,
    ) -> None: ...
    def sample_failed(self, resource: str, reason: str, at: float | None = None) -> None: ...
    def observe(
        self,
        upstream: str,
        models: Sequence[str | ObservedModel],
        at: float | None = None,
        *,
        foreign_work: str | None = None,
    ) -> None: ...
    def admit(
        self,
        upstream: str,
        model: str | None = None,
        *,
        now: float | None = None,
        arrived_at: float | None = None,
        completion: Literal["response_end", "tracked", "held_on_close"] = "response_end",
        kind: str | None = None,
        canonical_model: str | None = None,
        cannot_reuse: str | None = None,
        wait_s: float | None = None,
        borrower: str | None = None,
        priority: Literal["interactive", "batch"] | None = None,
    ) -> Reservation: ...
    def admit_async(
        self,
        upstream: str,
        model: str | None = None,
        *,
        completion: Literal["response_end", "tracked", "held_on_close"] = "response_end",
        kind: str | None = None,
        canonical_model: str | None = None,
        cannot_reuse: str | None = None,
        wait_s: float | None = None,
        borrower: str | None = None,
        priority: Literal["interactive", "batch"] | None = None,
    ) -> Coroutine[Any, Any, Reservation]: ...
    def admitting(
        self,
        upstream: str,
        model: str | None = None,
        *,
        completion: Literal["response_end", "tracked", "held_on_close"] = "response_end",
        kind: str | None = None,
        canonical_model: str | None = None,
        cannot_reuse: str | None = None,
        wait_s: float | None = None,
        borrower: str | None = None,
        priority: Literal["interactive", "batch"] | None = None,
    ) -> Admitting: ...
    def sample_now(self, resource: str | None = None) -> dict[str, str | None]: ...
    def poll_presence(self) -> bool | None: ...
    @property
    def presence_backend(self) -> str: ...
    def _generation(self) -> int: ...
    def _wait_change(self, seen: int, timeout_s: float) -> int: ...
    def take_lesson(self, upstream: str, at: float | None = None) -> Lesson | None: ...
    def start_tracking(self, id: str | Reservation) -> None: ...
    def release(
        self,
        id: str | Reservation,
        outcome: Literal["completed", "not_forwarded", "uncertain"] = "completed",
        reason: str | None = None,
        *,
        at: float | None = None,
    ) -> list[str]: ...
    def release_held(
        self,
        id: str | Reservation,
        *,
        by: Literal["administrator", "tracking"] = "administrator",
        at: float | None = None,
    ) -> list[str]: ...
    def set_owner_present(self, present: bool | None) -> None: ...
    def set_lending(self, enabled: bool) -> None: ...
    def set_resource_enabled(self, name: str, enabled: bool) -> None: ...
    def set_pressure(
        self, resource: str, refuses: str | None = None, *, cleared: bool | None = None
    ) -> None: ...
    def pressure_trigger(self, resource: str, why: str) -> None: ...
    def set_pressure_baseline(
        self, resource: str, attendance: str, util_pct: int, memory_mib: int
    ) -> None: ...
    def pressure_sample(
        self,
        resource: str,
        util_pct: int,
        memory_mib: int,
        attendance: str,
        at: float | None = None,
    ) -> PressureUpdate: ...
    def pressure_miss(
        self, resource: str, reason: str | None = None, at: float | None = None
    ) -> PressureUpdate: ...
    def reclaim_step(self, at: float | None = None) -> list[ReclaimCommand]: ...
    def reclaim_done(self, id: str, at: float | None = None) -> None: ...
    def status(self, at: float | None = None) -> EngineStatus: ...

@final
class Reservation:
    @property
    def id(self) -> str: ...
    @property
    def upstream(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def resident_credit(self) -> bool: ...
    @property
    def admitted_at(self) -> float: ...
    @property
    def resources(self) -> list[str]: ...
    @property
    def charges(self) -> list[Charge]: ...
    @property
    def to_sample(self) -> list[str]: ...
    def __enter__(self) -> Reservation: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

@final
class AdmitTicket:
    @property
    def engine(self) -> Engine: ...
    def step(self) -> Reservation | tuple[int, float]: ...
    def cancel(self) -> None: ...

@final
class Driver:
    def __new__(cls, engine: Engine) -> Driver: ...
    @property
    def running(self) -> bool: ...
    @property
    def resources(self) -> list[str]: ...
    def stop(self) -> None: ...
    def __enter__(self) -> Driver: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

# ---- vacancy.slots (wrapped by vacancy/slots.py) ----------------------------

BACKOFF_BASE_S: float
BACKOFF_CAP_S: float
PARK_THRESHOLD: int
PARK_BASE_S: float
PARK_CAP_S: float
DEFAULT_TRIAL_BUDGET_S: float
DEFAULT_PRIORITY: int
DEFAULT_PINNED_ANCHORS: list[str]
MAX_PRELOAD_VICTIMS: int
LRU_RETIRED_EVENT: str
STATE_FILE_NAME: str
LIFECYCLE_OVERHEAD: float
BUDGET_EVICTION_UNLOADS: int
SELF_MANAGED_PROVIDERS: list[str]
SLOT_STATES: list[str]
SLOT_TRANSITIONS: dict[str, list[str]]
SLOT_DISPATCHABLE: list[str]
GATE_PROMPT: str
GATE_CHAT_PROMPT: str
GATE_EXPECTED: str

def check_transition(from_state: str, to_state: str) -> None: ...
def selection_rank(state: str) -> int: ...
def state_after_health(outcome: str) -> str: ...
def state_after_exit(exit: str) -> str: ...
def cooldown_s(failures: int) -> float: ...
@final
class CrashLoopBreaker:
    def __new__(
        cls, clock: Callable[[], float] | None = None, *, trial_budget_s: float = ...
    ) -> CrashLoopBreaker: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def trial_budget_s(self) -> float: ...
    def give_back_trial(self, key: str) -> None: ...
    def check(self, key: str, *, now: float | None = None) -> None: ...
    def record_failure(self, key: str, *, now: float | None = None) -> BreakerSnapshot: ...
    def record_success(self, key: str) -> None: ...
    def reset(self, key: str) -> None: ...
    def seed(self, key: str, failures: int, last_failure_s: float) -> None: ...
    def seed_of(self, key: str) -> tuple[int, float] | None: ...
    def failures(self, key: str) -> int: ...
    def state(
        self, key: str, *, now: float | None = None
    ) -> Literal["closed", "backoff", "parked", "half-open"]: ...
    def snapshot(self, key: str, *, now: float | None = None) -> BreakerSnapshot | None: ...
    def stamp_metadata(
        self, key: str, metadata: dict[str, Any], *, now: float | None = None
    ) -> None: ...

@final
class LruRetirementWarnings:
    def __new__(cls) -> LruRetirementWarnings: ...
    def note(self, slot: str, carries_lru: bool) -> bool: ...
    def note_file(self, slot: str, slot_file: Any) -> bool: ...
    def warned(self, slot: str) -> bool: ...

def is_pinned(name: str, pinned: bool | None, anchors: Sequence[str]) -> bool: ...
def is_eviction_candidate(candidate: dict[str, Any], anchors: Sequence[str]) -> bool: ...
def eviction_order(candidates: list[dict[str, Any]], anchors: Sequence[str]) -> list[int]: ...
def plan_preload_eviction(
    candidates: list[dict[str, Any]],
    anchors: Sequence[str],
    need_mib: int,
    headroom_mib: int,
    free_mib: int,
    max_victims: int,
) -> tuple[list[str], int, bool]: ...
def check_pinned(
    name: str, pinned: bool | None, anchors: Sequence[str], action: str, force: bool
) -> None: ...
def check_npu_exclusivity(target: dict[str, Any], others: list[dict[str, Any]]) -> None: ...
def reject_retired_lru(slot_file: Any) -> None: ...
def priority_from_value(value: Any) -> int: ...
def clamp_priority(priority: int) -> int: ...
def validate_priority(value: Any) -> int: ...
def state_record_path(slot_dir: str | os.PathLike[str]) -> str: ...
def write_state_record(path: str | os.PathLike[str], record: dict[str, Any]) -> None: ...
def read_state_record(path: str | os.PathLike[str]) -> dict[str, Any] | None: ...
def guard_slot_write_payload(payload: Any) -> None: ...
def check_unconverted(slot: str, file: str | None, slot_file: Any) -> None: ...
def conversion_blocked(slot_file: Any) -> tuple[str, str, list[str]] | None: ...
def bound_model(slot_file: Any) -> str | None: ...
def is_activated(slot_file: Any) -> bool: ...
def resolve_autoload(slot_file: Any) -> tuple[bool, bool]: ...
def autoload_for_create(requested: bool | None = None) -> bool: ...
def tuning_keys(payload: Any) -> list[str]: ...
def llama_env_keys(payload: Any) -> list[str]: ...
def removed_keys(payload: Any) -> list[str]: ...
def slot_lifecycle_budget(
    op: str, health_poll_s: float, output_sanity_cpu_s: float, unload_s: float
) -> float: ...
def parse_launch_args(tokens: Sequence[str]) -> list[tuple[str, list[str]]]: ...
def canonical_flag(flag: str) -> str: ...
def llama_device_arg(slot_device: str) -> str | None: ...
def compose_launch_argv(
    program: str | None, layers: Sequence[tuple[str, Sequence[tuple[str, Sequence[str]]]]]
) -> tuple[list[str] | None, list[tuple[str, str]]]: ...
def provider_requires_model(provider: str) -> bool: ...
def gate_defaults(lane: str) -> tuple[int, float, int, float]: ...
def check_output_sanity(
    base_url: str,
    lane: str,
    completion_tokens: int,
    completion_timeout_s: float,
    chat_tokens: int,
    chat_timeout_s: float,
    model: str | None = None,
    authorization: str | None = None,
) -> dict[str, Any]: ...
def is_gated(
    slot_type: str,
    runtime: str = "llama_server",
    box_switch: str | None = None,
    slot_switch: bool | None = None,
) -> bool: ...
