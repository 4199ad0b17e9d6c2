"""Request kinds, kind-scoped residency evidence and lessons (RES-05..07), as the daemon decides."""

from __future__ import annotations

import pytest

import vacancy

KIND_UNSET = "llama3:latest, num_ctx unset, /api"
KIND_8K = "llama3:latest, num_ctx 8192, /api"


def simulated(config: vacancy.Config, at: float, free: int = 9_000) -> vacancy.Engine:
    engine = vacancy.Engine(config)
    engine.sample("gpu0", free, 81_920, at=at)
    engine.sample("ram", 60_000, 128_000, at=at)
    return engine


def test_kind_evidence_credits_only_the_kinds_it_names(config: vacancy.Config) -> None:
    # RES-05, RES-06, RES-21: 9,000 free - 2,048 reserve fits 500 resident, not 6,000 cold... so
    # with 5,000 free only a credited request is admitted.
    engine = simulated(config, 1.0, free=5_000)
    engine.observe(
        "ollama",
        [{"name": "llama3:latest", "kinds": [KIND_UNSET], "reason": "loaded with context 4096"}],
        at=1.0,
    )
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", "llama3", now=1.5, kind=KIND_8K, canonical_model="llama3:latest")
    assert caught.value.code == "insufficient_memory"
    assert "loaded with context 4096" in str(caught.value)
    assert KIND_8K in str(caught.value)
    job = engine.admit("ollama", "llama3", now=1.5, kind=KIND_UNSET, canonical_model="llama3:latest")
    assert job.resident_credit
    assert job.model == "llama3"


def test_a_finished_request_teaches_the_next_observation(config: vacancy.Config) -> None:
    # RES-07
    engine = simulated(config, 1.0)
    job = engine.admit("ollama", "llama3", now=1.0, kind=KIND_UNSET, canonical_model="llama3:latest")
    assert engine.take_lesson("ollama", at=1.5) is None
    engine.release(job, at=2.0)
    assert engine.take_lesson("ollama", at=2.0) is None  # started before the end
    lesson = engine.take_lesson("ollama", at=2.5)
    assert lesson == {"model": "llama3:latest", "kind": KIND_UNSET, "finished_at": pytest.approx(2.0)}
    assert engine.take_lesson("ollama", at=3.0) is None


def test_bad_kind_arguments_are_errors(config: vacancy.Config) -> None:
    engine = simulated(config, 1.0)
    with pytest.raises(ValueError, match="exclude each other"):
        engine.admit("ollama", "m", now=1.0, kind="k", cannot_reuse="num_gpu")
    with pytest.raises(ValueError, match="not both"):
        engine.observe("ollama", [{"name": "m", "kinds": ["k"], "proven": False}], at=1.0)
    with pytest.raises(TypeError):
        engine.observe("ollama", [{"name": "m", "kinds": "k"}], at=1.0)


def test_a_runner_option_forfeits_credit(config: vacancy.Config) -> None:
    # RES-04
    engine = simulated(config, 1.0, free=5_000)
    engine.observe("ollama", ["llama3.1:8b"], at=1.0)
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", "llama3.1:8b", now=1.2, cannot_reuse="the request sets runner option num_gpu")
    assert "num_gpu" in str(caught.value)
