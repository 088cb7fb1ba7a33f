"""The shape of sidecar/'s imports: no cycles, and remote mode without llama.cpp.

A cycle makes the order of imports matter (the vision worker once had to import the engine first
so that the encoder's own import of it did not find it half-initialised), and makes a module
impossible to understand alone. Every import counts, at the top of a module or inside a function:
a lazy import that closes a cycle only hides it. `from package import name` depends on the
submodule `package.name` when there is one, else on the package's __init__.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
    assert "sidecar.remote.serve" in edges["sidecar.daemon"]  # imported inside serve()
    assert "sidecar.backend.prompt_layout" in edges["sidecar.remote.backend"]


def test_sidecar_has_no_import_cycles() -> None:
    found = cycles(graph())
    assert found == [], "import cycles in sidecar/:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_remote_mode_and_the_transports_never_load_llama_cpp() -> None:
    """The backend contract, the request types, the service core, every transport and the remote
    backend import nothing native: a daemon that forwards to a server runs without llama.cpp."""
    script = (
        "import sys\n"
        "import sidecar.cli, sidecar.daemon, sidecar.remote.serve, sidecar.backend.contract\n"
        "import sidecar.service.grpc_server, sidecar.service.websocket_bridge, sidecar.service.openai_http\n"
        "import sidecar.service.convert, sidecar.backend.resent_turns\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('llama_cpp', 'sidecar.engine', 'sidecar.native.model')))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
