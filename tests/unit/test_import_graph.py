"""The shape of sidecar/'s imports: no cycles, layers that import only downwards (LAYERS), and
remote mode without llama.cpp.

A cycle makes the order of imports matter (the vision worker once had to import the engine first
so that the encoder's own import of it did not find it half-initialised), and makes a module
impossible to understand alone. Every import that runs counts, at the top of a module or inside a
function: a lazy import that closes a cycle only hides it. Imports under `if TYPE_CHECKING:` never
run and do not count (a type annotation may name a caller). `from package import name` depends on
the submodule `package.name` when there is one, else on the package's __init__.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sidecar"
# Generated code (protoc) is left as it comes.
SKIP = ("sidecar.api.xlm",)


def module_names() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not name.startswith(SKIP):
            modules[name] = path
    return modules


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return hidden


def imports_of(name: str, path: Path, modules: dict[str, Path], *, external: bool = False) -> set[str]:
    """The modules of sidecar/ that `name` imports; with `external`, the others too (llama_cpp)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    hidden = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    if external:
        return {m for m in found if m != name}
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_level_and_package_imports() -> None:
    edges = graph()
    assert "sidecar.remote.serve" in edges["sidecar.lifecycle.serve"]  # imported inside serve()
    assert "sidecar.backend.prompt_layout" in edges["sidecar.remote.backend"]


def test_imports_under_type_checking_do_not_count(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\n")
    assert imports_of("m", module, {"a": module, "b": module}) == {"a"}


def test_sidecar_has_no_import_cycles() -> None:
    found = cycles(graph())
    assert found == [], "import cycles in sidecar/:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_remote_mode_and_the_transports_never_load_llama_cpp() -> None:
    """The backend contract, the request types, the service core, every transport and the remote
    backend import nothing native: a daemon that forwards to a server runs without llama.cpp."""
    script = (
        "import sys\n"
        "import sidecar.cli, sidecar.lifecycle.serve, sidecar.remote.serve, sidecar.backend.contract\n"
        "import sidecar.service.grpc_server, sidecar.service.websocket_bridge, sidecar.service.openai_http\n"
        "import sidecar.service.convert, sidecar.backend.resent_turns\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('llama_cpp', 'sidecar.engine', 'sidecar.native.model')))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# Which layer may import which: (importer, forbidden, exceptions, why). An exception names a
# module that may cross the line, as importer or as imported. A prefix names a package and
# everything under it; llama_cpp counts only where a module imports it itself. Drawn
# from what holds, so that a new import across a line fails here and says which line.
LAYERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = (
    ("sidecar.planner", ("llama_cpp", "sidecar.native", "sidecar.engine", "sidecar.service", "sidecar.backend",
                         "sidecar.remote"), (),
     "the planner is pure: figures in, a plan out, testable without llama.cpp"),
    ("sidecar.engine.scheduling", ("llama_cpp", "sidecar.service", "sidecar.remote", "sidecar.engine.engine"), (),
     "step planning is plain Python over slots and jobs; the engine calls it, never the other way"),
    ("sidecar.service", ("llama_cpp", "sidecar.engine", "sidecar.native"), ("sidecar.native.grammar",),
     "the service reaches an engine only through sidecar.backend's contract (remote mode has none); "
     "it checks a grammar with llama.cpp's parser before submitting it"),
    ("sidecar.native", ("sidecar.service", "sidecar.engine", "sidecar.remote", "sidecar.planner", "sidecar.guard"), (),
     "the ctypes layer under everything: it knows llama.cpp and the backend's request types, nothing above"),
    ("sidecar.backend", ("llama_cpp", "sidecar.service", "sidecar.remote", "sidecar.planner"),
     ("sidecar.backend.save_fingerprint",),  # names llama-cpp-python's version in a save, when asked
     "the contract between the service and any backend: request types and shared state, no transport"),
    ("sidecar.remote", ("llama_cpp", "sidecar.engine", "sidecar.native", "sidecar.planner", "sidecar.profiler"), (),
     "remote mode forwards to a server and runs without llama.cpp"),
    ("sidecar.guard", ("llama_cpp", "sidecar.engine", "sidecar.native", "sidecar.planner"), (),
     "the frame guard decides from frame reports and load, whatever backend runs"),
    ("sidecar.errors", ("sidecar",), (), "every layer raises these: they import nothing of ours"),
    ("sidecar.budget", ("sidecar",), ("sidecar.errors",), "a budget is plain data"),
)


def layer_breaches() -> list[str]:
    modules = module_names()
    found = []
    for name, path in sorted(modules.items()):
        imported = imports_of(name, path, modules, external=True)
        for importer, forbidden, allowed, why in LAYERS:
            if not _under(name, importer):
                continue
            for target in sorted(imported):
                excepted = any(_under(target, a) or _under(name, a) for a in allowed)
                if any(_under(target, f) for f in forbidden) and not excepted and not _under(target, importer):
                    found.append(f"{name} imports {target}: {importer} may not import {target.split('.')[0]}"
                                 f"{'.' + target.split('.')[1] if '.' in target else ''} ({why})")
    return found


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_layers_import_only_what_their_rule_allows() -> None:
    found = layer_breaches()
    assert found == [], "imports across a layer's line (LAYERS in this file):\n" + "\n".join(found)


def test_the_layer_rules_name_real_packages() -> None:
    modules = module_names()
    for importer, forbidden, allowed, _ in LAYERS:
        assert any(_under(m, importer) for m in modules), importer
        for name in (*forbidden, *allowed):
            assert name == "llama_cpp" or any(_under(m, name) for m in modules), name


def test_tests_import_each_module_under_one_name() -> None:
    """pytest loads conftest.py and each test file by its own name (tests/ is on sys.path); `from
    tests.conftest import` would load conftest.py a second time, as another module with its own
    state. Helpers live in one place, tests/support/, and are imported `from support.x`: never from
    conftest (fixtures only), nor `from tests.`, nor from a test module of another folder."""
    pattern = re.compile(r"^\s*(from|import)\s+(tests\.|conftest\b)", re.MULTILINE)
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
    # A test module imported by one in another folder is found only when pytest happened to load
    # that folder first (each test file's own folder is put on sys.path as it is collected).
    by_folder = {p.stem: p.parent for p in (REPO / "tests").rglob("test_*.py")}
    crossing = []
    for path in (REPO / "tests").rglob("*.py"):
        for name in re.findall(r"^\s*from\s+(test_\w+)\s+import", path.read_text(), re.MULTILINE):
            if by_folder.get(name) != path.parent:
                crossing.append(f"{path.relative_to(REPO)} imports {name}")
    assert crossing == []
