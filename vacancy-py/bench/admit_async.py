"""Overheads of the asyncio admission and of an idle Driver, from Python. Not a test.

1. µs per ``await engine.admit_async(...)`` + ``release()`` on one event loop,
   each round after feeding the post-job sample (timed apart and subtracted,
   as in ``admit_release.py``); the blocking ``admit()`` + ``release()`` on the
   real clock beside it for comparison.
2. The CPU an idle ``vacancy.Driver`` costs: the process's CPU time over a
   quiet interval with the driver sampling two resources (the system memory
   sampler and a file sampler) every ``poll_ms`` and polling presence every
   second, as a percentage of one core.

    python vacancy-py/bench/admit_async.py [N] [IDLE_S]
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import resource
import sys
import tempfile
import time

import vacancy


def config(gpu_file: pathlib.Path, poll_ms: int) -> vacancy.Config:
    return vacancy.Config.for_engine(f"""
[owner]
presence = "none"

[[resource]]
name = "ram"
kind = "memory"
sampler = "system"
poll_ms = {poll_ms}

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{gpu_file}"
poll_ms = {poll_ms}

[[resource]]
name = "fed"
kind = "memory"

[[upstream]]
name = "llm"
resource = "fed"
default_min_free_mib = 1
""")


async def rounds(engine: vacancy.Engine, n: int) -> tuple[float, float]:
    def sample() -> None:
        engine.sample("fed", 60_000, 128_000)

    start = time.perf_counter()
    for _ in range(n):
        sample()
    sample_s = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for _ in range(n):
        sample()
        engine.release(await engine.admit_async("llm"))
    return sample_s, (time.perf_counter() - start) / n


def blocking(engine: vacancy.Engine, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        engine.sample("fed", 60_000, 128_000)
        engine.release(engine.admit("llm"))
    return (time.perf_counter() - start) / n


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    idle_s = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    with tempfile.TemporaryDirectory() as d:
        gpu = pathlib.Path(d) / "gpu0.json"
        gpu.write_text(json.dumps({"free_mib": 20_000, "total_mib": 24_000}))
        engine = vacancy.Engine(config(gpu, 1000))
        asyncio.run(rounds(engine, 1000))  # warm up
        best = min((asyncio.run(rounds(engine, n)) for _ in range(3)), key=lambda r: r[1])
        sample_s, round_s = best
        block_s = min(blocking(engine, n) for _ in range(3))
        print(f"N={n}: sample {sample_s * 1e6:.2f} µs; "
              f"admit_async+release {(round_s - sample_s) * 1e6:.2f} µs "
              f"(round with sample {round_s * 1e6:.2f} µs); "
              f"blocking admit+release {(block_s - sample_s) * 1e6:.2f} µs")
        for poll_ms in (1000, 100):
            idle = vacancy.Engine(config(gpu, poll_ms))
            with vacancy.Driver(idle):
                c0, t0 = cpu_s(), time.monotonic()
                time.sleep(idle_s)
                c1, t1 = cpu_s(), time.monotonic()
            print(f"idle Driver, 2 resources every {poll_ms} ms + presence every 1 s: "
                  f"{(c1 - c0) / (t1 - t0) * 100:.3f} % of one core over {t1 - t0:.1f} s")


if __name__ == "__main__":
    main()
