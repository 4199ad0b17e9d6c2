"""One timeline per engine; the real-clock wait for the post-job sample (ADM-04/06)."""

from __future__ import annotations

import threading
import time

import pytest

import vacancy


def test_mixing_simulated_and_real_time_is_an_error(config: vacancy.Config) -> None:
    sim = vacancy.Engine(config)
    assert sim.simulated is None
    sim.sample("gpu0", 70_000, 81_920, at=1.0)
    assert sim.simulated is True
    with pytest.raises(vacancy.TimelineError) as caught:
        sim.sample("ram", 60_000, 128_000)
    assert isinstance(caught.value, ValueError)
    assert sim.now() == pytest.approx(1.0)

    real = vacancy.Engine(config)
    real.sample("gpu0", 70_000, 81_920)
    assert real.simulated is False
    with pytest.raises(vacancy.TimelineError):
        real.admit("ollama", now=5.0)
    assert real.now() > 0.0


def feed_real(engine: vacancy.Engine) -> None:
    engine.sample("gpu0", 70_000, 81_920)
    engine.sample("ram", 60_000, 128_000)


def test_blocking_admit_waits_for_a_sample_with_the_gil_released(config: vacancy.Config) -> None:
    # ADM-04/06: a request arriving before the post-job sample waits for it.
    engine = vacancy.Engine(config)
    feed_real(engine)
    engine.release(engine.admit("ollama"))
    ticks = 0
    stop = threading.Event()

    def sampler() -> None:
        nonlocal ticks
        # Pure Python work: it only runs while admit() has released the GIL.
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            ticks += 1
            time.sleep(0.001)
        feed_real(engine)
        stop.set()

    thread = threading.Thread(target=sampler)
    started = time.monotonic()
    thread.start()
    job = engine.admit("ollama")
    waited = time.monotonic() - started
    thread.join()
    assert stop.is_set()
    assert job.resources == ["gpu0", "ram"]
    assert 0.25 <= waited < 3.0, waited
    assert ticks > 10


def test_blocking_admit_without_a_sample_raises_resource_busy_after_4_s(
    config: vacancy.Config,
) -> None:
    engine = vacancy.Engine(config)
    feed_real(engine)
    engine.release(engine.admit("llamacpp"))
    started = time.monotonic()
    with pytest.raises(vacancy.ResourceBusy) as caught:
        engine.admit("llamacpp")
    waited = time.monotonic() - started
    assert 3.9 <= waited < 6.0, waited
    assert caught.value.retry_after_s == 2


def test_concurrent_admits_from_threads_admit_exactly_one(config: vacancy.Config) -> None:
    # ADM-01 across Python threads: the engine's lock serializes them.
    engine = vacancy.Engine(config)
    feed_real(engine)
    barrier = threading.Barrier(8)
    won: list[vacancy.Reservation] = []
    busy: list[vacancy.ResourceBusy] = []

    def borrower() -> None:
        barrier.wait()
        try:
            won.append(engine.admit("llamacpp"))
        except vacancy.ResourceBusy as err:
            busy.append(err)

    threads = [threading.Thread(target=borrower) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert len(busy) == 7
    assert all(err.retry_after_s == 2 for err in busy)


def test_admit_with_wait_s_waits_its_turn_in_the_line(config: vacancy.Config) -> None:
    # Issue 22: a request refused only because the resource is reserved
    # waits in the engine's line (GIL released) and is admitted after the
    # job ends and the post-job sample lands.
    engine = vacancy.Engine(config)
    feed_real(engine)
    job = engine.admit("ollama")
    ticks = 0

    def finish() -> None:
        nonlocal ticks
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            ticks += 1
            time.sleep(0.001)
        engine.release(job)
        feed_real(engine)

    thread = threading.Thread(target=finish)
    started = time.monotonic()
    thread.start()
    second = engine.admit("ollama", wait_s=10)
    waited = time.monotonic() - started
    thread.join()
    assert second.resources == ["gpu0", "ram"]
    assert 0.25 <= waited < 5.0, waited
    assert ticks > 10


def test_admit_with_wait_s_is_refused_busy_at_its_limit(config: vacancy.Config) -> None:
    engine = vacancy.Engine(config)
    feed_real(engine)
    engine.admit("ollama")
    started = time.monotonic()
    with pytest.raises(vacancy.ResourceBusy) as caught:
        engine.admit("ollama", wait_s=0.5)
    waited = time.monotonic() - started
    assert 0.45 <= waited < 3.0, waited
    assert caught.value.retry_after_s == 2
    assert "waited" in str(caught.value)


def test_a_waiter_is_answered_at_once_when_the_owner_returns(config: vacancy.Config) -> None:
    # The owner comes first: a waiter is not left waiting out its limit.
    engine = vacancy.Engine(config)
    feed_real(engine)
    engine.admit("ollama")

    def owner_returns() -> None:
        time.sleep(0.2)
        engine.set_owner_present(True)

    thread = threading.Thread(target=owner_returns)
    started = time.monotonic()
    thread.start()
    with pytest.raises(vacancy.Refused) as caught:
        engine.admit("ollama", wait_s=20)
    waited = time.monotonic() - started
    thread.join()
    assert caught.value.code == "owner_present"
    assert waited < 5.0, waited
