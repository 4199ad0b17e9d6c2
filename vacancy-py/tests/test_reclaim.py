"""Reclaim planning through Python on simulated time: the daemon's rules."""

from __future__ import annotations

import pytest

import vacancy

RECLAIM = """
[owner]
presence = "manual"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu0.json"
reserve_mib = 1000

[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:11435"
target = "http://127.0.0.1:11434"
resource = "gpu0"
default_min_free_mib = 1000
on_owner_return = "drain"
drain_timeout_s = 30
yield_on_veto = true
"""


@pytest.fixture
def engine() -> vacancy.Engine:
    e = vacancy.Engine(vacancy.Config.from_toml(RECLAIM))
    e.set_owner_present(False)
    assert e.reclaim_step(at=0.0) == []
    e.sample("gpu0", 40_000, 80_000, at=0.5)
    return e


def test_recl_01_drain_acts_at_its_deadline_then_holds_until_done(engine: vacancy.Engine) -> None:
    job = engine.admit("ollama", now=1.0)
    engine.set_owner_present(True)
    (started,) = engine.reclaim_step(at=2.0)
    assert started["kind"] == "started" and started["mode"] == "drain"
    assert started["deadline"] == pytest.approx(32.0)
    assert started["entries"] == [job.id]
    assert engine.status(at=2.0)["reclaims"][0]["holds"] is True
    assert engine.reclaim_step(at=31.9) == []
    (act,) = engine.reclaim_step(at=32.0)
    assert act == {
        "kind": "act",
        "id": started["id"],
        "upstream": "ollama",
        "cancel": [job.id],
        "unload": True,
        "held": [],
        "cancel_held": [],
    }
    # RECL-43: the hold refuses new work even once the owner has left.
    engine.set_owner_present(False)
    engine.release(job, at=33.0)
    engine.sample("gpu0", 40_000, 80_000, at=33.5)
    with pytest.raises(vacancy.ResourceBusy) as caught:
        engine.admit("ollama", now=34.0)
    assert "yield_on_veto" in caught.value.reason
    engine.reclaim_done(started["id"], at=35.0)
    assert engine.status(at=35.0)["reclaims"] == []
    engine.sample("gpu0", 40_000, 80_000, at=35.5)  # RECL-45: a fresh sample first
    assert engine.admit("ollama", now=36.0).upstream == "ollama"


def test_recl_04_08_a_drain_stands_down_when_the_owner_leaves(engine: vacancy.Engine) -> None:
    engine.admit("ollama", now=1.0)
    engine.set_owner_present(True)
    engine.reclaim_step(at=2.0)
    engine.set_owner_present(False)
    (down,) = engine.reclaim_step(at=12.0)
    assert down["kind"] == "stood_down" and down["elapsed"] == pytest.approx(10.0)


def test_pres_02_pressure_reclaims_the_work_on_its_gpu(engine: vacancy.Engine) -> None:
    job = engine.admit("ollama", now=1.0)
    engine.set_pressure("gpu0", "engaged", cleared=False)
    engine.pressure_trigger("gpu0", "the owner's load is high")
    (started,) = engine.reclaim_step(at=2.0)
    assert started["trigger"] == "GPU pressure on gpu0: the owner's load is high"
    assert started["entries"] == [job.id]
    # RECL-06: releasing (below threshold, quiet time running) clears it.
    engine.set_pressure("gpu0", "releasing", cleared=True)
    assert engine.reclaim_step(at=3.0)[0]["kind"] == "stood_down"


def test_unknown_reclaim_ids_are_errors(engine: vacancy.Engine) -> None:
    with pytest.raises(vacancy.VacancyError):
        engine.reclaim_done("reclaim-99", at=1.0)
    with pytest.raises(vacancy.VacancyError):
        engine.reclaim_done("nonsense", at=1.0)
