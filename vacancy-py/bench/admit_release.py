"""ns per ``admit`` + ``release`` from Python, on simulated time.

Each round feeds the post-job sample (ADM-04) and then admits and releases one
job; the sample is timed separately and subtracted, so the number printed is
the cost of ``admit`` + ``release`` as a Python caller pays it (the call
overhead, the engine's lock, the Reservation object). Not a test.

    python vacancy-py/bench/admit_release.py [N]
"""

from __future__ import annotations

import sys
import timeit

import vacancy

# The engine alone (Config.for_engine): one memory resource the bench feeds,
# one upstream on it.
CONFIG = {
    "owner": {"presence": "none"},
    "resource": [{"name": "ram", "kind": "memory", "reserve_mib": 4096}],
    "upstream": [{"name": "llamacpp", "resource": "ram", "default_min_free_mib": 2048}],
}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    engine = vacancy.Engine(vacancy.Config.for_engine(CONFIG))
    clock = [0.0]
    step = 1e-6

    def sample_only() -> None:
        clock[0] += step
        engine.sample("ram", 60_000, 128_000, at=clock[0])

    def round_trip() -> None:
        clock[0] += step
        t = clock[0]
        engine.sample("ram", 60_000, 128_000, at=t)
        engine.release(engine.admit("llamacpp", now=t), at=t)

    sample_only()
    round_trip()  # warm up, and prove the loop admits
    best_sample = min(timeit.repeat(sample_only, number=n, repeat=3)) / n
    best_round = min(timeit.repeat(round_trip, number=n, repeat=3)) / n
    print(f"N={n}: sample {best_sample * 1e9:.0f} ns; "
          f"admit+release {(best_round - best_sample) * 1e9:.0f} ns "
          f"(round with sample {best_round * 1e9:.0f} ns)")


if __name__ == "__main__":
    main()
