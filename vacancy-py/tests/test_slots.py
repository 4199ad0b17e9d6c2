"""vacancy.slots: hal0's slot lifecycle rules from Python (rule IDs of hal0's catalog)."""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

import vacancy
from vacancy import slots
from vacancy.slots import SlotState

S = SlotState

# ---- states (SLOT-01, SLOT-15) ------------------------------------------------

LEGAL = {
    S.OFFLINE: {S.PULLING, S.STARTING},
    S.PULLING: {S.STARTING, S.ERROR, S.OFFLINE},
    S.STARTING: {S.WARMING, S.ERROR, S.OFFLINE},
    S.WARMING: {S.READY, S.IDLE, S.ERROR, S.OFFLINE},
    S.READY: {S.SERVING, S.IDLE, S.UNLOADING, S.ERROR},
    S.SERVING: {S.READY, S.IDLE, S.ERROR},
    S.IDLE: {S.SERVING, S.UNLOADING, S.READY},
    S.UNLOADING: {S.OFFLINE, S.ERROR},
    S.ERROR: {S.OFFLINE, S.PULLING, S.STARTING},
}


def test_slot_state_is_a_str_enum() -> None:
    assert S.READY == "ready"  # type: ignore[comparison-overlap]
    assert S("idle") is S.IDLE
    assert [str(s) for s in S] == [
        "offline", "pulling", "starting", "warming", "ready",
        "serving", "idle", "unloading", "error",
    ]  # fmt: skip


def test_legal_transitions_table_matches_slot_15_to_24() -> None:
    assert {k: set(v) for k, v in slots.LEGAL_TRANSITIONS.items()} == LEGAL
    assert all(isinstance(v, frozenset) for v in slots.LEGAL_TRANSITIONS.values())


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(list(S), list(S))))
def test_slot_15_to_24_every_pair(src: SlotState, dst: SlotState) -> None:
    if dst in LEGAL[src]:
        slots.check_transition(src, dst)
        slots.check_transition(str(src), str(dst))  # plain strings work too
    else:
        with pytest.raises(slots.IllegalSlotTransition) as info:
            slots.check_transition(src, dst)
        err = info.value
        assert isinstance(err, slots.SlotError) and isinstance(err, vacancy.VacancyError)
        assert (err.code, err.http_status) == ("slot.illegal_transition", 409)
        assert err.details == {"from": str(src), "to": str(dst)}
        assert err.retry_after_s is None


def test_unknown_state_string_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown slot state"):
        slots.check_transition("bogus", "ready")


def test_dispatchable_states() -> None:
    assert "ready" in slots.DISPATCHABLE_STATES
    assert S.SERVING in slots.DISPATCHABLE_STATES
    assert slots.DISPATCHABLE_STATES == frozenset({S.READY, S.SERVING, S.IDLE})
    assert "warming" not in slots.DISPATCHABLE_STATES


def test_slot_27_28_selection_rank_unknown_ranks_with_error() -> None:
    assert [slots.selection_rank(s) for s in ("ready", "serving", "idle")] == [0, 0, 0]
    assert [slots.selection_rank(s) for s in ("warming", "starting", "pulling")] == [1, 1, 1]
    assert [slots.selection_rank(s) for s in ("offline", "unloading")] == [2, 2]
    assert slots.selection_rank("error") == 3
    assert slots.selection_rank("no-such-state") == 3
    ordered = slots.sort_by_selection(
        [("a", "error"), ("b", "zzz"), ("c", "idle"), ("d", "warming")], lambda c: c[1]
    )
    assert [c[0] for c in ordered] == ["c", "d", "a", "b"]


def test_health_and_exit_outcomes() -> None:
    assert slots.state_after_health("ready") is S.READY
    assert slots.state_after_health("empty_models") is S.IDLE
    assert slots.state_after_health("unresolved") is S.WARMING
    assert slots.state_after_exit("crashed") is S.ERROR
    assert slots.state_after_exit("clean_stop") is S.OFFLINE
    with pytest.raises(ValueError):
        slots.state_after_exit("exploded")  # type: ignore[arg-type]


