"""Borrowers with names through Python (issue 34): the table in the
constructor, ``admit(..., borrower=, priority=)``, the refusals a borrower
can act on, and ``status()["borrowers"]``. Simulated time throughout."""

from __future__ import annotations

import pytest

import vacancy
from conftest import feed

# 2026-12-03 20:00:00 UTC.
EVENING = 1_796_328_000.0

TABLE = {
    "batch_max_wait_s": 60,
    "borrowers": [
        {
            "name": "alice",
            "priority": "batch",
            "share": 2,
            "max_running": 1,
            "budgets": [{"kind": "gpu", "period": "day", "seconds": 100}],
        },
        {"name": "bob"},
    ],
}


@pytest.fixture
def lab(config: vacancy.Config) -> vacancy.Engine:
    engine = vacancy.Engine(config, borrowers=TABLE)
    engine.set_wall_clock(EVENING, at=0.0)
    feed(engine, 0.0)
    return engine


def test_borrower_an_unknown_name_is_refused_unknown_borrower(lab: vacancy.Engine) -> None:
    with pytest.raises(vacancy.Refused) as caught:
        lab.admit("ollama", borrower="mallory", now=1.0)
    assert caught.value.code == "unknown_borrower"
    assert caught.value.http_status == 401
    with pytest.raises(vacancy.Refused) as caught:
        lab.admit("ollama", now=1.0)  # no name, and no anonymous entry
    assert caught.value.code == "unknown_borrower"


def test_borrower_admits_and_counts_in_status(lab: vacancy.Engine) -> None:
    job = lab.admit("ollama", borrower="bob", now=1.0)
    status = lab.status(at=1.0)
    bob = next(b for b in status["borrowers"] if b["name"] == "bob")
    assert bob["running"] == 1 and bob["totals"]["jobs"] == 1
    lab.release(job.id, at=11.0)
    status = lab.status(at=11.0)
    bob = next(b for b in status["borrowers"] if b["name"] == "bob")
    assert bob["running"] == 0
    assert bob["totals"]["reserved_s"]["gpu"] == 10.0


TWO_GPUS = """
[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu0.json"
reserve_mib = 1000

[[resource]]
name = "gpu1"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu1.json"
reserve_mib = 1000

[[upstream]]
name = "a"
adapter = "llamacpp"
listen = "127.0.0.1:8081"
target = "http://127.0.0.1:8080"
resource = "gpu0"
default_min_free_mib = 1000

[[upstream]]
name = "b"
adapter = "llamacpp"
listen = "127.0.0.1:8083"
target = "http://127.0.0.1:8082"
resource = "gpu1"
default_min_free_mib = 1000
"""


def test_borrower_max_running_is_refused_borrower_limit() -> None:
    lab = vacancy.Engine(vacancy.Config.from_toml(TWO_GPUS), borrowers=TABLE)
    for gpu in ("gpu0", "gpu1"):
        lab.sample(gpu, 40_000, 48_000, at=0.0)
    lab.admit("a", borrower="alice", now=1.0)
    # gpu1 is free; alice runs her one job (max_running = 1).
    with pytest.raises(vacancy.Refused) as caught:
        lab.admit("b", borrower="alice", now=2.0)
    assert caught.value.code == "borrower_limit"
    assert caught.value.http_status == 429
    assert caught.value.retry_after_s == 2
    assert "max_running" in caught.value.reason
    lab.admit("b", borrower="bob", now=3.0)  # bob is not held back by it


def test_borrower_quota_exhausted_says_what_was_used_and_when_it_resets(
    lab: vacancy.Engine,
) -> None:
    job = lab.admit("ollama", borrower="alice", now=1.0)
    lab.release(job.id, at=120.0)  # admitted with budget left: runs past it
    feed(lab, 121.0)
    with pytest.raises(vacancy.Refused) as caught:
        lab.admit("ollama", borrower="alice", now=122.0)
    err = caught.value
    assert err.code == "quota_exhausted"
    assert err.http_status == 429
    assert "2026-12-04 00:00 UTC" in err.reason
    assert err.retry_after_s == 4 * 3600 - 122
    budget = next(b for b in lab.status(at=122.0)["borrowers"] if b["name"] == "alice")[
        "budgets"
    ][0]
    assert budget["used_s"] == 119.0 and budget["left_s"] == 0.0
    # bob's budget is his own.
    lab.admit("ollama", borrower="bob", now=123.0)


def test_borrower_priority_may_only_be_lowered(lab: vacancy.Engine) -> None:
    with pytest.raises(ValueError, match="urgent"):
        lab.admit("ollama", borrower="bob", priority="urgent", now=1.0)  # type: ignore[arg-type]
    # Asking for interactive does not raise alice's batch class.
    lab.admit("ollama", borrower="alice", priority="interactive", now=1.0)
    status = lab.status(at=1.0)
    assert next(b for b in status["borrowers"] if b["name"] == "alice")["priority"] == "batch"


def test_borrower_table_errors_name_the_key(config: vacancy.Config) -> None:
    with pytest.raises(ValueError, match="unknown key"):
        vacancy.Engine(config, borrowers={"borrowers": [{"name": "a", "shares": 2}]})
    with pytest.raises(ValueError, match="twice"):
        vacancy.Engine(config, borrowers={"borrowers": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(ValueError, match="period"):
        vacancy.Engine(
            config,
            borrowers={
                "borrowers": [
                    {"name": "a", "budgets": [{"kind": "gpu", "period": "month", "seconds": 1}]}
                ]
            },
        )


def test_borrower_table_off_admits_anonymously(lab: vacancy.Engine) -> None:
    lab.set_borrowers(None)
    lab.admit("ollama", borrower="anyone", now=1.0)
    assert "borrowers" not in lab.status(at=1.0)
    lab.set_borrowers({"borrowers": [], "anonymous": {"priority": "batch"}})
    assert lab.status(at=1.0)["borrowers"][0]["name"] == "(anonymous)"
