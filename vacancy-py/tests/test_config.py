"""Config.from_toml / from_file: every problem at once, each with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

import vacancy
from conftest import LANES


def test_valid_config_lists_resources_and_upstreams(config: vacancy.Config) -> None:
    assert config.resources == ["gpu0", "ram"]
    assert config.upstreams == ["ollama", "llamacpp"]
    assert config.warnings == []


def test_config_errors_list_every_problem_with_its_line() -> None:
    text = '[server]\nlisten = 7480\nlisen = 1\n\n[[resource]]\nname = 1\nkind = "tpu"\n'
    with pytest.raises(vacancy.ConfigError) as caught:
        vacancy.Config.from_toml(text, "bad.toml")
    err = caught.value
    assert isinstance(err, vacancy.VacancyError)
    assert isinstance(err, ValueError)
    assert err.origin == "bad.toml"
    by_path = {p["path"]: p for p in err.problems}
    assert by_path["server.listen"]["line"] == 2
    assert by_path["server.lisen"]["line"] == 3
    assert "did you mean" in by_path["server.lisen"]["message"]
    assert by_path["resource[0].name"]["line"] == 6
    assert by_path["resource[0].kind"]["line"] == 7
    assert len(err.problems) == 4
    for p in err.problems:
        assert set(p) == {"path", "line", "message"}
        assert f"line {p['line']}" in str(err)


def test_semantic_problems_are_reported_together() -> None:
    text = LANES.replace('also_requires = ["ram"]', 'also_requires = ["gpu9"]').replace(
        'resource = "ram"\ndefault_min_free_mib = 8000', 'resource = "nvme"\ndefault_min_free_mib = 8000'
    )
    with pytest.raises(vacancy.ConfigError) as caught:
        vacancy.Config.from_toml(text)
    messages = " | ".join(p["message"] for p in caught.value.problems)
    assert len(caught.value.problems) >= 2, messages
    assert "gpu9" in messages and "nvme" in messages
    assert all(p["line"] is not None for p in caught.value.problems)


def test_from_file_reads_and_names_the_path(tmp_path: Path) -> None:
    good = tmp_path / "vacancyd.toml"
    good.write_text(LANES)
    assert vacancy.Config.from_file(good).upstreams == ["ollama", "llamacpp"]
    assert vacancy.Config.from_file(str(good)).resources == ["gpu0", "ram"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[owner]\npresense = 'none'\n")
    with pytest.raises(vacancy.ConfigError) as caught:
        vacancy.Config.from_file(bad)
    assert caught.value.origin == str(bad)
    assert caught.value.problems[0]["line"] == 2


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(vacancy.ConfigError) as caught:
        vacancy.Config.from_file(tmp_path / "absent.toml")
    assert caught.value.problems[0]["line"] is None
    assert "cannot read" in caught.value.problems[0]["message"]