# ---- breaker (BRK) ---------------------------------------------------------------


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_brk_02_03_cooldowns_for_1_to_6_failures() -> None:
    clock = FakeClock()
    b = slots.CrashLoopBreaker(clock)
    expected = [(5, "backoff"), (10, "backoff"), (20, "backoff"), (40, "backoff"),
                (300, "parked"), (600, "parked")]  # fmt: skip
    for n, (cooldown, state) in enumerate(expected, start=1):
        snap = b.record_failure("agent")
        assert snap == {"state": state, "failures": n, "retry_after_s": cooldown,
                        "trial_in_flight": False}  # fmt: skip
        assert slots.cooldown_s(n) == cooldown
        with pytest.raises(slots.SlotCrashLooping) as info:
            b.check("agent")
        err = info.value
        assert (err.code, err.http_status, err.retry_after_s) == (
            "slot.crash_looping", 503, cooldown,
        )  # fmt: skip
        assert err.details["state"] == state and err.details["failures"] == n
        # BRK-08: retry_after_s is the remaining cooldown, rounded up.
        clock.t += cooldown - 0.5
        with pytest.raises(slots.SlotCrashLooping) as info:
            b.check("agent")
        assert info.value.retry_after_s == 1
        clock.t += 0.5
    assert slots.cooldown_s(20) == slots.PARK_CAP_S


def test_brk_04_half_open_admits_one_trial() -> None:
    clock = FakeClock(100.0)
    b = slots.CrashLoopBreaker(clock)
    b.record_failure("agent")
    with pytest.raises(slots.SlotCrashLooping) as info:
        b.check("agent", now=102.0)
    assert info.value.retry_after_s == 3
    clock.t = 105.0
    assert b.state("agent") == "half-open"
    b.check("agent")  # the trial
    with pytest.raises(slots.SlotCrashLooping) as info:
        b.check("agent")  # a second check while the trial runs
    assert info.value.details["state"] == "half-open"
    # BRK-06: a failed trial re-arms at the next step.
    assert b.record_failure("agent")["retry_after_s"] == 10
    # BRK-05: a successful one closes it.
    clock.t += 10
    b.check("agent")
    b.record_success("agent")
    assert b.state("agent") == "closed" and b.failures("agent") == 0
    b.check("agent")


def test_brk_04_an_unrecorded_trial_expires_and_the_snapshot_says_it_is_out() -> None:
    # A scheduler checks, its admission is refused, it never loads and never
    # records the trial: the slot must not stay locked (10 000 s later it is free).
    clock = FakeClock(0.0)
    b = slots.CrashLoopBreaker(clock)
    assert b.trial_budget_s == slots.DEFAULT_TRIAL_BUDGET_S
    b.record_failure("llm")
    clock.t = 5.0
    b.check("llm")  # takes the trial
    clock.t = 6.0
    snap = b.snapshot("llm")
    assert snap is not None and snap["state"] == "half-open" and snap["trial_in_flight"]
    left = math.ceil(slots.DEFAULT_TRIAL_BUDGET_S - 1.0)
    assert snap["retry_after_s"] == left
    with pytest.raises(slots.SlotCrashLooping) as info:
        b.check("llm")
    assert info.value.retry_after_s == left
    assert f"{left}" in str(info.value)
    clock.t = 10_000.0
    snap = b.snapshot("llm")
    assert snap is not None and not snap["trial_in_flight"] and snap["retry_after_s"] == 0
    b.check("llm")  # the expired trial is taken again


def test_brk_04_a_trial_given_back_is_free_at_once() -> None:
    b = slots.CrashLoopBreaker(FakeClock(0.0), trial_budget_s=60.0)
    b.record_failure("llm", now=0.0)
    b.check("llm", now=5.0)
    with pytest.raises(slots.SlotCrashLooping) as info:
        b.check("llm", now=20.0)
    assert info.value.retry_after_s == 45
    b.give_back_trial("llm")  # admission was refused: the load never ran
    b.check("llm", now=20.0)
    assert b.failures("llm") == 1
    with pytest.raises(ValueError, match="trial_budget_s"):
        slots.CrashLoopBreaker(trial_budget_s=-1.0)


