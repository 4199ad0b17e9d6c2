"""Type stubs of the extension module ``vacancy._vacancy`` (checked by mypy.stubtest)."""

import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, final

from vacancy._errors import ConfigProblem
from vacancy._types import Charge, ObservedModel

__all__ = ["POST_JOB_SAMPLE_WAIT_S", "Config", "Engine", "Reservation"]

POST_JOB_SAMPLE_WAIT_S: float

@final
class Config:
    @staticmethod
    def from_toml(text: str, origin: str = "<string>") -> Config: ...
    @staticmethod
    def from_file(path: str | os.PathLike[str]) -> Config: ...
    @property
    def warnings(self) -> list[ConfigProblem]: ...
    @property
    def resources(self) -> list[str]: ...
    @property
    def upstreams(self) -> list[str]: ...

@final
class Engine:
    def __new__(cls, config: Config) -> Engine: ...
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
    ) -> Reservation: ...
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
    def set_pressure(self, resource: str, refuses: str | None = None) -> None: ...
    def status(self, at: float | None = None) -> dict[str, Any]: ...

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
    def __enter__(self) -> Reservation: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
