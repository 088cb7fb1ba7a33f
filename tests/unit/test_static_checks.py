"""ruff and mypy on sidecar/, as part of the suite (and so of CI, which runs ./scripts/test).

Their configuration is in pyproject.toml ([tool.ruff], [tool.mypy]) and their versions are pinned in
its dev extra, so a new release cannot fail a suite no one changed. Both are quick (seconds with a
warm cache) and load no model: these tests are in the fast tier.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.fast


def tool(name: str) -> list[str]:
    """The tool installed beside this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: .venv/bin/pip install -e '.[dev]' (./scripts/setup does)")
    return [found]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_in_sidecar() -> None:
    done = run([*tool("ruff"), "check", "--no-cache", "sidecar"])
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_sidecar() -> None:
    done = run([*tool("mypy")])  # files, exclusions and per-module relaxations: pyproject.toml
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr
