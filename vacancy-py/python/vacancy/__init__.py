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
from vacancy._types import Charge, Lesson, ObservedModel
from vacancy._vacancy import POST_JOB_SAMPLE_WAIT_S, Config, Engine, Reservation
from vacancy import slots

__all__ = [
    "POST_JOB_SAMPLE_WAIT_S",
    "Charge",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "Engine",
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
