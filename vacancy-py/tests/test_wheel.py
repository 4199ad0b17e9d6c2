"""The built wheel installs and imports without a Rust toolchain (issue 23 item 5).

``scripts/wheel`` builds ``target/wheels/vacancy-*-abi3-*.whl`` and the sdist
(``scripts/test`` runs it, then installs that very wheel for the other tests),
and ``scripts/test`` builds a wheel from that sdist into
``target/wheels-sdist`` as pip does for a user (issue 30 item 11). These tests
install each wheel into a fresh venv, offline, with a PATH that has no
``cargo`` or ``rustc``, and use the engine from it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WHEELS = pathlib.Path(os.environ.get("VACANCY_WHEELS", ROOT / "target" / "wheels"))


SDIST_WHEELS = pathlib.Path(
    os.environ.get("VACANCY_SDIST_WHEELS", ROOT / "target" / "wheels-sdist")
)


def built(pattern: str, where: pathlib.Path = WHEELS) -> pathlib.Path:
    found = sorted(where.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        why = f"no {pattern} in {where}: run scripts/wheel first (scripts/test builds both)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found[-1]


def installs_and_imports_without_cargo(wheel: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Install ``wheel`` into a fresh venv, offline, with no Rust toolchain on
    PATH, and run the engine from it."""
    # A PATH with the system's tools but no Rust toolchain.
    path = os.pathsep.join(
        d for d in ("/usr/local/bin", "/usr/bin", "/bin")
        if not any(pathlib.Path(d, tool).exists() for tool in ("cargo", "rustc"))
    )  # fmt: skip
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    venv = tmp_path / "venv"
    env = {"PATH": path, "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True, env=env)
    code = """
import vacancy, vacancy.slots
config = vacancy.Config.for_engine({"owner": {"presence": "none"},
    "resource": [{"name": "ram", "sampler": "system"}],
    "upstream": [{"name": "llm", "resource": "ram", "default_min_free_mib": 1}]})
engine = vacancy.Engine(config)
assert engine.sample_now() == {"ram": None}
with engine.admit("llm") as job:
    pass
print(vacancy.__file__, job.to_sample)
"""
    out = subprocess.run([python, "-c", code], check=True, env=env, cwd=tmp_path,
                         capture_output=True, text=True)  # fmt: skip
    assert str(venv) in out.stdout and "['ram']" in out.stdout, out.stdout


def test_the_abi3_wheel_installs_and_imports_without_cargo(tmp_path: pathlib.Path) -> None:
    wheel = built("vacancy-*-abi3-*.whl")
    assert "-cp311-abi3-" in wheel.name, wheel.name  # one wheel for CPython >= 3.11
    installs_and_imports_without_cargo(wheel, tmp_path)


def test_the_wheel_built_from_the_sdist_installs_and_imports(tmp_path: pathlib.Path) -> None:
    # Issue 30 item 11: pip builds a working wheel from the sdist alone
    # (scripts/test: pip wheel target/wheels/vacancy-*.tar.gz), as a user
    # installing from the sdist does.
    wheel = built("vacancy-*.whl", SDIST_WHEELS)
    assert "-cp311-abi3-" in wheel.name, wheel.name
    installs_and_imports_without_cargo(wheel, tmp_path)


def test_the_sdist_carries_the_sources() -> None:
    sdist = built("vacancy-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    for needed in ("pyproject.toml", "vacancy-py/Cargo.toml", "vacancy-py/src/lib.rs",
                   "vacancy/src/lib.rs", "python/vacancy/_vacancy.pyi"):  # fmt: skip
        assert any(n.endswith(needed) for n in names), (needed, names[:20])
