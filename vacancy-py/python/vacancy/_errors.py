"""The exceptions of ``vacancy``: one base class with structured subclasses.

The Rust extension raises these classes; they live in Python so that they are
ordinary, picklable exception classes with typed attributes.
"""

from __future__ import annotations

import typing

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "EntryHeld",
    "NotHeld",
    "Refused",
    "ResourceBusy",
    "TimelineError",
    "UnknownEntry",
    "UnknownResource",
    "UnknownUpstream",
    "VacancyError",
    "WaitForSample",
]


class ConfigProblem(typing.TypedDict):
    """One problem in a configuration."""

    path: str
    """The key path, e.g. ``upstream[0] ("ollama").also_requires``; empty for the whole file."""
    line: int | None
    """The 1-based line, when known."""
    message: str
    """What is wrong and, where useful, what to do."""


class VacancyError(Exception):
    """The base class of every exception ``vacancy`` raises."""


class ConfigError(VacancyError, ValueError):
    """A configuration is invalid. ``problems`` lists every problem at once."""

    origin: str
    problems: list[ConfigProblem]

    def __init__(self, message: str, *, origin: str, problems: list[ConfigProblem]) -> None:
        super().__init__(message)
        self.origin = origin
        self.problems = problems


class Refused(VacancyError):
    """The engine refused borrowed work, with the daemon's machine-readable code.

    ``code`` is the refusal code (``owner_present``, ``insufficient_memory``, ...),
    ``http_status`` the one HTTP status the daemon answers it with,
    ``retry_after_s`` the ``Retry-After`` it sends (``None`` where retrying soon
    cannot help), ``reason`` what a person can do about it, and ``details`` the
    structured rest: ``resource`` (the resource it concerns, or ``None``) and
    ``observe_again`` (resident credit was withheld only because the model
    observation was too old: observe the upstream and ask again).
    """

    code: str
    http_status: int
    retry_after_s: int | None
    reason: str
    details: dict[str, typing.Any]

    def __init__(
        self,
        message: str,
        *,
        code: str,
        http_status: int,
        retry_after_s: int | None,
        reason: str,
        details: dict[str, typing.Any],
    ) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.retry_after_s = retry_after_s
        self.reason = reason
        self.details = details


class ResourceBusy(Refused):
    """Refused as ``resource_busy`` (HTTP 503, ``Retry-After: 2``): another job holds a
    resource, or no fresh sample arrived within 4 s after the last job ended."""


class WaitForSample(VacancyError):
    """Only with an explicit ``now=``: a resource awaits its post-job capacity sample.

    Feed the sample (``Engine.sample``) and call ``admit`` again with
    ``arrived_at=err.arrived_at``; at or after ``until`` the same call raises
    ``ResourceBusy``. Times are seconds on the engine's timeline.
    """

    until: float
    arrived_at: float
    resources: list[str]

    def __init__(
        self, message: str, *, until: float, arrived_at: float, resources: list[str]
    ) -> None:
        super().__init__(message)
        self.until = until
        self.arrived_at = arrived_at
        self.resources = resources


class UnknownEntry(VacancyError, LookupError):
    """No work entry has this ID; it may have been released already."""


class UnknownResource(VacancyError, LookupError):
    """No resource has this name."""


class UnknownUpstream(VacancyError, LookupError):
    """No upstream has this name."""


class EntryHeld(VacancyError):
    """The entry is held: only ``Engine.release_held`` releases it."""


class NotHeld(VacancyError):
    """``release_held`` was called on an entry that is not held."""


class TimelineError(VacancyError, ValueError):
    """Simulated and real time were mixed on one engine, or a time is not a
    finite, non-negative number of seconds."""