def test_brk_09_reset_and_seeding_and_snapshot() -> None:
    clock = FakeClock(50.0)
    b = slots.CrashLoopBreaker(clock)
    # BRK-12: no snapshot (no metadata.breaker) while closed.
    assert b.snapshot("s") is None
    b.seed("s", 5, 40.0)  # persisted: 5 failures, last at t=40
    assert b.seed_of("s") == (5, 40.0)
    parked = {"state": "parked", "failures": 5, "retry_after_s": 290, "trial_in_flight": False}
    assert b.snapshot("s") == parked
    metadata: dict[str, object] = {"other": 1}
    b.stamp_metadata("s", metadata)
    assert metadata["breaker"] == parked
    b.reset("s")  # BRK-09
    assert b.snapshot("s") is None and b.seed_of("s") is None
    b.stamp_metadata("s", metadata)
    assert metadata == {"other": 1}
    b.seed("s", 0, 0.0)
    assert b.state("s") == "closed"


def test_breaker_default_clock_and_bad_clock() -> None:
    b = slots.CrashLoopBreaker()
    assert b.record_failure("x")["failures"] == 1
    with pytest.raises(TypeError):
        slots.CrashLoopBreaker(42)  # type: ignore[arg-type]
    bad = slots.CrashLoopBreaker(lambda: float("nan"))
    with pytest.raises(ValueError):
        bad.check("x")

    def broken() -> float:
        raise RuntimeError("clock broke")

    with pytest.raises(RuntimeError, match="clock broke"):
        slots.CrashLoopBreaker(broken).record_failure("x")


def test_breaker_clock_may_use_the_breaker() -> None:
    # The clock runs before the breaker's lock is taken: calling back in cannot deadlock.
    holder: list[slots.CrashLoopBreaker] = []

    def clock() -> float:
        if holder:
            holder[0].failures("k")
        return 10.0

    b = slots.CrashLoopBreaker(clock)
    holder.append(b)
    b.record_failure("k")
    assert b.snapshot("k") is not None


# ---- errors (SERR) -----------------------------------------------------------------


def test_serr_codes_and_statuses() -> None:
    with pytest.raises(slots.SlotPinned) as pinned:
        slots.check_pinned("agent")
    assert (pinned.value.code, pinned.value.http_status) == ("slot.pinned", 409)
    assert pinned.value.to_json()["details"] == {"slot": "agent", "action": "unload"}
    with pytest.raises(slots.SlotTuningKeyDenied) as denied:
        slots.guard_slot_write_payload({"model": {"context_size": 8192}})
    assert (denied.value.code, denied.value.http_status) == ("slot.tuning_key_denied", 400)
    assert isinstance(denied.value, ValueError)
    assert slots.SlotIllegalTransition is slots.IllegalSlotTransition


# ---- eviction (EVICT, SERR-10, SERR-11) ----------------------------------------------


def cand(name: str, **kw: object) -> slots.EvictionCandidate:
    base: dict[str, object] = {"state": "idle", "resident_mib": 4000}
    base.update(kw)
    return slots.EvictionCandidate(name, **base)  # type: ignore[arg-type]


def test_evict_order_priority_then_lru_and_filters() -> None:
    pool = [
        cand("agent", last_used_s=1.0),  # EVICT-08: default-pinned anchor
        cand("a", priority=50, last_used_s=30.0),
        cand("b", priority=10, last_used_s=90.0),  # EVICT-04: lowest priority first
        cand("c", priority=50, last_used_s=20.0),  # EVICT-05: then least recently used
        cand("d", in_flight=1),  # EVICT-09: busy
        cand("e", state="warming"),  # EVICT-10: not resident
        cand("f", pinned=True),  # EVICT-07
        cand("g", priority=100, last_used_s=0.0),  # EVICT-06: 100 is still a candidate
        cand("h", priority=500, last_used_s=1.0),  # EVICT-02: clamped to 100
    ]
    order = slots.eviction_order(pool)
    assert [c.name for c in order] == ["b", "c", "a", "g", "h"]
    assert order[0] is pool[2]  # the same objects come back
    assert slots.eviction_order([{"name": "agent", "state": "ready", "pinned": False}])
    assert not slots.is_eviction_candidate(pool[0])
    assert slots.is_pinned("agent") and not slots.is_pinned("agent", False)


