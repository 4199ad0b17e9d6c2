"""vacancy.Client against a real vacancyd (issue 23 item 3).

The daemon binary is the one the Rust tests build (target/debug/vacancyd, or
$VACANCYD). Its recovery directory holds one held entry written as the daemon
writes its journal, so release_work has real work to release.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

import vacancy

ROOT = pathlib.Path(__file__).resolve().parents[2]
ADMIN, OWNER = "client-test-admin-token", "client-test-owner-token"
BOUND_S = 20.0


def vacancyd() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("VACANCYD", ROOT / "target" / "debug" / "vacancyd"))
    if not path.is_file():
        why = f"{path} is missing: build it with `cargo build -p vacancy-cli` (or set VACANCYD)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    def __init__(self, tmp: pathlib.Path) -> None:
        self.held = str(uuid.uuid4())
        rec = tmp / "rec"
        rec.mkdir(mode=0o700)
        started = int(time.time() * 1000) - 60_000
        record = {"v": 1, "op": "admit", "id": self.held, "upstream": "llm", "model": "m",
                  "resources": ["gpu0"], "completion": "response_end",
                  "started_unix_ms": started, "upstream_ref": None}  # fmt: skip
        journal = rec / "journal.jsonl"
        journal.write_text(json.dumps(record) + "\n")
        journal.chmod(0o600)
        (tmp / "gpu0.json").write_text('{"free_mib": 20000, "total_mib": 24000}')
        control, listen, target = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{control}"
        sha = {t: hashlib.sha256(t.encode()).hexdigest() for t in (ADMIN, OWNER)}
        config = tmp / "vacancyd.toml"
        config.write_text(f"""
[server]
listen = "127.0.0.1:{control}"
admission_state_dir = "{rec}"

[[server.token]]
name = "ops"
scopes = ["admin"]
sha256 = "{sha[ADMIN]}"

[[server.token]]
name = "owner"
scopes = ["owner"]
sha256 = "{sha[OWNER]}"

[owner]
presence = "manual"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{tmp / "gpu0.json"}"

[[upstream]]
name = "llm"
adapter = "llamacpp"
listen = "127.0.0.1:{listen}"
target = "http://127.0.0.1:{target}"
resource = "gpu0"
default_min_free_mib = 1000
""")
        self.log = open(tmp / "vacancyd.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(vacancyd()), "run", "--config", str(config)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        client = vacancy.Client(self.url)
        end = time.monotonic() + BOUND_S
        while True:
            try:
                client.status()
                return
            except vacancy.DaemonUnreachable:
                if self.proc.poll() is not None or time.monotonic() > end:
                    self.stop()
                    raise AssertionError(
                        f"vacancyd did not answer: {(tmp / 'vacancyd.log').read_text()}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.stop()


def test_status_switches_presence_and_release(daemon: Daemon) -> None:
    reader = vacancy.Client(daemon.url)
    status = reader.status()
    assert status["lending"] is True
    (entry,) = status["work"]
    assert entry["id"] == daemon.held and entry["phase"] == "held"

    owner = vacancy.Client(daemon.url, token=OWNER)
    owner.set_lending(False)
    assert reader.status()["lending"] is False
    owner.set_lending(True)
    owner.set_resource_enabled("gpu0", False)
    gpu = next(r for r in reader.status()["resources"] if r["name"] == "gpu0")
    assert gpu["enabled"] is False
    owner.set_resource_enabled("gpu0", True)
    owner.set_owner_present(False)
    assert reader.status()["owner"] == "away"

    # The control API's errors as the package's exceptions.
    with pytest.raises(vacancy.UnknownResource):
        owner.set_resource_enabled("nope", True)
    with pytest.raises(vacancy.Refused) as info:
        reader.set_lending(False)  # no token
    assert (info.value.code, info.value.http_status) == ("unauthorized", 401)
    with pytest.raises(vacancy.Refused) as info:
        owner.release_work(daemon.held, upstream_stopped=True)  # owner < admin
    assert info.value.code == "forbidden" and info.value.http_status == 403

    admin = vacancy.Client(daemon.url, token=ADMIN)
    with pytest.raises(vacancy.Refused) as info:
        admin.release_work(daemon.held, upstream_stopped=False)
    assert info.value.code == "invalid_request" and "upstream_stopped" in info.value.reason
    admin.release_work(daemon.held, upstream_stopped=True)
    assert reader.status()["work"] == []
    with pytest.raises(vacancy.UnknownEntry):
        admin.release_work(daemon.held, upstream_stopped=True)
    with pytest.raises(vacancy.UnknownEntry):
        admin.release_work("not-an-id", upstream_stopped=True)
    assert "..." in repr(admin) and ADMIN not in repr(admin)


def test_an_unreachable_daemon() -> None:
    client = vacancy.Client(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(vacancy.DaemonUnreachable) as info:
        client.status()
    assert isinstance(info.value, OSError) and "did not answer" in str(info.value)
