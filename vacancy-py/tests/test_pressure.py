"""GPU pressure through Python on simulated time: the daemon's tracker and rules."""

from __future__ import annotations

import pytest

import vacancy

PRESSURE = """
[owner]
presence = "none"

[owner.gpu_pressure]
enabled = true
poll_ms = 2000
util_threshold_pct = 25
memory_threshold_mib = 1024
engage_ms = 4000
quiet_ms = 30000

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu0.json"

[[resource]]
name = "gpu1"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu1.json"

[[resource]]
name = "ram"
kind = "memory"

[[upstream]]
name = "llm"
adapter = "llamacpp"
listen = "127.0.0.1:18081"
target = "http://127.0.0.1:18080"
resource = "gpu0"
default_min_free_mib = 1000
on_owner_return = "cancel"

[[upstream]]
name = "tts"
adapter = "openai"
listen = "127.0.0.1:18083"
target = "http://127.0.0.1:18082"
resource = "gpu1"
default_min_free_mib = 1000
"""


@pytest.fixture
def engine() -> vacancy.Engine:
    e = vacancy.Engine(vacancy.Config.from_toml(PRESSURE))
    for gpu in ("gpu0", "gpu1"):
        e.set_pressure_baseline(gpu, "unattended", util_pct=5, memory_mib=300)
        e.sample(gpu, 60_000, 80_000, at=0.0)
        assert e.pressure_sample(gpu, 5, 300, "unattended", at=0.0)["reading"] == "quiet"
    return e


def test_pres_01_03_owner_load_refuses_at_once_then_engages_and_reclaims(
    engine: vacancy.Engine,
) -> None:
    job = engine.admit("llm", now=1.0)
    # PRES-04: the first sample above the threshold refuses new work at once ...
    u = engine.pressure_sample("gpu0", 80, 6000, "unattended", at=2.0)
    assert u["reading"] == "rising" and u["trigger"] is None and not u["cleared"]
    assert "pressure engages after 4 s" in u["refuses"]
    gpu0 = [r for r in engine.status(at=2.5)["resources"] if r["name"] == "gpu0"][0]
    assert gpu0["pressure"] == u["refuses"]
    assert engine.reclaim_step(at=2.5) == []
    # ... and after engage_ms it engages: the GPU's work is reclaimed (PRES-01).
    u = engine.pressure_sample("gpu0", 80, 6000, "unattended", at=6.0)
    assert u["reading"] == "engaged"
    assert u["trigger"]["kind"] == "engaged"
    assert u["trigger"]["why"].startswith("GPU pressure on gpu0 engaged")
    started, act = engine.reclaim_step(at=6.0)
    assert started["kind"] == "started" and started["upstream"] == "llm"
    assert started["trigger"].startswith("GPU pressure on gpu0 engaged")
    assert act["kind"] == "act" and act["cancel"] == [job.id]


def test_pres_02_only_work_on_the_pressured_gpu_is_touched(engine: vacancy.Engine) -> None:
    tts = engine.admit("tts", now=1.0)
    engine.pressure_sample("gpu0", 80, 6000, "unattended", at=2.0)
    engine.pressure_sample("gpu0", 80, 6000, "unattended", at=6.0)
    assert engine.reclaim_step(at=6.0) == []  # nothing runs on gpu0
    assert engine.status(at=6.0)["upstreams"]
    engine.release(tts.id, at=7.0)
    engine.sample("gpu1", 60_000, 80_000, at=7.5)
    engine.admit("tts", now=8.0)  # gpu1 keeps lending


def test_pres_04_05_a_failed_read_refuses_at_once_and_reclaims_after_the_gap(
    engine: vacancy.Engine,
) -> None:
    job = engine.admit("llm", now=1.0)
    u = engine.pressure_miss("gpu0", "NVML: GPU is lost", at=2.0)
    assert u["reading"] == "unavailable" and "GPU is lost" in u["refuses"]
    assert u["trigger"] is None and not u["cleared"]
    assert engine.reclaim_step(at=2.0) == []
    # The gap limit (3 x poll_ms, at least 20 s) counts from the last good sample.
    for t in range(4, 20, 2):
        assert engine.pressure_miss("gpu0", "NVML: GPU is lost", at=float(t))["trigger"] is None
    u = engine.pressure_miss("gpu0", "NVML: GPU is lost", at=20.0)
    assert u["trigger"]["kind"] == "gap"
    started, act = engine.reclaim_step(at=20.0)
    assert act["cancel"] == [job.id]


def test_pres_08_release_needs_quiet_time_and_only_then_admits(engine: vacancy.Engine) -> None:
    engine.pressure_sample("gpu0", 80, 6000, "unattended", at=2.0)
    engine.pressure_sample("gpu0", 80, 6000, "unattended", at=6.0)
    u = engine.pressure_sample("gpu0", 5, 300, "unattended", at=8.0)
    # Releasing: still refusing new work, but a pressure reclaim may stand down (RECL-06).
    assert u["reading"] == "releasing" and u["refuses"] and u["cleared"]
    engine.sample("gpu0", 60_000, 80_000, at=8.5)
    with pytest.raises(vacancy.Refused) as refused:
        engine.admit("llm", now=9.0)
    assert refused.value.code == "pressure"
    assert "releasing" in refused.value.reason
    t = 8.0
    while t < 38.0:
        t += 2.0
        u = engine.pressure_sample("gpu0", 5, 300, "unattended", at=t)
        if u["reading"] == "quiet":
            break
    assert u["reading"] == "quiet" and u["refuses"] is None
    assert t == pytest.approx(38.0)
    engine.sample("gpu0", 60_000, 80_000, at=t)
    engine.admit("llm", now=t + 0.1)


def test_pres_03_a_gpu_without_a_baseline_for_the_attendance_is_uncalibrated(
    engine: vacancy.Engine,
) -> None:
    u = engine.pressure_sample("gpu0", 5, 300, "attended", at=1.0)
    assert u["reading"] == "uncalibrated" and u["trigger"]["kind"] == "uncalibrated"
    assert "calibrate-pressure --resource gpu0 --attended" in u["refuses"]
    engine.set_pressure_baseline("gpu0", "attended", util_pct=20, memory_mib=2000)
    assert engine.pressure_sample("gpu0", 25, 2500, "attended", at=3.0)["reading"] == "quiet"


def test_bad_pressure_input_is_refused_with_the_reason(engine: vacancy.Engine) -> None:
    with pytest.raises(ValueError, match="percentage"):
        engine.pressure_sample("gpu0", 101, 0, "unattended", at=1.0)
    with pytest.raises(ValueError, match="attended"):
        engine.pressure_sample("gpu0", 1, 0, "present", at=1.0)
    with pytest.raises(ValueError, match="GPUs only"):
        engine.pressure_sample("ram", 1, 0, "unattended", at=1.0)
    with pytest.raises(vacancy.UnknownResource):
        engine.pressure_miss("gpu9", at=1.0)


def test_scope_09_without_pressure_enabled_there_is_no_tracker() -> None:
    off = PRESSURE.replace("enabled = true", "enabled = false")
    e = vacancy.Engine(vacancy.Config.from_toml(off))
    with pytest.raises(ValueError, match="off in this configuration"):
        e.pressure_sample("gpu0", 90, 9000, "unattended", at=1.0)
    with pytest.raises(ValueError, match="off in this configuration"):
        e.set_pressure_baseline("gpu0", "unattended", util_pct=0, memory_mib=0)