def test_evict_preload_planner() -> None:
    pool = [cand("a", priority=10, resident_mib=3000), cand("b", priority=20, resident_mib=5000)]
    plan = slots.plan_preload_eviction(pool, 6000, free_mib=2000)
    assert plan == slots.EvictionPlan(victims=["a", "b"], freed_mib=8000, fits=True)
    assert slots.plan_preload_eviction(pool, 4000, free_mib=2000).victims == ["a"]
    nofit = slots.plan_preload_eviction(pool, 60_000, free_mib=2000)
    assert nofit == slots.EvictionPlan(victims=[], freed_mib=0, fits=False)
    capped = slots.plan_preload_eviction(pool, 6000, free_mib=2000, max_victims=1)
    assert not capped.fits


def test_serr_11_pinned_and_force() -> None:
    slots.check_pinned("agent", force=True)
    slots.check_pinned("worker")
    with pytest.raises(slots.SlotPinned) as info:
        slots.check_pinned("worker", True, action="delete")
    assert info.value.details["action"] == "delete"


def test_serr_10_npu_exclusivity() -> None:
    holder = slots.SlotPlacement("npu1", "npu", "llm", "qwen")
    other = {"name": "npu2", "device": "npu", "type": "llm", "model_default": "phi"}
    with pytest.raises(slots.NpuExclusivityViolation) as info:
        slots.check_npu_exclusivity(other, [holder])
    assert info.value.http_status == 409 and info.value.details["holder"] == "npu1"
    slots.check_npu_exclusivity({**other, "model_default": ""}, [holder])
    slots.check_npu_exclusivity(holder, [holder])  # itself is not a second one


def test_evict_11_12_retired_lru() -> None:
    with pytest.raises(slots.SlotConfigError) as info:
        slots.reject_retired_lru({"eviction": {"lru": True}})
    assert info.value.details["key"] == "eviction.lru"
    slots.reject_retired_lru({"priority": 10})
    warnings = slots.LruRetirementWarnings()
    assert warnings.note_file("a", {"lru": True}) is True
    assert warnings.note_file("a", {"lru": True}) is False  # once per slot
    assert warnings.warned("a") and not warnings.warned("b")
    assert slots.priority_from_value(None) == slots.DEFAULT_PRIORITY == 50
    assert slots.priority_from_value(250) == 100
    assert slots.validate_priority(None) == 50
    with pytest.raises(slots.SlotConfigError):
        slots.validate_priority(101)


# ---- records (PERS) ---------------------------------------------------------------------


def test_pers_round_trip(tmp_path: Path) -> None:
    path = slots.state_record_path(tmp_path / "agent")
    assert path == os.fspath(tmp_path / "agent" / slots.STATE_FILE_NAME)
    assert slots.read_state_record(path) is None
    rec = slots.SlotStateRecord(
        "agent", S.READY, 1_700_000_000.5, model_id="qwen", port=8081,
        extra={"breaker": {"state": "backoff", "failures": 1, "retry_after_s": 5}},
    )  # fmt: skip
    slots.write_state_record(path, rec)
    back = slots.read_state_record(path)
    assert back == rec and back is not None and back.state is S.READY
    assert json.loads(Path(path).read_text())["state"] == "ready"
    assert not [p for p in os.listdir(tmp_path / "agent") if p.endswith(".tmp")]


@pytest.mark.parametrize("text", ['{"name": "agent", "state": "rea', "not json", '{"name": 1}'])
def test_pers_torn_file_is_a_typed_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(slots.StateRecordCorrupt) as info:
        slots.read_state_record(path)
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert isinstance(info.value, slots.StateRecordError) and isinstance(info.value, ValueError)


def test_pers_unwritable_is_an_io_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rec = slots.SlotStateRecord("a", S.OFFLINE, 1.0)
    with pytest.raises(slots.StateRecordIOError) as info:
        slots.write_state_record(blocker / "state.json", rec)
    assert isinstance(info.value, OSError) and str(blocker) in str(info.value)


