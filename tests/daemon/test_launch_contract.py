"""deploy/LAUNCH.md is the contract a game's launcher codes against: it must say what the program does.

Flags, environment variables, exit codes and the `listening` line's fields are read from the
document and compared with the program itself, so neither can change without the other.
"""

from __future__ import annotations

import json

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.daemons import REPO, RunningDaemon
from sidecar import cli
from sidecar.settings import Settings

DOC = (REPO / "deploy" / "LAUNCH.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = DOC.index(f"## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end >= 0 else None]


def _table_rows(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:]]  # without the header


def _serve_parser():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    return sub.choices["serve"]


def _documented_flags() -> dict[str, str]:
    """{flag: its environment cell} from the flag table."""
    flags = {}
    for cells in _table_rows(_section("Command line")):
        if cells[0].startswith("`--"):
            flags[cells[0].strip("`").split()[0]] = cells[1].strip("`")
    return flags


def test_every_serve_flag_is_documented_and_every_documented_flag_exists() -> None:
    actual = {s for a in _serve_parser()._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    assert set(_documented_flags()) == actual


def test_documented_environment_variables_are_the_settings_fields() -> None:
    dests = {s: a.dest for a in _serve_parser()._actions for s in a.option_strings}
    for flag, env in _documented_flags().items():
        name = env.split("=")[0]
        assert name.startswith("XLM_SIDECAR_"), (flag, env)
        field = name.removeprefix("XLM_SIDECAR_").lower()
        assert field in Settings.model_fields, (flag, env)
        assert dests[flag] == field, f"{flag} sets {dests[flag]}, the document says {field}"
    documented = {e.split("=")[0].removeprefix("XLM_SIDECAR_").lower() for e in _documented_flags().values()}
    other = _section("Command line")
    for field in Settings.model_fields:
        assert field in documented or f"`XLM_SIDECAR_{field.upper()}`" in other, f"XLM_SIDECAR_{field.upper()} is not documented"


def test_documented_exit_codes_are_the_programs() -> None:
    codes = {int(cells[0]) for cells in _table_rows(_section("Exit codes"))}
    assert codes == {0, cli.EXIT_FAILURE, cli.EXIT_USAGE, cli.EXIT_MODEL, cli.EXIT_LISTEN, cli.EXIT_UNREACHABLE, 130}


def _serve(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0", "--log-format", "json", *flags],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("flags", "env", "code", "said"),
    [
        (["--no-such-flag"], {}, 2, "unrecognized arguments"),
        ([], {"XLM_SIDECAR_BUDGET": "lots"}, 2, "--budget"),  # the environment is read as the flag
        (["--host", "0.0.0.0"], {}, 2, "--allow-remote"),
        (["--model", "/nonexistent/model.gguf"], {}, 3, "not found"),
    ],
)
def test_start_up_failures_exit_with_the_documented_code_and_one_json_line(
    flags: list[str], env: dict[str, str], code: int, said: str, tmp_path: Path
) -> None:
    done = _serve(*flags, env={"XLM_SIDECAR_RUNTIME_DIR": str(tmp_path), **env})
    assert done.returncode == code, done.stderr
    assert said in done.stderr and done.stdout == ""
    # --log-format json: every line is one object, argparse's and the settings' refusals too
    # (issue 36, P10: they were plain text, argparse's with its usage), the reason the last event.
    events = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert all(isinstance(e, dict) for e in events), done.stderr
    assert events[-1]["event"].startswith("xlm-sidecar: ") and events[-1]["level"] == "error", events[-1]


@pytest.mark.parametrize("log_format", [["--log-format=json"], ["--log-f", "json"], []])
def test_a_bad_flag_is_json_whenever_the_log_is(log_format: list[str], tmp_path: Path) -> None:
    # `auto` (no flag) logs JSON when stderr is a pipe, as it is here; the flag in any spelling
    # argparse takes.
    done = subprocess.run([sys.executable, "-m", "sidecar", "--port", "0", "--no-such-flag", *log_format],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XLM_SIDECAR_RUNTIME_DIR": str(tmp_path)})
    assert done.returncode == 2
    [event] = [json.loads(line) for line in done.stderr.splitlines()]
    assert event["event"].startswith("xlm-sidecar: unrecognized arguments: --no-such-flag"), event


def test_a_bad_flag_is_plain_text_under_console_logs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--ctx", "many", "--log-format", "console"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("usage: ") and "invalid int value" in done.stderr


def test_listening_line_fields_are_the_documented_ones(daemon: RunningDaemon) -> None:
    rows = {cells[0].strip("`"): cells[1] for cells in _table_rows(_section("Log format"))}
    documented = set(re.findall(r"`(\w+)`", rows["listening"].split("(remote mode)")[0]))
    documented -= {"token", "none", "null", "starting"}  # values named in the cell, not fields
    line = next(e for e in daemon.log_lines if e["event"] == "listening")
    assert set(line) - {"event", "level", "timestamp"} == documented
    assert {"event", "level", "timestamp"} <= set(line)


def test_ready_line_fields_are_the_documented_ones(daemon: RunningDaemon) -> None:
    rows = {cells[0].strip("`"): cells[1] for cells in _table_rows(_section("Log format"))}
    documented = set(re.findall(r"`(\w+)`", rows["ready"]))
    documented -= {"measured", "defaults", "refreshing", "off"}  # values named in the cell, not fields
    line = next(e for e in daemon.log_lines if e["event"] == "ready")
    assert set(line) - {"event", "level", "timestamp"} == documented
