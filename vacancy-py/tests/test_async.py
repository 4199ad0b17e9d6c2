"""asyncio admission: admit_async and async with admitting (issue 23 item 2)."""

from __future__ import annotations

import asyncio
import time

import pytest

import vacancy

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
"""


def engine() -> vacancy.Engine:
    e = vacancy.Engine(vacancy.Config.for_engine(CONFIG))
    e.set_owner_present(False)
    e.sample("gpu0", 20_000, 24_000)
    return e


async def ticker(counter: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        counter[0] += 1
        await asyncio.sleep(0.005)


def test_admit_async_and_admitting() -> None:
    async def main() -> None:
        e = engine()
        job = await e.admit_async("llm")
        assert job.resources == ["gpu0"]
        assert e.release(job) == ["gpu0"]
        e.sample("gpu0", 20_000, 24_000)
        async with e.admitting("llm", "m") as job:
            assert job.model == "m"
            assert e.status()["work"][0]["phase"] == "forwarding"
        assert e.status()["work"] == [] and job.to_sample == ["gpu0"]
        e.sample("gpu0", 20_000, 24_000)
        with pytest.raises(RuntimeError):
            async with e.admitting("llm"):
                raise RuntimeError("the stream broke")
        assert e.status()["work"][0]["phase"] == "held"

    asyncio.run(main())


def test_the_post_job_wait_does_not_block_the_loop() -> None:
    async def main() -> None:
        e = engine()
        (await e.admit_async("llm")).__exit__(None, None, None)  # gpu0 awaits its post-job sample
        counter, stop = [0], asyncio.Event()
        tick = asyncio.create_task(ticker(counter, stop))
        waiting = asyncio.create_task(e.admit_async("llm"))
        await asyncio.sleep(0.3)
        assert not waiting.done(), "it waits for the post-job sample"
        before = counter[0]
        assert before >= 10, f"the loop ran {before} ticks in 0.3 s: it was blocked"
        # The sample lands from another thread, as a Driver's does.
        await asyncio.to_thread(e.sample, "gpu0", 20_000, 24_000)
        job = await asyncio.wait_for(waiting, 1.0)
        stop.set()
        await tick
        assert job.resources == ["gpu0"]

    asyncio.run(main())


def test_a_cancelled_admission_reserves_nothing() -> None:
    async def main() -> None:
        e = engine()
        first = await e.admit_async("llm")
        # In the wait line behind `first`...
        queued = asyncio.create_task(e.admit_async("llm", wait_s=30))
        await asyncio.sleep(0.2)
        assert e.status()["upstreams"][0]["line"]["waiting"] == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert e.status()["upstreams"][0]["line"]["waiting"] == 0
        # ...and while awaiting the post-job sample.
        e.release(first)
        post = asyncio.create_task(e.admit_async("llm"))
        await asyncio.sleep(0.2)
        post.cancel()
        with pytest.raises(asyncio.CancelledError):
            await post
        e.sample("gpu0", 20_000, 24_000)
        await asyncio.sleep(0.2)  # a late wakeup must not admit the cancelled one
        assert e.status()["work"] == [], "a cancelled task left a reservation"
        job = await e.admit_async("llm")
        e.release(job)

    asyncio.run(main())


def test_refusals_come_through_admit_async() -> None:
    async def main() -> None:
        e = engine()
        e.set_owner_present(True)
        with pytest.raises(vacancy.Refused) as info:
            await e.admit_async("llm")
        assert info.value.code == "owner_present"
        e.set_owner_present(False)
        held = await e.admit_async("llm")
        started = time.monotonic()
        waiting = asyncio.create_task(e.admit_async("llm", wait_s=30))
        await asyncio.sleep(0.1)
        e.set_owner_present(True)  # refuses every waiter at once
        with pytest.raises(vacancy.Refused) as info:
            await asyncio.wait_for(waiting, 2.0)
        assert info.value.code == "owner_present"
        assert time.monotonic() - started < 2.0
        e.release(held)
        with pytest.raises(vacancy.UnknownUpstream):
            await e.admit_async("nope")

    asyncio.run(main())


def test_admit_async_needs_the_real_clock() -> None:
    e = vacancy.Engine(vacancy.Config.for_engine(CONFIG))
    e.sample("gpu0", 20_000, 24_000, at=1.0)
    with pytest.raises(vacancy.TimelineError):
        e.admit_async("llm")  # type: ignore[unused-coroutine]
    with pytest.raises(vacancy.TimelineError):
        e.admitting("llm")
