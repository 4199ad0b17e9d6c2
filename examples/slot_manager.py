"""A hal0-style slot manager that runs real llama-server processes, on vacancy.

    python examples/slot_manager.py LAUNCHER... -- MODEL.gguf

``LAUNCHER`` is how to start llama-server with a model (``llama-server``, or
``python llama_server.py`` from the PyPI wheel ``xllamacpp``): the manager
appends ``MODEL --port P`` (plus ``--host 127.0.0.1``). It runs two slots of
that model through hal0's lifecycle and prints each step:

* OFFLINE → STARTING (the process is spawned) → WARMING (``/health`` probed
  until 200) → the output-sanity gate → READY, or ERROR on a wrong answer (a
  random-weight model answers garbage: a real wrong answer; ``output_sanity =
  False`` is the slot's escape hatch) → SERVING while a job runs → IDLE →
  UNLOADING (SIGTERM) → OFFLINE;
* eviction by priority, then least recently used, when a slot's configured
  memory need does not fit the live memory sample (less what loaded slots are
  promised but do not use yet);
* the crash-loop breaker when a server is killed (refused loads, half-open
  trial), on the manager's clock;
* an atomic ``state.json`` per slot at every transition;
* every borrowed job admitted through the embedded engine, kept fresh by a
  ``vacancy.Driver`` (the daemon's samplers and presence, on Rust threads).

Only ``import vacancy`` and the standard library are used. The pytest test
(``vacancy-py/tests/test_slot_manager.py``) drives the same ``SlotManager``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import vacancy
from vacancy import slots
from vacancy.slots import SlotState

HEALTH_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> int:
    """A process's resident memory, from /proc."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


@dataclasses.dataclass
class SlotSpec:
    """A slot's configuration, as hal0's slot file gives it."""

    name: str
    model: str
    need_mib: int
    priority: int = slots.DEFAULT_PRIORITY
    pinned: bool | None = None
    output_sanity: bool = True


@dataclasses.dataclass
class Slot:
    spec: SlotSpec
    state: SlotState = SlotState.OFFLINE
    process: subprocess.Popen[bytes] | None = None
    port: int | None = None
    in_flight: int = 0
    last_used_s: float = 0.0
    message: str | None = None
    metadata: dict[str, object] = dataclasses.field(default_factory=dict)

    # What eviction reads (slots.eviction_order / plan_preload_eviction).
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def pinned(self) -> bool | None:
        return self.spec.pinned

    @property
    def resident_mib(self) -> int:
        return self.spec.need_mib if self.process is not None else 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def engine_config(specs: Sequence[SlotSpec], reserve_mib: int) -> vacancy.Config:
    """One memory resource sampled by the daemon's system sampler, one upstream per slot."""
    upstreams = [{"name": s.name, "resource": "ram", "default_min_free_mib": 1} for s in specs]
    return vacancy.Config.for_engine({
        "owner": {"presence": "none"},
        "resource": [{"name": "ram", "kind": "memory", "sampler": "system",
                      "poll_ms": 500, "reserve_mib": reserve_mib}],
        "upstream": upstreams,
    })  # fmt: skip