# ---- slot-write guards, activation, autoload (SLOTCFG-02..17) ------------------------------


def test_slotcfg_guards() -> None:
    slots.guard_slot_write_payload({"model": {"default": "qwen"}, "priority": 10})
    with pytest.raises(slots.SlotTuningKeyDenied) as t:
        slots.guard_slot_write_payload({"server": {"extra_args": ["-fa"]}, "parallel": 2})
    assert t.value.details["keys"] == ["parallel", "server.extra_args"]
    with pytest.raises(slots.SlotLlamaEnvDenied) as e:
        slots.guard_slot_write_payload({"server": {"env": {"LLAMA_ARG_CTX_SIZE": "1", "X": "2"}}})
    assert e.value.details["keys"] == ["LLAMA_ARG_CTX_SIZE"]
    with pytest.raises(slots.SlotRemovedKeyDenied):
        slots.guard_slot_write_payload({"enabled": True})
    with pytest.raises(slots.SlotUnconverted) as u:
        slots.check_unconverted("agent", {"model": {"ctx_size": 4096}}, file="agent.toml")
    assert u.value.details == {"slot": "agent", "file": "agent.toml", "keys": ["model.ctx_size"]}
    blocked = slots.conversion_blocked({"model": {"ctx_size": 4096}})
    assert blocked is not None and blocked.keys == ["model.ctx_size"]
    assert slots.conversion_blocked({}) is None
    with pytest.raises(TypeError):
        slots.guard_slot_write_payload({"x": object()})


def test_slotcfg_activation_and_autoload() -> None:
    assert slots.bound_model({"model": {"default": "qwen"}}) == "qwen"
    assert not slots.is_activated({"model": {"default": ""}})
    assert slots.resolve_autoload({"model": {"default": "q"}}) == slots.Autoload(True, True)
    assert slots.resolve_autoload({"autoload": False}) == slots.Autoload(False, False)
    with pytest.raises(slots.SlotConfigError):
        slots.resolve_autoload({"autoload": "yes"})
    assert slots.autoload_for_create() is False


# ---- budget (SLOTCFG-20, SLOTCFG-21) --------------------------------------------------------


def test_slotcfg_20_21_lifecycle_budget() -> None:
    kw = {"health_poll_s": 100.0, "output_sanity_cpu_s": 150.0, "unload_s": 10.0}
    load = (100 + 150 + 3 * 10) * slots.LIFECYCLE_OVERHEAD
    assert slots.slot_lifecycle_budget("load", **kw) == pytest.approx(load)
    assert slots.slot_lifecycle_budget("unload", **kw) == pytest.approx(10 * 1.15)
    assert slots.slot_lifecycle_budget("swap", **kw) == pytest.approx(load + 10 * 1.15)
    with pytest.raises(ValueError):
        slots.slot_lifecycle_budget("fly", **kw)  # type: ignore[arg-type]


# ---- launch argv (SLOTCFG-22..29) -------------------------------------------------------------


def test_slotcfg_22_argv_with_provenance() -> None:
    r = slots.compose_launch_argv(
        "llama-server",
        {
            "slot": ["-c", "4096"],
            "base": ["--host", "127.0.0.1", "--ctx-size", "2048", "-ngl", "99"],
            "profile": [slots.LaunchFlag("--flash-attn", ("on",))],
        },
    )
    assert r.argv == [
        "llama-server", "--host", "127.0.0.1", "-ngl", "99", "--flash-attn", "on", "-c", "4096",
    ]  # fmt: skip
    assert r.provenance == {"--host": "base", "-ngl": "base", "--flash-attn": "profile", "-c": "slot"}
    assert r.to_json()["provenance"]["-c"] == "slot"
    assert slots.parse_launch_args(["--ctx-size=8192", "-ngl", "99", "--no-mmap"]) == [
        slots.LaunchFlag("--ctx-size", ("8192",)),
        slots.LaunchFlag("-ngl", ("99",)),
        slots.LaunchFlag("--no-mmap", ()),
    ]
    assert slots.canonical_flag("-c") == "--ctx-size"
    assert slots.llama_device_arg("rocm") == "ROCm0" and slots.llama_device_arg("npu") is None
    with pytest.raises(ValueError):
        slots.compose_launch_argv(None, {"nope": []})
    with pytest.raises(TypeError):
        slots.compose_launch_argv(None, {"base": ["-c", slots.LaunchFlag("-t", ("4",))]})


