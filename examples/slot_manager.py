"""A hal0-style slot manager on vacancy.slots: `python examples/slot_manager.py`.

It drives a slot through load -> ready -> serving -> idle -> unloading -> offline
with check_transition, survives a crash through the crash-loop breaker (under a
fake clock), lets the eviction planner pick a victim to make room, persists each
state to state.json in a temp dir, and asks vacancy.Engine for admission before
dispatching borrowed work. Only `import vacancy` is used.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import vacancy
from vacancy import slots
from vacancy.slots import SlotState

CONFIG = """
[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu0.json"
reserve_mib = 2048

[[upstream]]
name = "llamacpp"
adapter = "llamacpp"
listen = "127.0.0.1:8081"
target = "http://127.0.0.1:8080"
resource = "gpu0"
default_min_free_mib = 8000
"""


class FakeClock:
    """Seconds that only move when told to."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclasses.dataclass
class Slot:
    name: str
    state: SlotState = SlotState.OFFLINE
    priority: int = 50
    pinned: bool | None = None
    in_flight: int = 0
    last_used_s: float = 0.0
    resident_mib: int = 0
    metadata: dict[str, object] = dataclasses.field(default_factory=dict)


class SlotManager:
    def __init__(self, root: Path, clock: FakeClock, total_mib: int) -> None:
        self.root, self.clock, self.total_mib = root, clock, total_mib
        self.slots: dict[str, Slot] = {}
        self.breaker = slots.CrashLoopBreaker(clock)

    def free_mib(self) -> int:
        return self.total_mib - sum(s.resident_mib for s in self.slots.values())

    def move(self, slot: Slot, to: SlotState, message: str | None = None) -> None:
        slots.check_transition(slot.state, to)  # raises IllegalSlotTransition (409)
        print(f"  {slot.name}: {slot.state} -> {to}")
        slot.state = to
        self.breaker.stamp_metadata(slot.name, slot.metadata)
        record = slots.SlotStateRecord(
            slot.name, to, self.clock(), message=message, extra=dict(slot.metadata)
        )
        slots.write_state_record(slots.state_record_path(self.root / slot.name), record)

    def load(self, name: str, need_mib: int, *, crash: bool = False) -> Slot:
        slot = self.slots.setdefault(name, Slot(name))
        self.breaker.check(name)  # raises SlotCrashLooping with retry_after_s
        plan = slots.plan_preload_eviction(
            [s for s in self.slots.values() if s is not slot], need_mib, free_mib=self.free_mib()
        )
        if not plan.fits:
            raise RuntimeError(f"{name} does not fit even after eviction")
        for victim in plan.victims:
            print(f"  evicting {victim} to make room for {name}")
            self.unload(victim)
        self.move(slot, SlotState.STARTING)
        if crash:
            snap = self.breaker.record_failure(name)
            self.move(slot, slots.state_after_exit("crashed"), message="exited 139")
            print(f"  breaker: {snap}")
            return slot
        self.move(slot, SlotState.WARMING)
        slot.resident_mib = need_mib
        self.move(slot, slots.state_after_health("ready"))
        self.breaker.record_success(name)
        return slot

    def unload(self, name: str, *, force: bool = False) -> None:
        slot = self.slots[name]
        slots.check_pinned(name, slot.pinned, force=force)  # raises SlotPinned (409)
        self.move(slot, SlotState.UNLOADING)
        slot.resident_mib = 0
        self.move(slot, SlotState.OFFLINE)


def main() -> None:
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mgr = SlotManager(root, clock, total_mib=24_000)
        engine = vacancy.Engine(vacancy.Config.from_toml(CONFIG))

        print("1. load 'coder' and serve a request")
        coder = mgr.load("coder", 12_000)
        engine.sample("gpu0", 60_000, 81_920, at=clock())
        with engine.admit("llamacpp", now=clock()) as reservation:
            print(f"  admitted borrowed work {reservation.id[:8]}… on {reservation.resources}")
            mgr.move(coder, SlotState.SERVING)
            coder.last_used_s = clock()
        mgr.move(coder, SlotState.IDLE)

        print("2. 'vision' crashes on start; the breaker backs off")
        mgr.load("vision", 4_000, crash=True)
        try:
            mgr.load("vision", 4_000)
        except slots.SlotCrashLooping as e:
            print(f"  refused: {e.code} ({e.http_status}), retry after {e.retry_after_s}s")
            clock.t += e.retry_after_s or 0
        mgr.move(mgr.slots["vision"], SlotState.OFFLINE)
        mgr.load("vision", 4_000)  # the half-open trial succeeds
        print(f"  breaker after success: {mgr.breaker.snapshot('vision')}")

        print("3. 'agent' (pinned by default) needs room: the planner picks a victim")
        clock.t += 60
        mgr.load("agent", 10_000)
        try:
            mgr.unload("agent")
        except slots.SlotPinned as e:
            print(f"  refused: {e.code} ({e.http_status})")

        print("4. records on disk")
        for name in sorted(mgr.slots):
            rec = slots.read_state_record(slots.state_record_path(root / name))
            assert rec is not None
            print(f"  {name}: {rec.state} at t={rec.updated_at:.0f}")

        print("5. the last slot standing unloads")
        mgr.unload("agent", force=True)
        assert "ready" in slots.DISPATCHABLE_STATES
        print("done")


if __name__ == "__main__":
    main()
