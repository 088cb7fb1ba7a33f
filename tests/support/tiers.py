"""Which tests are `fast`: those that load no model into llama.cpp and start no process.

`./scripts/test --fast` runs only them (pytest -m fast), in 40-70 s on 2 cores: the planner, the
cost model, schema bounds, the proto, the import graph, step planning, save formats... A rule
decides, not a list, so a test added tomorrow lands in the right tier without anyone
remembering a list: a test is slow when its own source, a fixture it uses (at any depth), or a
function of the tests' own it calls (to a few levels) names one of the SLOW_WORDS below. A
module can say `pytestmark = pytest.mark.fast` to count every test in it fast anyway (a quick
subprocess, as the import-graph test's); a `slow` mark always wins.

The rule errs on the slow side: a fast test that calls a helper whose source mentions a daemon is
left out of the fast tier, never the other way round.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]  # tests/, this file being in tests/support/

# What loads llama.cpp's model or context, or starts a process (a daemon, a CLI, a compiler).
SLOW_WORDS = re.compile(
    r"start_daemon|RunningDaemon\(|\bEngine\(|make_engine|NativeModel|NativeContext|EmbeddingContext|"
    r"load_model_and_context|\bLlama\(|llama_model_load|write_models|write_smollm2|smollm2_moe|"
    r"subprocess|Popen|multiprocessing|sys\.executable|RpcServerProcess|add_rpc_server|rpc_device|"
    r"ProcessPool|run_profile|ensure_profile|BackgroundProfiler|ProbeSession|one_layer_probe|deep_probe|"
    r"VisionEncoder"
)
# conftest's fixtures that are a daemon or a model in llama.cpp, whatever their source says.
SLOW_FIXTURES = {"daemon", "client", "eog", "smollm2_moe_path", "rpc_device", "engine"}
# How deep to follow calls into the tests' own helper functions.
DEPTH = 3


@functools.cache
def _slow_source(func: object, depth: int) -> bool:
    """Whether `func`'s source, or that of a function of tests/ it calls by name, names a slow word."""
    try:
        source = textwrap.dedent(inspect.getsource(func))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    if SLOW_WORDS.search(source):
        return True
    if depth == 0:
        return False
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    if module is None:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True  # cannot tell: count it slow
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            target = getattr(module, node.id, None)
            if callable(target) and _ours(target) and target is not func and _slow_source(target, depth - 1):
                return True
    return False


def _ours(obj: object) -> bool:
    """A function or class defined under tests/ (sidecar's own code is judged by what tests call)."""
    try:
        path = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return path is not None and Path(path).resolve().is_relative_to(TESTS)


def is_fast(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow"):
        return False
    if item.get_closest_marker("fast"):
        return True
    if not isinstance(item, pytest.Function):
        return False
    names = set(item.fixturenames)
    if names & SLOW_FIXTURES:
        return False
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        for fixture in defs:
            if _ours(fixture.func) and _slow_source(fixture.func, DEPTH):
                return False
    return not _slow_source(item.function, DEPTH)


def mark_fast(items: list[pytest.Item]) -> None:
    for item in items:
        if is_fast(item) and not item.get_closest_marker("fast"):
            item.add_marker(pytest.mark.fast)


# Tests that must have the machine to themselves. `./scripts/test` runs the rest two at a time
# (pytest-xdist, a worker per core, whole modules to one worker so their daemons are shared) and
# these afterwards in one process, because they measure the machine. (Not tests/gpu/: ggml's device registry lives as long as the process, so once a worker has
# registered an RPC device every later test in it would see a GPU-type device. conftest collects
# them last and scripts/pytest-parts hands modules out in collection order, so a worker that
# starts on them runs nothing else after.)
ALONE = (
    # Machine profiles time the CPU, memory and the loaded PC: the other worker's load would be
    # measured as the player's game.
    "tests/profiler/",
    # The frame guard reads other processes' CPU use as a game's: beside the other worker it
    # would see a game where the test has none.
    "tests/daemon/test_frame_guard_daemon.py",
    "tests/daemon/test_frame_guard_waiting.py",
)


def mark_alone(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid if item.nodeid.startswith("tests/") else "tests/" + item.nodeid
        if path.startswith(ALONE) and not item.get_closest_marker("alone"):
            item.add_marker(pytest.mark.alone)
