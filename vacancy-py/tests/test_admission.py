"""Admission through Python on simulated time: the daemon's rules, the exceptions' shape."""

from __future__ import annotations

import pytest

import vacancy
from conftest import feed


def test_mem_02_vector_is_refused_as_insufficient_memory(engine: vacancy.Engine) -> None:
    # MEM-02: 31,000 MiB free, a 24,000 MiB reserve and an 8,000 MiB job.
    engine.sample("ram", 31_000, 64_000, at=1.0)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("llamacpp", now=1.0)
    err = caught.value
    assert not isinstance(err, vacancy.ResourceBusy)
    assert err.code == "insufficient_memory"
    assert err.http_status == 503
    assert err.retry_after_s == 10
    assert "7000 MiB" in err.reason
    assert err.details == {"resource": "ram", "observe_again": False}
    # Exactly fitting is admitted.
    engine.sample("ram", 32_000, 64_000, at=2.0)
    assert engine.admit("llamacpp", now=2.0).resources == ["ram"]


def test_adm_01_02_second_admit_is_resource_busy_retry_after_2(engine: vacancy.Engine) -> None:
    # ADM-01: one job per resource; ADM-02: the loser gets resource_busy, Retry-After 2.
    feed(engine, 1.0)
    first = engine.admit("ollama", "llama3.1:8b", now=1.0)
    assert first.upstream == "ollama" and first.model == "llama3.1:8b"
    assert first.resources == ["gpu0", "ram"]
    assert first.charges == [
        {"resource": "gpu0", "required_mib": 6000, "free_mib": 70_000},
        {"resource": "ram", "required_mib": 1000, "free_mib": 60_000},
    ]
    # ADM-03: llamacpp needs ram, which the ollama job reserved with its GPU.
    with pytest.raises(vacancy.ResourceBusy) as caught:
        engine.admit("llamacpp", now=1.1)
    err = caught.value
    assert isinstance(err, vacancy.Refused) and isinstance(err, vacancy.VacancyError)
    assert err.code == "resource_busy"
    assert err.http_status == 503
    assert err.retry_after_s == 2
    assert err.details["resource"] == "ram"
    # The holder is another borrower's job: the refusal says the resource is
    # reserved, never whose entry holds it (issue 14 item 8; status() names it).
    assert "ram is reserved by another borrowed job" in err.reason
    assert first.id not in err.reason


def test_owner_present_refuses_host_scoped_work(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    engine.set_owner_present(True)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=1.0)
    assert caught.value.code == "owner_present"
    assert caught.value.retry_after_s is None
    engine.set_owner_present(None)  # unknown refuses like present (OWN-01)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=1.0)
    assert caught.value.code == "owner_present"
    assert "presence" in caught.value.reason
    engine.set_owner_present(False)
    engine.admit("ollama", now=1.0)


def test_lending_and_resource_switches(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    engine.set_lending(False)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=1.0)
    assert caught.value.code == "lending_paused"
    engine.set_lending(True)
    engine.set_resource_enabled("gpu0", False)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=1.0)
    assert caught.value.code == "resource_disabled"
    with pytest.raises(vacancy.UnknownResource):
        engine.set_resource_enabled("gpu9", True)


def test_pressure_and_failed_samples(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    engine.set_pressure("gpu0", "the owner's game uses 90 % of the GPU")
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=1.0)
    assert caught.value.code == "pressure"
    engine.set_pressure("gpu0")
    engine.sample_failed("gpu0", "nvml: driver not loaded", at=2.0)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=2.0)
    assert caught.value.code == "capacity_unknown"
    # The borrower's reason says the sample failed; the sampler's own words
    # (an OS error, a path) are the owner's, in status.
    assert "the last sample failed" in caught.value.reason
    assert "driver not loaded" not in caught.value.reason
    gpu = next(r for r in engine.status(at=2.0)["resources"] if r["name"] == "gpu0")
    assert "driver not loaded" in (gpu["capacity_unknown"] or "")


def test_post_job_wait_with_explicit_now_raises_wait_for_sample(engine: vacancy.Engine) -> None:
    # ADM-04/06 on simulated time: the wait is exposed, not slept.
    feed(engine, 1.0)
    job = engine.admit("ollama", now=1.0)
    assert engine.release(job.id, at=2.0) == ["gpu0", "ram"]
    with pytest.raises(vacancy.WaitForSample) as caught:
        engine.admit("ollama", now=2.5)
    wait = caught.value
    assert wait.until == pytest.approx(6.5)
    assert wait.arrived_at == pytest.approx(2.5)
    assert wait.resources == ["gpu0", "ram"]
    # The sample lands; asking again with the same arrival admits.
    feed(engine, 3.0)
    engine.admit("ollama", now=3.0, arrived_at=wait.arrived_at)


