"""The exceptions of ``vacancy``: one base class with structured subclasses.

The Rust extension raises these classes; they live in Python so that they are
ordinary, picklable exception classes with typed attributes.
"""

from __future__ import annotations

import typing

from vacancy._types import ControlCode, RefusalCode



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

    code: RefusalCode | ControlCode
    """A ``RefusalCode`` from the engine; a ``ControlCode`` from a ``vacancy.Client`` call."""
    http_status: int
    retry_after_s: int | None
    reason: str
    details: dict[str, typing.Any]

    def __init__(
        self,
        message: str,
        *,
        code: RefusalCode | ControlCode,
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


class SlotError(VacancyError):
    """A typed ``slot.*`` error of hal0's slot lifecycle (SERR).

    ``code`` is the machine-readable code (``slot.crash_looping``, ...),
    ``http_status`` the HTTP status hal0 answers it with, ``details`` the
    structured rest (``slot``, ``from``/``to``, ``keys``, ...), and
    ``retry_after_s`` the ``Retry-After`` seconds (only ``SlotCrashLooping``
    has one). The subclass names are hal0's error names.
    """

    code: str
    http_status: int
    details: dict[str, typing.Any]
    retry_after_s: int | None

    def __init__(
        self,
        message: str,
        *,
        code: str,
        http_status: int,
        details: dict[str, typing.Any],
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.details = details
        self.retry_after_s = retry_after_s

    def to_json(self) -> dict[str, typing.Any]:
        """The error body hal0 answers with: ``{code, message, details}``."""
        return {"code": self.code, "message": str(self), "details": self.details}


class SlotNotFound(SlotError, LookupError):
    """``slot.not_found`` (404)."""


class IllegalSlotTransition(SlotError):
    """``slot.illegal_transition`` (409): the state machine forbids the move (SLOT-01)."""


SlotIllegalTransition = IllegalSlotTransition
"""Alias of :class:`IllegalSlotTransition` (hal0's name)."""


class SlotNotReady(SlotError):
    """``slot.not_ready`` (503)."""


class SlotSpawnFailed(SlotError):
    """``slot.spawn_failed`` (500)."""


class SlotHealthFailed(SlotError):
    """``slot.health_failed`` (503)."""


class SlotOutputSanityFailed(SlotError):
    """``slot.output_sanity_failed`` (500): the output-sanity gate heard a wrong answer."""


class SlotCrashLooping(SlotError):
    """``slot.crash_looping`` (503, with ``retry_after_s``): the breaker is open (BRK)."""


class SlotTerminateTimeout(SlotError):
    """``slot.terminate_timeout`` (504)."""


class SeamTimeout(SlotError):
    """``slot.seam_timeout`` (504)."""


class SlotConfigError(SlotError, ValueError):
    """``slot.config_error`` (400); ``details["key"]`` names the key path."""


class SlotTuningKeyDenied(SlotError, ValueError):
    """``slot.tuning_key_denied`` (400): tuning keys belong on a profile."""


class SlotLlamaEnvDenied(SlotError, ValueError):
    """``slot.llama_env_denied`` (400): ``[server].env`` sets llama-server options."""


class SlotRemovedKeyDenied(SlotError, ValueError):
    """``slot.removed_key_denied`` (400): a key removed from the slot schema."""


class SlotUnconverted(SlotError, ValueError):
    """``slot.unconverted`` (400): the slot file still carries tuning keys."""


class SlotProfileMissing(SlotError):
    """``slot.profile_missing`` (422)."""


class NpuExclusivityViolation(SlotError):
    """``slot.npu_exclusivity_violation`` (409): a second NPU LLM slot with a bound model."""


class SlotPinned(SlotError):
    """``slot.pinned`` (409): pass ``force=True`` to unload or delete a pinned slot."""


class StateRecordError(VacancyError):
    """A slot state record (``state.json``) could not be read or written.

    ``path`` names the file; ``detail`` says what went wrong.
    """

    path: str
    detail: str

    def __init__(self, message: str, *, path: str, detail: str) -> None:
        super().__init__(message)
        self.path = path
        self.detail = detail


class StateRecordCorrupt(StateRecordError, ValueError):
    """The file is torn or not a valid slot state record (not JSON, missing fields)."""


class StateRecordIOError(StateRecordError, OSError):
    """The file or its directory could not be read, written, renamed or synced."""
