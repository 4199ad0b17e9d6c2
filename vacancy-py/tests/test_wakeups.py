"""The wait line from Python (issue 30 item 11): a dropped ticket leaves the
line, no wake-up is missed, and vacancy's Rust log records reach Python's
``logging`` under the ``vacancy`` logger."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time

import pytest

import vacancy
import vacancy._aio

CONFIG = """
[owner]
presence = "manual"

[[resource]]
name = "gpu0"
kind = "gpu"
reserve_mib = 512

[[upstream]]
name = "llm"
resource = "gpu0"
default_min_free_mib = 4000

[upstream.queue]
max_waiting = 64
max_wait_s = 30
"""


def engine() -> vacancy.Engine:
    e = vacancy.Engine(vacancy.Config.for_engine(CONFIG))
    e.set_owner_present(False)
    e.sample("gpu0", 20_000, 24_000)
    return e


def waiting(e: vacancy.Engine) -> int:
    return e.status()["upstreams"][0]["line"]["waiting"]


def test_a_dropped_ticket_leaves_the_wait_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # A ticket that took its place and is then dropped without an answer (its
    # coroutine never ran to the end) must not hold back those behind it.
    e = engine()
    job = e.admit("llm")
    tickets: list[vacancy._vacancy.AdmitTicket] = []

    def keep(ticket: vacancy._vacancy.AdmitTicket) -> None:
        tickets.append(ticket)

    monkeypatch.setattr(vacancy._aio, "admit", keep)
    e.admit_async("llm")
    assert isinstance(tickets[0].step(), tuple), "it waits in line"
    assert waiting(e) == 1
    tickets.clear()
    gc.collect()
    assert waiting(e) == 0, "the dropped ticket left the line"
    e.release(job)
    e.sample("gpu0", 20_000, 24_000)
    e.release(e.admit("llm"))


def test_a_step_says_which_change_to_wait_for_and_until_when(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A waiting step returns the change generation it decided at and the
    # seconds to its deadline: the task waits for a change after that step,
    # or the deadline, and nothing else.
    e = engine()
    job = e.admit("llm")
    tickets: list[vacancy._vacancy.AdmitTicket] = []
    monkeypatch.setattr(vacancy._aio, "admit", tickets.append)
    e.admit_async("llm", wait_s=5.0)
    step = tickets[0].step()
    assert isinstance(step, tuple), step
    generation, wait_s = step
    assert generation == e._generation()
    assert 4.0 < wait_s <= 5.0
    e.release(job)  # the line moves: a change after the step
    assert e._wait_change(generation, 0.0) > generation
    tickets[0].cancel()


def test_no_waiter_misses_its_wake_up() -> None:
    # Each round a job runs, a borrower waits for it in line (asyncio) and a
    # feeder thread ends the job and lands the post-job sample at a random
    # moment around the borrower's step. A wake-up that fell between a
    # waiter's check and its wait was hidden by a 100 ms re-check; without
    # it, a missed one waits until the 30 s line deadline.
    e = engine()
    rounds = 400
    rng = random.Random(30)
    latencies: list[float] = []

    def feeder(job: vacancy.Reservation, delay: float) -> None:
        time.sleep(delay)
        e.release(job)
        e.sample("gpu0", 20_000, 24_000)

    async def one_round() -> None:
        job = e.admit("llm")
        t = threading.Thread(target=feeder, args=(job, rng.uniform(0, 0.0005)))
        start = time.monotonic()
        t.start()
        got = await asyncio.wait_for(e.admit_async("llm"), timeout=10)
        latencies.append(time.monotonic() - start)
        t.join()
        e.release(got)
        e.sample("gpu0", 20_000, 24_000)

    async def main() -> None:
        for _ in range(rounds):
            await one_round()

    asyncio.run(main())
    assert len(latencies) == rounds
    worst = max(latencies)
    assert worst < 2.0, f"a waiter was woken {worst:.2f} s after its job ended"


def test_a_thread_waiting_in_admit_is_woken_by_the_change_alone() -> None:
    # admit() on a thread that is not the main one waits for a change or its
    # deadline, never on a timer: a wake-up it misses is not papered over.
    e = engine()
    rounds = 100
    worst = 0.0
    for _ in range(rounds):
        job = e.admit("llm")
        out: list[float] = []

        def borrower() -> None:
            got = e.admit("llm", wait_s=30.0)
            out.append(time.monotonic())
            e.release(got)
            e.sample("gpu0", 20_000, 24_000)

        t = threading.Thread(target=borrower)
        t.start()
        while waiting(e) == 0:
            time.sleep(0.0005)
        ended = time.monotonic()
        e.release(job)
        e.sample("gpu0", 20_000, 24_000)
        t.join(timeout=40)
        assert out, "the borrower was never admitted"
        worst = max(worst, out[0] - ended)
    assert worst < 2.0, f"a waiter was woken {worst:.2f} s after its job ended"


def test_rust_log_records_reach_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    # The sampler's and the presence backend's warnings were dropped before.
    config = vacancy.Config.for_engine(
        {
            "owner": {"presence": "command", "command": "/nonexistent/presence-check"},
            "resource": [
                {"name": "gpu0", "kind": "gpu", "sampler": "file", "path": "/nonexistent/free.json"}
            ],
            "upstream": [{"name": "llm", "resource": "gpu0"}],
        }
    )
    e = vacancy.Engine(config)
    caplog.set_level(logging.DEBUG, logger="vacancy")
    failed = e.sample_now()
    assert failed["gpu0"], failed
    assert e.poll_presence() is None
    records = [r for r in caplog.records if r.name.startswith("vacancy.")]
    sampling = [r for r in records if "capacity sample failed" in r.getMessage()]
    assert sampling and sampling[0].levelno == logging.WARNING, records
    assert "gpu0" in sampling[0].getMessage()
    presence = [r for r in records if "presence command" in r.getMessage()]
    assert presence and presence[0].levelno == logging.WARNING, records
    # The level is read at each record: raising it silences them.
    caplog.clear()
    logging.getLogger("vacancy").setLevel(logging.ERROR)
    e.sample_now()
    assert not [r for r in caplog.records if r.name.startswith("vacancy.")]