# ---- providers (PROV-01) ------------------------------------------------------------------------


def test_prov_01_self_managed() -> None:
    assert "kokoro" in slots.SELF_MANAGED_PROVIDERS
    assert not slots.provider_requires_model("kokoro")
    assert slots.provider_requires_model("llamacpp")


# ---- output-sanity gate (GATE) ---------------------------------------------------------------------


class FakeLlama(BaseHTTPRequestHandler):
    answer = "Paris"
    paths: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).paths.append(self.path)
        if self.path == "/completion":
            body: dict[str, object] = {"content": f" {self.answer}."}
        else:
            body = {
                "choices": [
                    {"message": {"content": self.answer}, "finish_reason": "stop"},
                ]
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_llama() -> Iterator[tuple[str, type[FakeLlama]]]:
    handler = type("Handler", (FakeLlama,), {"paths": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


FAST = slots.GateOptions(completion_timeout_s=5.0, chat_timeout_s=5.0)


def test_gate_02_paris_passes(fake_llama: tuple[str, type[FakeLlama]]) -> None:
    url, handler = fake_llama
    outcome = slots.check_output_sanity(url, FAST)
    assert outcome.passed and outcome.kind == "passed" and outcome.probe == "completion"
    assert outcome.next_state is S.READY and outcome.clears_verdict
    assert outcome.load_error is None and outcome.error("agent") is None
    assert handler.paths == ["/completion"]


def test_gate_05_london_twice_is_wrong(fake_llama: tuple[str, type[FakeLlama]]) -> None:
    url, handler = fake_llama
    handler.answer = "London"
    outcome = slots.check_output_sanity(url, FAST)
    assert outcome.kind == "wrong" and outcome.next_state is S.ERROR
    assert (outcome.expected, outcome.actual, outcome.probe) == (
        "Paris", "London", "chat_completions",
    )  # fmt: skip
    assert [p for p, _ in outcome.heard] == ["completion", "chat_completions"]
    assert "London" in outcome.message and "Paris" in outcome.message
    assert "/completion" in outcome.message and "/v1/chat/completions" in outcome.message
    assert outcome.stops_unit and outcome.records_verdict
    assert outcome.load_error == (500, "SlotOutputSanityFailed")
    err = outcome.error("agent")
    assert isinstance(err, slots.SlotOutputSanityFailed) and err.http_status == 500
    assert handler.paths == ["/completion", "/v1/chat/completions"]


def test_gate_09_closed_port_is_unanswered() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome = slots.check_output_sanity(f"http://127.0.0.1:{port}", FAST)
    assert outcome.kind == "unanswered" and outcome.next_state is S.WARMING
    assert not outcome.stops_unit and outcome.reason and str(port) in outcome.reason


def test_gate_releases_the_gil(fake_llama: tuple[str, type[FakeLlama]]) -> None:
    # The fake server runs in a Python thread: the gate can only hear it if the
    # calling thread released the GIL while it waited.
    url, _ = fake_llama
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(slots.check_output_sanity(url, FAST)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.kind for r in results] == ["passed"] * 4


def test_gate_options_and_is_gated() -> None:
    assert slots.GateOptions() == slots.GateOptions.accelerated()
    cpu = slots.GateOptions.for_device(" CPU ")
    assert cpu.lane == "cpu" and cpu.completion_timeout_s == 180.0 and cpu.worst_case_s == 900.0
    assert slots.is_gated("llm")
    assert not slots.is_gated("embedding")
    assert not slots.is_gated("llm", "flm_npu")
    assert not slots.is_gated("llm", box_switch=" 0 ")
    assert not slots.is_gated("llm", slot_switch=False)
    with pytest.raises(ValueError):
        slots.check_output_sanity("http://127.0.0.1:1", slots.GateOptions(chat_timeout_s=0.0))
