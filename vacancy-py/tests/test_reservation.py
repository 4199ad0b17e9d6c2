"""Reservation as a context manager, and the status dict's shape."""

from __future__ import annotations

import pytest

import vacancy
from conftest import feed


def test_clean_exit_releases_as_completed(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    with engine.admit("ollama", "llama3.1:8b", now=1.0) as job:
        assert isinstance(job, vacancy.Reservation)
        assert [w["id"] for w in engine.status(at=1.5)["work"]] == [job.id]
    status = engine.status(at=2.0)
    assert status["work"] == []
    assert all(r["awaiting_fresh_sample"] for r in status["resources"])


def test_exception_inside_holds_the_reservation(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    with pytest.raises(RuntimeError):
        with engine.admit("ollama", now=1.0) as job:
            raise RuntimeError("the upstream connection broke")
    (work,) = engine.status(at=2.0)["work"]
    assert work["id"] == job.id
    assert work["phase"] == "held"
    assert "RuntimeError" in work["held_reason"]
    with pytest.raises(vacancy.ResourceBusy):
        engine.admit("llamacpp", now=2.0)
    engine.release_held(job, at=3.0)


def test_explicit_release_inside_the_block_is_kept(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    with engine.admit("ollama", now=1.0) as job:
        engine.release(job, "not_forwarded", at=1.5)
    assert engine.status(at=2.0)["work"] == []


def test_status_dict_shape(engine: vacancy.Engine) -> None:
    feed(engine, 1.0)
    job = engine.admit("ollama", "llama3.1:8b", now=1.0)
    status = engine.status(at=3.0)
    assert set(status) == {
        "lending",
        "owner",
        "owner_veto",
        "resources",
        "upstreams",
        "work",
        "reclaims",
        "terms",
    }
    # The owner's terms beyond presence (issue 35) are off unless configured.
    assert status["terms"] == []
    assert status["lending"] is True
    assert status["owner"] == "away"
    assert status["owner_veto"] == {"active": False, "reason": None, "exempt_upstreams": []}
    gpu = status["resources"][0]
    assert set(gpu) == {
        "name", "kind", "free_mib", "total_mib", "busy_pct", "reserve_mib", "sample_age_ms",
        "capacity_unknown", "awaiting_fresh_sample", "enabled", "pressure", "reserved_by", "heat",
    }
    assert gpu["heat"] is None
    assert (gpu["name"], gpu["kind"], gpu["free_mib"], gpu["total_mib"]) == ("gpu0", "gpu", 70_000, 81_920)
    assert gpu["reserved_by"] == job.id
    assert gpu["sample_age_ms"] == 2000
    ollama, llamacpp = status["upstreams"]
    assert ollama["name"] == "ollama" and ollama["resources"] == ["gpu0", "ram"]
    assert llamacpp["vacancy"]["admitting"] is False
    assert llamacpp["vacancy"]["code"] == "resource_busy"
    (work,) = status["work"]
    assert work == {
        "id": job.id,
        "upstream": "ollama",
        "model": "llama3.1:8b",
        "resources": ["gpu0", "ram"],
        "age_s": 2,
        "completion": "response_end",
        "phase": "forwarding",
        "held_reason": None,
        "upstream_ref": None,
        "borrower": None,
    }


def test_engine_starts_with_owner_unknown_unless_presence_is_none() -> None:
    from conftest import LANES

    engine = vacancy.Engine(vacancy.Config.from_toml(LANES.replace('presence = "none"', 'presence = "manual"')))
    assert engine.status(at=0.0)["owner"] == "unknown"
    feed(engine, 1.0)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", now=1.0)
    assert caught.value.code == "owner_present"
