"""The Makefile's venvs: the default interpreter's is .venv, another interpreter (PYTHON=) gets
its own (.venv-3.13), and a venv of another minor version is refused in one line, not reused."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def _make(tmp_path, *args, **env):
    """``make -n`` (print, run nothing) on a copy of the Makefile beside a copy of pyproject.toml."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    # (not the variables of a make that runs the tests: a sub-make prints "Entering directory" lines)
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")} | env
    return subprocess.run(["make", "-n", *args], cwd=tmp_path, env=environment, capture_output=True, text=True)


def _fake_venv(path: Path, version: str) -> None:
    """A venv whose python answers every question with ``version``."""
    (path / "bin").mkdir(parents=True)
    python = path / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho {version}\n")
    python.chmod(0o755)


def test_another_interpreter_installs_into_a_venv_of_its_own(tmp_path):
    given = _make(tmp_path, "install", PYTHON=sys.executable)
    assert given.returncode == 0, given.stderr
    assert f"{sys.executable} -m venv .venv-{MINOR}\n" in given.stdout and f".venv-{MINOR}/bin/pip install" in given.stdout


def test_the_default_interpreter_keeps_dot_venv(tmp_path):
    default = _make(tmp_path, "install")
    if default.returncode != 0 and "does not run a Python" in default.stderr:
        pytest.skip("no python3 on PATH")
    assert default.returncode == 0, default.stderr
    assert "python3 -m venv .venv\n" in default.stdout and ".venv/bin/pip install" in default.stdout


def test_a_venv_of_another_minor_version_is_refused_in_one_line(tmp_path):
    _fake_venv(tmp_path / f".venv-{MINOR}", "3.99")
    proc = _make(tmp_path, "test", PYTHON=sys.executable)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith(
        f"*** .venv-{MINOR} is a Python 3.99 venv but PYTHON={sys.executable} is Python {MINOR}: move .venv-{MINOR} away, "
        "or run with a Python 3.99 as PYTHON.  Stop.\n")
    assert (tmp_path / f".venv-{MINOR}" / "bin" / "python").exists()  # nothing deleted


def test_a_python_that_does_not_run_is_one_line(tmp_path):
    proc = _make(tmp_path, "test", PYTHON=str(tmp_path / "nonesuch"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith(
        f"*** PYTHON={tmp_path / 'nonesuch'} does not run a Python interpreter.  Stop.\n")