class SlotManager:
    """Runs llama-server processes for its slots; asks vacancy before every job."""

    def __init__(self, launcher: Sequence[str], specs: Sequence[SlotSpec], root: pathlib.Path,
                 engine: vacancy.Engine, *, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = print) -> None:  # fmt: skip
        self.launcher, self.root, self.engine, self.clock, self.log = (
            list(launcher), root, engine, clock, log)  # fmt: skip
        self.slots = {s.name: Slot(s) for s in specs}
        self.breaker = slots.CrashLoopBreaker(clock)
        self.reserve_mib = next(r["reserve_mib"] for r in engine.status()["resources"])

    # ---- state ---------------------------------------------------------------

    def move(self, slot: Slot, to: SlotState, message: str | None = None) -> None:
        """Every transition: checked against hal0's table, then recorded atomically."""
        slots.check_transition(slot.state, to)  # raises IllegalSlotTransition (409)
        self.log(f"{slot.name}: {slot.state} -> {to}" + (f" ({message})" if message else ""))
        slot.state, slot.message = to, message
        self.breaker.stamp_metadata(slot.name, slot.metadata)
        record = slots.SlotStateRecord(slot.name, to, time.time(), model_id=slot.spec.model,
                                       port=slot.port, message=message,
                                       extra=dict(slot.metadata))  # fmt: skip
        slots.write_state_record(slots.state_record_path(self.root / slot.name), record)

    def record(self, name: str) -> slots.SlotStateRecord | None:
        return slots.read_state_record(slots.state_record_path(self.root / name))

    # ---- memory ----------------------------------------------------------------

    def room_mib(self) -> int:
        """Free memory for a load: the live sample less the reserve, less what loaded
        slots are configured to need but do not use yet (a server fills its memory
        as it warms up and serves)."""
        ram = next(r for r in self.engine.status()["resources"] if r["name"] == "ram")
        free = ram["free_mib"]
        if free is None:
            raise RuntimeError(f"no memory sample: {ram['capacity_unknown']}")
        promised = sum(max(0, s.spec.need_mib - rss_mib(s.process.pid))
                       for s in self.slots.values() if s.process is not None)  # fmt: skip
        return free - self.reserve_mib - promised

    # ---- lifecycle ---------------------------------------------------------------

    def load(self, name: str) -> SlotState:
        """OFFLINE/ERROR → STARTING → WARMING → gate → READY or ERROR."""
        slot = self.slots[name]
        self.breaker.check(name)  # SlotCrashLooping (503, retry_after_s): nothing moves
        room = self.room_mib()
        others = [s for s in self.slots.values() if s is not slot and s.process is not None]
        plan = slots.plan_preload_eviction(others, slot.spec.need_mib, free_mib=room)
        if not plan.fits:
            self.breaker.give_back_trial(name)  # this load never starts
            raise RuntimeError(f"{name} needs {slot.spec.need_mib} MiB; {room} MiB free "
                               "even after evicting what may be evicted")  # fmt: skip
        for victim in plan.victims:
            self.log(f"evict {victim} (priority, then least recently used) for {name}: "
                     f"{slot.spec.need_mib} MiB needed, {room} MiB free")  # fmt: skip
            self.unload(victim)
        if slot.state == SlotState.ERROR:
            self.stop_process(slot)
        slot.port = free_port()
        self.move(slot, SlotState.STARTING)
        slot.process = subprocess.Popen(
            [*self.launcher, slot.spec.model, "--host", "127.0.0.1", "--port", str(slot.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.move(slot, SlotState.WARMING)
        if not self.wait_healthy(slot):
            self.failed(slot, "the health probe never answered 200")
            return slot.state
        if not slot.spec.output_sanity:
            self.move(slot, SlotState.READY, "output_sanity = false: gate skipped")
        else:
            outcome = slots.check_output_sanity(slot.url, slots.GateOptions.cpu())
            if outcome.kind != "passed":  # a wrong answer; or none within the CPU budget
                self.failed(slot, outcome.message)
                return slot.state
            self.move(slot, outcome.next_state, outcome.message)
        self.breaker.record_success(name)
        slot.last_used_s = self.clock()
        return slot.state

    def wait_healthy(self, slot: Slot) -> bool:
        end = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < end:
            if slot.process is None or slot.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(slot.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

    def failed(self, slot: Slot, why: str) -> None:
        """A failed load or a crash: ERROR, the process stopped, the breaker told."""
        snap = self.breaker.record_failure(slot.name)
        self.stop_process(slot)
        self.move(slot, SlotState.ERROR, why)
        self.log(f"{slot.name}: breaker {snap}")

    def watch(self) -> None:
        """Notice servers that exited by themselves (crashed or killed)."""
        for slot in self.slots.values():
            if slot.process is not None and slot.process.poll() is not None:
                code = slot.process.returncode
                slot.process = None
                if slot.state == SlotState.IDLE:
                    # IDLE has no edge to ERROR in hal0's table: the probe that
                    # found it gone wakes it first.
                    self.move(slot, SlotState.READY, "probed: the server is gone")
                if slot.state not in (SlotState.UNLOADING, SlotState.OFFLINE):
                    self.failed(slot, f"llama-server exited with {code}")

    def stop_process(self, slot: Slot) -> None:
        p, slot.process = slot.process, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def unload(self, name: str, *, force: bool = False) -> None:
        """(READY/IDLE) → UNLOADING → OFFLINE."""
        slot = self.slots[name]
        slots.check_pinned(name, slot.spec.pinned, action="unload", force=force)  # SlotPinned
        self.move(slot, SlotState.UNLOADING)
        self.stop_process(slot)
        self.move(slot, SlotState.OFFLINE)

    def shutdown(self) -> None:
        for slot in self.slots.values():
            self.stop_process(slot)

    # ---- serving -------------------------------------------------------------------

    def serve(self, name: str, prompt: str, n_predict: int = 8) -> str:
        """One borrowed job: admitted by the engine, then READY/IDLE → SERVING → IDLE."""
        slot = self.slots[name]
        if slot.state not in slots.DISPATCHABLE_STATES:
            raise slots.SlotNotReady(f"slot {name} is {slot.state}", code="slot.not_ready",
                                     http_status=503, details={"slot": name})  # fmt: skip
        with self.engine.admit(name, slot.spec.model) as job:  # raises vacancy.Refused
            self.move(slot, SlotState.SERVING, f"job {job.id[:8]}")
            slot.in_flight += 1
            try:
                body = json.dumps({"prompt": prompt, "n_predict": n_predict}).encode()
                req = urllib.request.Request(slot.url + "/completion", data=body,
                                             headers={"Content-Type": "application/json"})  # fmt: skip
                with urllib.request.urlopen(req, timeout=60) as r:
                    text = str(json.loads(r.read())["content"])
            finally:
                slot.in_flight -= 1
                slot.last_used_s = self.clock()
        self.move(slot, SlotState.IDLE)
        return text


def main(argv: Sequence[str]) -> None:
    if "--" not in argv:
        sys.exit(__doc__)
    i = list(argv).index("--")
    launcher, model = list(argv[:i]), argv[i + 1]
    specs = [SlotSpec("chat", model, need_mib=2000, priority=60, output_sanity=False),
             SlotSpec("coder", model, need_mib=2000, priority=40)]  # fmt: skip
    engine = vacancy.Engine(engine_config(specs, reserve_mib=1024))
    with tempfile.TemporaryDirectory() as tmp, vacancy.Driver(engine):
        mgr = SlotManager(launcher, specs, pathlib.Path(tmp), engine)
        try:
            print("1. coder: a random-weight model fails the output-sanity gate")
            print(f"   -> {mgr.load('coder')}: {mgr.slots['coder'].message}")
            print("2. chat: output_sanity = false, READY, and a borrowed job")
            mgr.load("chat")
            print(f"   -> {mgr.serve('chat', 'Hello')!r}")
            print("3. chat is killed: ERROR, and the breaker refuses a reload for a while")
            p = mgr.slots["chat"].process
            assert p is not None
            p.kill()
            p.wait()
            mgr.watch()
            try:
                mgr.load("chat")
            except slots.SlotCrashLooping as e:
                print(f"   refused: {e.code}, retry after {e.retry_after_s} s")
            for name in mgr.slots:
                rec = mgr.record(name)
                print(f"4. {name}/state.json: {rec.state if rec else None}")
        finally:
            mgr.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
