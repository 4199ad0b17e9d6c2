"""Dict shapes the engine takes and gives, for type checkers."""

from __future__ import annotations

import typing

__all__ = ["BreakerSnapshot", "Charge", "Lesson", "ObservedModel"]


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
    """Seconds until the next start is allowed (0 in half-open)."""
