"""The daemon's samplers, presence backends and loops from Python (issue 23 item 1).

Real samplers only: the file sampler on a file the test writes, the system
memory sampler, the command presence backend running real commands.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from collections.abc import Callable, Iterator

import pytest

import vacancy

BOUND_S = 10.0  # every wait for an event is bounded by this


def wait_for(what: str, cond: Callable[[], bool], bound_s: float = BOUND_S) -> None:
    end = time.monotonic() + bound_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {bound_s} s: {what}")
        time.sleep(0.01)


def write_capacity(path: pathlib.Path, free_mib: int, total_mib: int = 24_000) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"free_mib": free_mib, "total_mib": total_mib}))
    tmp.replace(path)


def config(gpu_file: pathlib.Path, *, gpu_poll_ms: int, ram_poll_ms: int = 300,
           presence: str = 'presence = "none"') -> vacancy.Config:  # fmt: skip
    return vacancy.Config.for_engine(f"""
[owner]
{presence}

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{gpu_file}"
poll_ms = {gpu_poll_ms}
max_sample_age_ms = 60000
reserve_mib = 512

[[resource]]
name = "ram"
kind = "memory"
sampler = "system"
poll_ms = {ram_poll_ms}

[[resource]]
name = "fed"
kind = "memory"

[[upstream]]
name = "llm"
resource = "gpu0"
default_min_free_mib = 4000
""")


@pytest.fixture
def gpu_file(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    path = tmp_path / "gpu0.json"
    write_capacity(path, 20_000)
    yield path


def resource(engine: vacancy.Engine, name: str) -> vacancy.ResourceStatus:
    return next(r for r in engine.status()["resources"] if r["name"] == name)


def test_sample_now_runs_the_configured_samplers(gpu_file: pathlib.Path) -> None:
    engine = vacancy.Engine(config(gpu_file, gpu_poll_ms=1000))
    assert resource(engine, "gpu0")["free_mib"] is None
    assert engine.sample_now() == {"gpu0": None, "ram": None}  # "fed" is manual
    gpu = resource(engine, "gpu0")
    assert (gpu["free_mib"], gpu["total_mib"]) == (20_000, 24_000)
    ram = resource(engine, "ram")
    assert ram["total_mib"] is not None and ram["total_mib"] > 0
    write_capacity(gpu_file, 9_000)
    assert engine.sample_now("gpu0") == {"gpu0": None}
    assert resource(engine, "gpu0")["free_mib"] == 9_000
    # A failed sample surfaces as sample_failed does: capacity unknown, with why.
    gpu_file.unlink()
    (why,) = engine.sample_now("gpu0").values()
    assert why is not None and "gpu0.json" in why
    assert resource(engine, "gpu0")["capacity_unknown"] is not None
    with pytest.raises(vacancy.Refused) as info:
        engine.admit("llm")
    assert info.value.code == "capacity_unknown"


def test_the_driver_keeps_samples_as_fresh_as_the_configured_interval(
    gpu_file: pathlib.Path,
) -> None:
    # The acceptance check: the sample ages the driver reaches, against poll_ms.
    engine = vacancy.Engine(config(gpu_file, gpu_poll_ms=200, ram_poll_ms=300))
    with vacancy.Driver(engine) as driver:
        assert driver.running and sorted(driver.resources) == ["gpu0", "ram"]
        ages: dict[str, list[int]] = {"gpu0": [], "ram": []}
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            for r in engine.status()["resources"]:
                if r["name"] in ages:
                    age = r["sample_age_ms"]
                    assert age is not None, "sampled before Driver() returned"
                    ages[r["name"]].append(age)
            time.sleep(0.01)
    assert not driver.running
    for name, poll_ms in (("gpu0", 200), ("ram", 300)):
        worst = max(ages[name])
        # Never older than one interval plus scheduling slack (the daemon's
        # own freshness), and it does reach the interval: it samples every
        # poll_ms, not in a busy loop.
        assert worst <= poll_ms + 250, (name, worst, poll_ms)
        assert worst >= poll_ms // 2, (name, worst, poll_ms)
    assert resource(engine, "fed")["sample_age_ms"] is None  # manual: left alone


def test_the_driver_samples_right_after_a_job_ends(gpu_file: pathlib.Path) -> None:
    # poll_ms is a minute: only the post-job trigger (ADM-05) can sample in time.
    engine = vacancy.Engine(config(gpu_file, gpu_poll_ms=60_000))
    with vacancy.Driver(engine):
        for _ in range(3):
            with engine.admit("llm") as job:
                assert job.resources == ["gpu0"]
            # The next admit waits for the post-job sample, which the driver
            # takes at once; without it this raises ResourceBusy after 4 s.
            engine.admit("llm").__exit__(None, None, None)


def test_the_driver_never_needs_the_gil(gpu_file: pathlib.Path) -> None:
    # With a huge switch interval no other Python thread runs while this one
    # spins; the driver's Rust thread samples on regardless.
    engine = vacancy.Engine(config(gpu_file, gpu_poll_ms=100))
    with vacancy.Driver(engine):
        old = sys.getswitchinterval()
        sys.setswitchinterval(100.0)
        try:
            first = resource(engine, "gpu0")["sample_age_ms"]
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                pass
            age = resource(engine, "gpu0")["sample_age_ms"]
        finally:
            sys.setswitchinterval(old)
    assert first is not None and age is not None
    assert age <= 100 + 250, f"the sampler stalled for {age} ms while Python held the GIL"


def test_driver_failures_surface_and_recover(gpu_file: pathlib.Path) -> None:
    gpu_file.unlink()
    engine = vacancy.Engine(config(gpu_file, gpu_poll_ms=100))
    with vacancy.Driver(engine):
        why = resource(engine, "gpu0")["capacity_unknown"]
        assert why is not None and "gpu0.json" in why
        with pytest.raises(vacancy.Refused) as info:
            engine.admit("llm")
        assert info.value.code == "capacity_unknown"
        write_capacity(gpu_file, 20_000)
        wait_for("capacity known", lambda: resource(engine, "gpu0")["capacity_unknown"] is None)
        engine.admit("llm").__exit__(None, None, None)


def test_poll_presence_runs_the_configured_backend(gpu_file: pathlib.Path) -> None:
    for command, expected, owner in (("true", True, "present"), ("false", False, "away"),
                                     ("exit 7", None, "unknown")):  # fmt: skip
        engine = vacancy.Engine(
            config(gpu_file, gpu_poll_ms=1000,
                   presence=f'presence = "command"\ncommand = "{command}"')  # fmt: skip
        )
        assert engine.presence_backend == "command"
        assert engine.poll_presence() is expected
        assert engine.status()["owner"] == owner


def test_the_driver_runs_the_presence_backend(gpu_file: pathlib.Path) -> None:
    engine = vacancy.Engine(
        config(gpu_file, gpu_poll_ms=1000, presence='presence = "command"\ncommand = "false"')
    )
    assert engine.status()["owner"] == "unknown"  # an engine starts unknown
    with vacancy.Driver(engine):
        assert engine.status()["owner"] == "away"  # read before Driver() returned
        engine.set_owner_present(True)  # the backend's next poll replaces it
        wait_for("presence polled again", lambda: engine.status()["owner"] == "away")


def test_manual_presence_is_kept_by_the_driver(gpu_file: pathlib.Path) -> None:
    engine = vacancy.Engine(config(gpu_file, gpu_poll_ms=1000, presence='presence = "manual"'))
    with vacancy.Driver(engine):
        assert engine.status()["owner"] == "unknown"
        engine.set_owner_present(False)
        time.sleep(1.5)  # longer than the presence interval: a poll happened
        assert engine.status()["owner"] == "away"
        assert engine.poll_presence() is False


def test_a_driver_needs_the_real_clock_and_stops_cleanly(gpu_file: pathlib.Path) -> None:
    real = vacancy.Engine(config(gpu_file, gpu_poll_ms=1000))
    real.now()  # now() without a time fixes the real clock
    simulated = vacancy.Engine(config(gpu_file, gpu_poll_ms=1000))
    simulated.sample("fed", 1, 2, at=1.0)
    with pytest.raises(vacancy.TimelineError):
        vacancy.Driver(simulated)
    with pytest.raises(vacancy.TimelineError):
        simulated.sample_now()
    driver = vacancy.Driver(real)
    assert driver.running
    driver.stop()
    driver.stop()  # twice is fine
    assert not driver.running
    assert "running=False" in repr(driver)


def test_an_nvml_gpu_without_a_driver_is_a_sample_failure() -> None:  # or sampled with one
    # The wheel carries the daemon's NVML sampler; on a machine without the
    # NVIDIA driver (this one) every sample fails saying why, as in the daemon.
    engine = vacancy.Engine(vacancy.Config.for_engine("""
[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "nvml"
device = "0"

[[upstream]]
name = "llm"
resource = "gpu0"
default_min_free_mib = 1
"""))
    (why,) = engine.sample_now().values()
    if why is None:  # a machine with the driver and a GPU 0: NVML sampled it
        assert resource(engine, "gpu0")["total_mib"], "NVML reported a GPU"
        return
    assert "libnvidia-ml" in why and "rebuild" not in why, why
    with pytest.raises(vacancy.Refused) as info:
        engine.admit("llm")
    assert info.value.code == "capacity_unknown"
