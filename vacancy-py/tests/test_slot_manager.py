"""examples/slot_manager.py on two real llama-server processes (issue 23 item 4).

llama-server is llama.cpp's own server code through the PyPI wheel
``xllamacpp`` with a tiny generated random-weight model, both from the test
harness's cache (``target/debug/llama-prepare``, built by scripts/test: the
same venv, model and locks the Rust tests use).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType

import pytest

import vacancy
from vacancy import slots

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slot_manager", ROOT / "examples" / "slot_manager.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["slot_manager"] = module
    spec.loader.exec_module(module)
    return module


def prepared() -> dict[str, str]:
    tool = pathlib.Path(os.environ.get("LLAMA_PREPARE", ROOT / "target" / "debug" / "llama-prepare"))
    if not tool.is_file():
        why = f"{tool} is missing: cargo build -p vacancy-test-support --bin llama-prepare"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    out = subprocess.run([str(tool)], check=True, capture_output=True, text=True, timeout=900)
    result: dict[str, str] = json.loads(out.stdout)
    return result


class FakeClock:
    """The breaker's clock: moved by the test, so cooldowns need no waiting."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def manager(tmp_path: pathlib.Path) -> Iterator[tuple[ModuleType, object, FakeClock]]:
    sm = load_example()
    llama = prepared()
    # Two slots of the same tiny model; each needs 3000 MiB by configuration.
    # The reserve is set from the live sample so that one fits and two do not:
    # the second load must evict (the promised memory of the first counts).
    probe = vacancy.Engine(sm.engine_config([], reserve_mib=0))
    assert probe.sample_now() == {"ram": None}
    free = probe.status()["resources"][0]["free_mib"]
    assert free is not None and free > 5000, f"{free} MiB free: too little for this test"
    specs = [sm.SlotSpec("chat", llama["model"], need_mib=3000, priority=60, output_sanity=False),
             sm.SlotSpec("coder", llama["model"], need_mib=3000, priority=40, output_sanity=False),
             sm.SlotSpec("gated", llama["model"], need_mib=100)]  # fmt: skip
    engine = vacancy.Engine(sm.engine_config(specs, reserve_mib=free - 4500))
    clock = FakeClock()
    log: list[str] = []
    with vacancy.Driver(engine):
        mgr = sm.SlotManager([llama["python"], llama["server_script"]], specs, tmp_path, engine,
                             clock=clock, log=log.append)  # fmt: skip
        try:
            yield sm, mgr, clock
        finally:
            mgr.shutdown()


def test_the_slot_manager_runs_real_servers(manager: tuple[ModuleType, object, FakeClock]) -> None:
    sm, mgr, clock = manager
    assert isinstance(mgr, sm.SlotManager)
    S = slots.SlotState

    # A random-weight model fails the output-sanity gate: a real wrong answer.
    assert mgr.load("gated") == S.ERROR
    gated = mgr.slots["gated"]
    assert "Paris" in (gated.message or "") and gated.process is None
    record = mgr.record("gated")
    assert record is not None and record.state == S.ERROR
    assert record.extra["breaker"]["failures"] == 1

    # output_sanity = false: READY, and borrowed jobs through the engine.
    assert mgr.load("chat") == S.READY
    for _ in range(3):
        text = mgr.serve("chat", "Hello", n_predict=4)
        assert isinstance(text, str) and text
    assert mgr.slots["chat"].state == S.IDLE
    rec = mgr.record("chat")
    assert rec is not None and rec.state == S.IDLE and rec.port == mgr.slots["chat"].port
    status = mgr.engine.status()
    assert status["work"] == [], "every job was released"

    # coder needs 3000 MiB: with what chat is promised counted it does not fit
    # the live sample, so chat (the only resident, unpinned, idle slot) is evicted.
    clock.t += 10
    assert mgr.load("coder") == S.READY
    assert mgr.slots["chat"].state == S.OFFLINE and mgr.slots["chat"].process is None
    assert mgr.serve("coder", "Hi", n_predict=2)

    # Killed: ERROR, the breaker refuses a reload until its cooldown has run,
    # then the half-open trial loads it and closes the breaker (BRK-05).
    proc = mgr.slots["coder"].process
    assert proc is not None
    proc.kill()
    proc.wait()
    mgr.watch()
    assert mgr.slots["coder"].state == S.ERROR
    with pytest.raises(slots.SlotCrashLooping) as info:
        mgr.load("coder")
    assert info.value.retry_after_s == 5
    assert mgr.slots["coder"].state == S.ERROR, "a refused load moves nothing"
    clock.t += 5
    assert mgr.load("coder") == S.READY
    assert mgr.breaker.snapshot("coder") is None

    # A server that dies at every start (its model file is gone): the breaker
    # backs off 5, 10, 20 s, refusing in between (BRK-02).
    gone = mgr.slots["gated"]
    gone.spec.model = str(pathlib.Path(gone.spec.model).with_name("missing.gguf"))
    clock.t += 3600
    for failures, cooldown in ((2, 10), (3, 20)):
        assert mgr.load("gated") == S.ERROR
        snap = mgr.breaker.snapshot("gated")
        assert snap is not None and snap["failures"] == failures
        with pytest.raises(slots.SlotCrashLooping) as info:
            mgr.load("gated")
        assert info.value.retry_after_s == cooldown
        clock.t += cooldown

    # Unload: UNLOADING → OFFLINE, recorded.
    mgr.unload("coder")
    rec = mgr.record("coder")
    assert rec is not None and rec.state == S.OFFLINE


def test_the_example_runs_as_a_program() -> None:
    llama = prepared()
    example = ROOT / "examples" / "slot_manager.py"
    done = subprocess.run(
        [sys.executable, str(example), llama["python"], llama["server_script"], "--", llama["model"]],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("coder: warming -> error", "chat: warming -> ready", "chat: serving -> idle",
                 "refused: slot.crash_looping, retry after 5 s", "chat/state.json: error"):  # fmt: skip
        assert step in done.stdout, done.stdout
