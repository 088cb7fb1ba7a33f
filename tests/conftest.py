"""Shared fixtures: a real daemon process on a free port, serving the real default model.

Fixtures only: test files import helpers from tests/support/ (`from support.daemons import ...`;
pytest puts tests/ on sys.path for this file), never from conftest, nor `from tests.`: a second
name would load a module again with its own copies of everything (unit/test_import_graph.py checks).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.client import SidecarClient
from sidecar.model_info.default_model import default_model_path
from support.daemons import RunningDaemon, require_rpc, start_daemon, stop_daemon
from support.suite_model import suite_model_path
from support.run_summary import pytest_terminal_summary, pytest_testnodedown  # noqa: F401 (hooks: the run ends with what it skipped)
from support.tiers import mark_alone, mark_fast

# Hermetic: the whole run, and every daemon it starts (they inherit the environment), keeps its
# cache (machine profiles, profiler probes) in a folder of its own, made here before any test or
# daemon starts and removed at the end. Without it a test daemon would plan with, and measure
# into, the developer's own ~/.cache/xlm-sidecar/profiles, and plans would differ by machine.
_CACHE = tempfile.mkdtemp(prefix="xlm-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2 as the suite serves it: requantized to Q4_0 (support/suite_model.py)."""
    return suite_model_path()


@pytest.fixture(scope="module")
def smollm2_vocab() -> Iterator[object]:
    """SmolLM2's tokenizer alone (llama.cpp's vocab_only load: no weights, no context), for tests
    of what a grammar allows: the bundled file's, which the suite's Q4_0 copy shares."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(str(default_model_path())), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


@pytest.fixture(scope="session")
def daemon() -> Iterator[RunningDaemon]:
    """One daemon on SmolLM2 (the suite's Q4_0 copy: support/suite_model.py) for the whole test session."""
    running = start_daemon("--budget", "0")
    yield running
    stop_daemon(running)


@pytest.fixture
def client(daemon: RunningDaemon) -> Iterator[SidecarClient]:
    with daemon.client(timeout_s=120) as c:
        yield c


@pytest.fixture(scope="session")
def eog(daemon: RunningDaemon) -> tuple[int, ...]:
    """The session daemon's end-of-generation token ids, to ban where a test needs a reply to run
    its whole length (no_early_stop.py)."""
    from support.no_early_stop import grpc_eog_ids

    with daemon.client(timeout_s=120) as c:
        return grpc_eog_ids(c)


@pytest.fixture(scope="session")
def rpc_device() -> Iterator[str]:
    """A GPU-type ggml device (RPC0) registered in this test process, served from a second process
    (sidecar.native.ggml_rpc; see tests/support/device_helpers.py). One per test process: a client keeps its
    connection for its whole life, and a server serves one client at a time."""
    from sidecar.native.ggml_rpc import RpcServerProcess, add_rpc_server

    require_rpc()
    with RpcServerProcess(threads=1) as server:
        (name,) = add_rpc_server(server.endpoint)
        yield name


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Path]]:
    """The test models of sidecar.testmodels, each written once per run into one folder, when a
    test first asks for it: `model_files("tiny_llama", "tiny_projector")` -> {name: path};
    `model_files()` -> every tiny model (ensure_test_models)."""
    from sidecar.testmodels import ensure_test_models, write_models

    folder = tmp_path_factory.mktemp("test-models")

    def files(*names: str) -> dict[str, Path]:
        return write_models(folder, names) if names else ensure_test_models(folder)

    return files


@pytest.fixture(scope="session")
def smollm2_moe_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's SmolLM2 (its Q4_0 copy, support/suite_model.py) as a mixture of 4 identical
    experts, written once per test process. Made from the bundled Q4_1 file, the MoE's
    prefix-sharing test took 30.8 s alone on the 2-core Xeon, 24.9 s now. Tests of the MoE writer
    itself, and of its bit-identity with the dense Q4_1 model, write their own
    (engine/test_testmodels.py)."""
    from sidecar.testmodels import write_smollm2_moe

    path = write_smollm2_moe(tmp_path_factory.mktemp("smollm2-moe") / "smollm2_moe.gguf", source=suite_model_path())
    yield path
    path.unlink(missing_ok=True)  # 250 MB: pytest keeps the last runs' temp folders


def pytest_report_header(config: pytest.Config) -> str:
    """Which llama.cpp build runs the tests: its CPU features decide how kernels round, so a
    report from another machine names them (scripts/test-other-kernels runs a second build)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return f"llama.cpp: {Path(llama_cpp.__file__).parent} | {info}"


@pytest.hookimpl(tryfirst=True)  # before `-m fast` selects by the mark
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that load no model and start no process are marked `fast` (tiers.py): `./scripts/test
    --fast` runs only them. The GPU-device tests run last: registering the RPC device is for the
    life of the process (ggml has no way to take a device out of its registry), and every test
    after it would see a GPU-type device where it expects this machine as it is. Under xdist,
    scripts/pytest-parts hands modules out in this order, so they end the worker that runs them."""
    mark_fast(items)
    mark_alone(items)
    gpu = [i for i in items if "tests/gpu/" in i.nodeid or i.nodeid.startswith("gpu/")]
    if gpu:
        rest = [i for i in items if i not in gpu]
        items[:] = rest + gpu