def test_post_job_wait_ends_in_resource_busy_after_4_s(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    engine.release(engine.admit("ollama", now=1.0), at=2.0)
    with pytest.raises(vacancy.WaitForSample) as caught:
        engine.admit("ollama", now=2.5)
    with pytest.raises(vacancy.ResourceBusy) as busy:
        engine.admit("ollama", now=caught.value.until, arrived_at=caught.value.arrived_at)
    assert busy.value.retry_after_s == 2
    assert "within 4 s" in busy.value.reason


def test_release_outcomes_and_held_entries(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    job = engine.admit("ollama", now=1.0)
    assert engine.release(job, "uncertain", "the stream was cut", at=2.0) == []
    with pytest.raises(vacancy.EntryHeld):
        engine.release(job.id, at=2.5)
    with pytest.raises(vacancy.ResourceBusy):
        engine.admit("llamacpp", now=2.5)
    work = engine.status(at=3.0)["work"]
    assert [(w["id"], w["phase"], w["held_reason"]) for w in work] == [
        (job.id, "held", "the stream was cut")
    ]
    assert engine.release_held(job.id, at=4.0) == ["gpu0", "ram"]
    with pytest.raises(vacancy.UnknownEntry):
        engine.release(job.id, at=4.0)
    with pytest.raises(vacancy.UnknownEntry):
        engine.release("not-a-uuid", at=4.0)
    feed(engine, 5.0)
    other = engine.admit("llamacpp", now=5.0)
    with pytest.raises(vacancy.NotHeld):
        engine.release_held(other.id, at=5.0)
    assert engine.release(other.id, "not_forwarded", at=5.0) == ["ram"]
    with pytest.raises(ValueError):
        engine.release(other.id, "maybe", at=5.0)  # type: ignore[arg-type]


def test_observe_gives_resident_credit(engine: vacancy.Engine) -> None:
    # RES-01/02: a proven-resident model is charged its resident budget only.
    feed(engine, 1.0, gpu_free=5_000)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", "llama3.1:8b", now=1.0)
    assert caught.value.code == "insufficient_memory"
    assert "no resident credit" in caught.value.reason
    engine.observe("ollama", ["llama3.1:8b"], at=1.5)
    job = engine.admit("ollama", "llama3.1:8b", now=2.0)
    assert job.resident_credit
    assert job.charges[0]["required_mib"] == 500
    engine.release(job, at=3.0)
    feed(engine, 4.0, gpu_free=5_000)
    engine.observe(
        "ollama",
        [{"name": "llama3.1:8b", "ready": True, "proven": False, "reason": "every slot is busy"}],
        at=4.5,
    )
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", "llama3.1:8b", now=5.0)
    assert "every slot is busy" in caught.value.reason
    with pytest.raises(ValueError):
        engine.observe("ollama", [{"name": "x", "resdent": True}], at=5.0)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        engine.observe("ollama", "llama3.1:8b", at=5.0)
    with pytest.raises(vacancy.UnknownUpstream):
        engine.observe("vllm", [], at=5.0)


def test_foreign_work_refuses(engine: vacancy.Engine) -> None:
    # ADM-09: work the upstream runs that vacancy did not admit.
    feed(engine, 1.0)
    engine.observe("ollama", [], at=1.5, foreign_work="one running generation")
    with pytest.raises(vacancy.ResourceBusy) as caught:
        engine.admit("ollama", now=2.0)
    assert "did not admit" in caught.value.reason


def test_unknown_upstream_and_bad_arguments(engine: vacancy.Engine) -> None:
    with pytest.raises(vacancy.UnknownUpstream) as caught:
        engine.admit("vllm", now=1.0)
    assert isinstance(caught.value, LookupError)
    with pytest.raises(ValueError):
        engine.admit("ollama", now=1.0, completion="whenever")  # type: ignore[arg-type]
    with pytest.raises(vacancy.TimelineError):
        engine.sample("gpu0", 1, 2, at=-1.0)
    with pytest.raises(vacancy.TimelineError):
        engine.sample("gpu0", 1, 2, at=float("nan"))
