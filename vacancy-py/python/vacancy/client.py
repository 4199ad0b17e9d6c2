"""``vacancy.Client``: a running ``vacancyd``'s control API from Python.

Standard library only (``urllib``). Each method is one HTTP call to the
control listener (``[server] listen``, ``http://127.0.0.1:7480`` by default);
the daemon's errors (``{"error": {"code", "message"}}``) come back as the
package's exception classes: an unknown resource or work entry as
``UnknownResource`` / ``UnknownEntry``, a release of work that is not held as
``NotHeld``, everything else as ``Refused`` with the daemon's ``.code``,
``.http_status``, ``.retry_after_s`` and its message as ``.reason``. A daemon
that cannot be reached raises ``DaemonUnreachable``.
"""

from __future__ import annotations

import json
import typing
import urllib.error
import urllib.parse
import urllib.request

from vacancy._errors import NotHeld, Refused, UnknownEntry, UnknownResource, VacancyError
from vacancy._types import ControlCode

__all__ = ["Client", "ControlCode", "DaemonUnreachable"]



class DaemonUnreachable(VacancyError, OSError):
    """The daemon's control listener did not answer (not running, wrong address)."""


class Client:
    """The control API of the ``vacancyd`` at ``url``.

    ``token`` is a bearer token of ``[[server.token]]``: reading ``status()``
    from loopback needs none; the switches and presence need scope ``owner``,
    ``release_work`` scope ``admin``. ``timeout_s`` bounds each call.
    """

    def __init__(self, url: str = "http://127.0.0.1:7480", token: str | None = None,
                 *, timeout_s: float = 10.0) -> None:  # fmt: skip
        self.url = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"Client({self.url!r}, token={'...' if self._token else None})"

    def _call(self, method: str, path: str, body: dict[str, typing.Any] | None = None,
              intent: str | None = None) -> typing.Any:  # fmt: skip
        headers = {"Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        if intent is not None:
            headers["Vacancy-Intent"] = intent
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                raw = e.read()
            raise _error(path, e.code, e.headers.get("Retry-After"), raw) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise DaemonUnreachable(f"vacancyd at {self.url} did not answer: {reason}") from None

    def status(self) -> dict[str, typing.Any]:
        """``GET /status``: the daemon's status (the engine's ``status()`` keys
        and the daemon's own: upstream targets and health, presence backend, ...)."""
        result: dict[str, typing.Any] = self._call("GET", "/status")
        return result

    def set_lending(self, enabled: bool) -> None:
        """The lending switch (scope ``owner``)."""
        self._call("POST", "/admin/lending", {"enabled": bool(enabled)}, "lending")

    def set_resource_enabled(self, name: str, enabled: bool) -> None:
        """A resource's switch (scope ``owner``); ``UnknownResource`` for a name it does not know."""
        path = "/admin/resources/" + urllib.parse.quote(name, safe="")
        self._call("POST", path, {"enabled": bool(enabled)}, "resource")

    def set_owner_present(self, present: bool) -> None:
        """Owner presence by hand (scope ``owner``): needs ``[owner] presence =
        "manual"``, else ``Refused(code="conflict")`` naming the backend."""
        self._call("POST", "/admin/owner", {"present": bool(present)}, "presence")

    def release_work(self, id: str, *, upstream_stopped: bool) -> None:
        """Release a held work entry once you stopped or verified the job at
        the upstream (scope ``admin``): pass ``upstream_stopped=True`` to say
        so. Answered once the release is on disk. ``UnknownEntry`` for an ID
        it does not know, ``NotHeld`` for one that is not held."""
        path = "/admin/work/" + urllib.parse.quote(id, safe="") + "/release"
        self._call("POST", path, {"upstream_stopped": bool(upstream_stopped)}, "release_work")


def _error(path: str, status: int, retry_after: str | None, raw: bytes) -> VacancyError:
    code, message = "internal", raw.decode(errors="replace").strip() or f"HTTP {status}"
    try:
        err = json.loads(raw)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    if code == "not_found" and path.startswith("/admin/work/"):
        return UnknownEntry(message)
    if code == "not_found" and path.startswith("/admin/resources/"):
        return UnknownResource(message)
    if code == "conflict" and path.startswith("/admin/work/"):
        return NotHeld(message)
    retry = int(retry_after) if retry_after is not None and retry_after.isdigit() else None
    return Refused(
        message,
        code=typing.cast(ControlCode, code),
        http_status=status,
        retry_after_s=retry,
        reason=message,
        details={"resource": None, "observe_again": False},
    )
