"""Shared configurations and engines for the vacancy tests."""

from __future__ import annotations

import pytest

import vacancy

# One GPU with system memory beside it; the owner is never present (a dedicated
# machine), so host-scoped work is judged on capacity alone.
LANES = """
[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/vacancy/gpu0.json"
reserve_mib = 2048

[[resource]]
name = "ram"
kind = "memory"
sampler = "system"
reserve_mib = 24000

[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:11435"
target = "http://127.0.0.1:11434"
resource = "gpu0"
also_requires = ["ram"]
default_min_free_mib = 6000
resident_min_free_mib = 500

[upstream.models]
"llama3.1:8b" = { min_free_mib = 6000, resident_min_free_mib = 500 }

[upstream.requirements]
ram = { min_free_mib = 1000 }

[[upstream]]
name = "llamacpp"
adapter = "llamacpp"
listen = "127.0.0.1:8081"
target = "http://127.0.0.1:8080"
resource = "ram"
default_min_free_mib = 8000
"""


@pytest.fixture
def config() -> vacancy.Config:
    return vacancy.Config.from_toml(LANES)


@pytest.fixture
def engine(config: vacancy.Config) -> vacancy.Engine:
    return vacancy.Engine(config)


def feed(engine: vacancy.Engine, at: float, gpu_free: int = 70_000, ram_free: int = 60_000) -> None:
    """A fresh sample of both resources at simulated time ``at``."""
    engine.sample("gpu0", gpu_free, 81_920, at=at)
    engine.sample("ram", ram_free, 128_000, at=at)
