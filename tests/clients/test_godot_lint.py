"""Every GDScript file of the Godot client parses as Godot 4 GDScript, passes gdlint's default rules
and is formatted as gdformat writes it (gdtoolkit, from the dev extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.daemons import REPO

GODOT_CLIENT = REPO / "clients" / "godot"
GD_FILES = sorted(GODOT_CLIENT.rglob("*.gd"))
REQUIRED = os.environ.get("XLM_REQUIRE_CLIENT_TOOLS") == "1"


def gdtoolkit_command(name: str) -> str | None:
    """The venv's own script first (the dev extra installs it there), then PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


def test_the_client_has_gdscript_to_check() -> None:
    names = {p.relative_to(GODOT_CLIENT).as_posix() for p in GD_FILES}
    assert {"addons/xlm_sidecar/xlm_sidecar_client.gd", "addons/xlm_sidecar/xlm_protocol.gd"} <= names
    assert any(n.startswith("example/") for n in names) and any(n.startswith("tests/") for n in names)


@pytest.mark.parametrize(
    ("tool", "flags"),
    [("gdparse", []), ("gdlint", []), ("gdformat", ["--check"])],
    ids=["parse", "lint", "format"],
)
def test_gdtoolkit_passes_every_file(tool: str, flags: list[str]) -> None:
    command = gdtoolkit_command(tool)
    if command is None:
        message = f"{tool} (gdtoolkit, in the dev extra) is not installed"
        if REQUIRED:
            pytest.fail(message + " and XLM_REQUIRE_CLIENT_TOOLS=1")
        pytest.skip(message)
    result = subprocess.run(
        [command, *flags, *map(str, GD_FILES)], capture_output=True, text=True, timeout=300, cwd=GODOT_CLIENT
    )
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout}\n{result.stderr}"
