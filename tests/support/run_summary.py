"""The end of a test run says what did not run, and the one command that would run it, and the
tallies that tests recorded (the fuzz suites' requests, crashes, hangs...).

A newcomer who runs ./scripts/test on their own machine sees "57 skipped" and cannot tell whether
that is the Unity client (no Mono here), the Godot scene (no Godot 4 binary) or something broken.
So the run ends with each reason, how many tests it skipped, and what to do to include them.
"""

from __future__ import annotations

from collections import Counter

import pytest

_TALLIES = pytest.StashKey[dict]()


def record_tally(config: pytest.Config, name: str, counts: dict[str, int]) -> None:
    """Print `counts` under `name` at the end of the run (a module's fixture calls it at teardown).
    In a pytest-xdist worker it also goes to the controller, which prints the run's end."""
    config.stash.setdefault(_TALLIES, {})[name] = dict(counts)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput.setdefault("tallies", {})[name] = dict(counts)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: a worker finished, with its tallies
def pytest_testnodedown(node, error) -> None:
    for name, counts in getattr(node, "workeroutput", {}).get("tallies", {}).items():
        node.config.stash.setdefault(_TALLIES, {})[name] = counts

# (a phrase of the skip reason, the command that includes those tests). First match wins.
HOW_TO_INCLUDE = (
    ("mono", "apt-get install mono-mcs   (then: ./scripts/test tests/clients/test_unity_client.py)"),
    ("Godot 4", "GODOT4_BIN=/path/to/godot4 ./scripts/test tests/clients/test_godot_headless.py"),
    ("node and npm", "apt-get install nodejs npm   (Node 20 or newer; then: ./scripts/test tests/http/test_openai_http_js.py)"),
    ("Node 20", "install Node 20 or newer   (then: ./scripts/test tests/http/test_openai_http_js.py)"),
    ("RPC backend", "rm -rf ~/.cache/xlm-sidecar/wheels .venv && ./scripts/setup   (rebuilds llama.cpp with RPC)"),
    ("PyInstaller", ".venv/bin/pip install -e '.[deploy]'   (then: ./scripts/test tests/tools/test_frozen_build.py)"),
    ("dotnetcore2", ".venv/bin/pip install -e '.[dev]'"),
    ("wheel cache", "./scripts/setup   (it keeps the wheel the bundle test packs)"),
)


def _reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def how_to_include(reason: str) -> str:
    return next((command for phrase, command in HOW_TO_INCLUDE if phrase.lower() in reason.lower()),
                "depends on this machine or on which tests ran (nothing to install)")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    for name, counts in config.stash.get(_TALLIES, {}).items():
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if getattr(r, "longrepr", None)]
    if not skipped:
        return
    reasons = Counter(_reason(r) for r in skipped)
    terminalreporter.section("what did not run, and how to include it")
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:4d} skipped: {reason}")
        terminalreporter.write_line(f"      to include: {how_to_include(reason)}")
