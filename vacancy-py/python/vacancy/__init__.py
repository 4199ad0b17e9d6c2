"""vacancy: the admission engine of the vacancy lending daemon, in Python.

The same rules the daemon ``vacancyd`` applies, embedded: build an
:class:`Engine` from a :class:`Config`, feed it capacity samples, model
observations and owner presence, and ask it to ``admit`` and ``release``
borrowed work. :mod:`vacancy.slots` holds hal0's slot lifecycle rules (states,
typed errors, the crash-loop breaker, eviction, state records, the output-sanity
gate). See ``docs/python.md``.
"""

from __future__ import annotations

from vacancy._errors import (
    ConfigError,
    ConfigProblem,
    EntryHeld,
    NotHeld,
    Refused,
    ResourceBusy,
    TimelineError,
    UnknownEntry,
    UnknownResource,
    UnknownUpstream,
    VacancyError,
    WaitForSample,
)
from vacancy._types import (
    BorrowerStatus,
    BorrowerTotals,
    BudgetStatus,
    Charge,
    ControlCode,
    EngineStatus,
    Lesson,
    LineStatus,
    ObservedModel,
    OwnerVeto,
    PressureTriggerInfo,
    PressureUpdate,
    ReclaimAct,
    ReclaimCommand,
    ReclaimEnded,
    ReclaimStarted,
    ReclaimStatus,
    RefusalCode,
    ResourceStatus,
    UpstreamStatus,
    VacancyStatus,
    WorkStatus,
)
from vacancy._vacancy import POST_JOB_SAMPLE_WAIT_S, Config, Driver, Engine, Reservation
from vacancy._aio import Admitting
from vacancy.client import Client, DaemonUnreachable
from vacancy import slots

__all__ = [
    "POST_JOB_SAMPLE_WAIT_S",
    "Admitting",
    "Charge",
    "Client",
    "Config",
    "ControlCode",
    "DaemonUnreachable",
    "ConfigError",
    "ConfigProblem",
    "Driver",
    "Engine",
    "BorrowerStatus",
    "BorrowerTotals",
    "BudgetStatus",
    "EngineStatus",
    "LineStatus",
    "OwnerVeto",
    "PressureTriggerInfo",
    "PressureUpdate",
    "ReclaimAct",
    "ReclaimCommand",
    "ReclaimEnded",
    "ReclaimStarted",
    "ReclaimStatus",
    "RefusalCode",
    "ResourceStatus",
    "UpstreamStatus",
    "VacancyStatus",
    "WorkStatus",
    "EntryHeld",
    "NotHeld",
    "Lesson",
    "ObservedModel",
    "Refused",
    "Reservation",
    "ResourceBusy",
    "TimelineError",
    "UnknownEntry",
    "UnknownResource",
    "UnknownUpstream",
    "VacancyError",
    "WaitForSample",
    "slots",
]
