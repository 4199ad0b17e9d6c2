"""Engine-only configurations and the typing fixes a scheduler author needs (issue 23 item 6)."""

from __future__ import annotations

import pytest

import vacancy

ENGINE_ONLY = """
[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
reserve_mib = 512

[[upstream]]
name = "llm"
resource = "gpu0"
default_min_free_mib = 4000
"""


def test_an_engine_only_config_needs_no_listen_target_or_sampler() -> None:
    config = vacancy.Config.for_engine(ENGINE_ONLY)
    assert config.resources == ["gpu0"] and config.upstreams == ["llm"]
    engine = vacancy.Engine(config)
    engine.sample("gpu0", 20_000, 24_000)
    with engine.admit("llm") as job:
        assert job.resources == ["gpu0"]
    # The daemon's schema still needs them.
    with pytest.raises(vacancy.ConfigError) as info:
        vacancy.Config.from_toml(ENGINE_ONLY)
    paths = {p["path"] for p in info.value.problems}
    assert {'upstream[0] ("llm").listen', 'upstream[0] ("llm").target'} <= paths
    assert 'resource[0] ("gpu0").sampler' in paths


def test_an_engine_only_config_from_python_values() -> None:
    values = {
        "owner": {"presence": "none"},
        "resource": [{"name": "gpu0", "kind": "gpu", "reserve_mib": 512}],
        "upstream": [{"name": "llm", "resource": "gpu0", "default_min_free_mib": 4000}],
    }
    config = vacancy.Config.for_engine(values)
    assert config.upstreams == ["llm"]
    with pytest.raises(vacancy.ConfigError) as info:
        vacancy.Config.for_engine({"resource": [{"name": "g", "kind": "gpu", "lisen": 1}]})
    assert any("lisen" in p["path"] for p in info.value.problems)
    assert info.value.origin == "<values>"
    with pytest.raises(ValueError, match="None has no TOML form"):
        vacancy.Config.for_engine({"resource": [{"name": "g", "path": None}]})
    with pytest.raises(TypeError):
        vacancy.Config.for_engine(42)  # type: ignore[arg-type]


def test_an_engine_only_config_file(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "engine.toml"
    path.write_text(ENGINE_ONLY)
    assert vacancy.Config.for_engine_file(path).resources == ["gpu0"]


def test_a_manual_resource_has_no_sampler_to_run() -> None:
    engine = vacancy.Engine(vacancy.Config.for_engine(ENGINE_ONLY))
    with pytest.raises(ValueError, match="manual"):
        engine.sample_now("gpu0")
    assert engine.sample_now() == {}  # nothing configured to sample
    with pytest.raises(vacancy.UnknownResource):
        engine.sample_now("nope")


def test_the_with_block_keeps_what_release_asked_to_sample() -> None:
    engine = vacancy.Engine(vacancy.Config.for_engine(ENGINE_ONLY))
    engine.sample("gpu0", 20_000, 24_000)
    job = engine.admit("llm")
    assert job.to_sample == []
    result = job.__exit__(None, None, None)  # type: ignore[func-returns-value]
    assert result is None  # never swallows the block's exception
    assert job.to_sample == ["gpu0"]
    held = None
    engine.sample("gpu0", 20_000, 24_000)
    with pytest.raises(RuntimeError):
        with engine.admit("llm") as held:
            raise RuntimeError("the stream broke")
    assert held is not None and held.to_sample == []  # held: nothing to sample
    assert engine.status()["work"][0]["phase"] == "held"


def test_refusal_codes_and_status_keys_are_typed() -> None:
    # Every code the engine answers with is in the RefusalCode Literal.
    import typing

    codes = {typing.get_args(a)[0] for a in typing.get_args(vacancy.RefusalCode)}
    engine = vacancy.Engine(vacancy.Config.for_engine(ENGINE_ONLY))
    with pytest.raises(vacancy.Refused) as info:
        engine.admit("llm")
    assert info.value.code in codes and info.value.code == "capacity_unknown"
    status = engine.status()
    assert set(status) == set(vacancy.EngineStatus.__annotations__)
    assert set(status["resources"][0]) == set(vacancy.ResourceStatus.__annotations__)
    assert set(status["upstreams"][0]) == set(vacancy.UpstreamStatus.__annotations__)
