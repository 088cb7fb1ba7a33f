#!/usr/bin/env python3
"""xlm-sidecar's benchmarks, one scenario or several, each side by side with its peers in one run.

    python bench/run.py SCENARIO [SCENARIO ...] [--repeats N] [--json-dir DIR] [--quick]
                        [--model PATH] [--llama-bin DIR] [the scenarios' own options]
    python -m bench.run ...                       (the same, from the repository's root)
    python bench/run.py SCENARIO --help           (with that scenario's own options)

Each scenario prints its table (medians over --repeats, [min .. max]) and writes one JSON to
--json-dir (default bench/results/, not committed) with the commit, the machine, the command
line and the time, for comparing commits. `python bench/report.py` turns the newest result of
each scenario of the suite into the README's performance section and the PNGs in docs/perf/.

Measure on an otherwise idle machine: llama.cpp's threads spin, so any other process on the same
cores distorts every figure. --quick shrinks every scenario to a smoke run (not a measurement).
A llama.cpp build with llama-bench and llama-server is found on PATH, in $LLAMA_CPP_BIN or via
--llama-bin; peers that are absent are skipped, and the output says so.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Scenario:
    about: str  # one line: --help lists it, bench/README.md's tables say the same
    run: str  # "module:function" in bench/; function(args) -> the results dict
    options: str | None = None  # "module:function" adding the scenario's own options to a group
    suite: bool = True  # in `all` and in report.py's section; the others are run one at a time
    repeats: int | None = 3  # --repeats when not given (1 with --quick); None: it has none


SCENARIOS: dict[str, Scenario] = {
    # The suite, in the order `all` runs it.
    "single": Scenario("one stream: decode tokens/s and time to first token against Llama() and llama-bench",
                       "engine_benchmark:single"),
    "batch": Scenario("aggregate tokens/s at 1/4/16/64 streams against llama-cpp-python's server and llama-server",
                      "engine_benchmark:batch", "engine_benchmark:batch_options"),
    "roofline": Scenario("one stream's decode bytes/s over this machine's measured DRAM bandwidth", "roofline:scenario"),
    "planner": Scenario("planner fidelity, decision quality, decode tokens/s against the budget",
                        "planner_fidelity:scenario", "planner_fidelity:options"),
    "vision": Scenario("peak memory and latency by resolution with and without VLMOpt (slow)",
                       "vision_benchmark:scenario", "vision_benchmark:options"),
    "churn": Scenario("reload pauses under budget changes with 8 live streams", "churn:scenario", "churn:options"),
    "session": Scenario("time to first token of a session's turn 2 against turn 1", "engine_benchmark:session"),
    "village": Scenario("16 NPCs at once sharing a world prompt, with and without the prefix cache, and llama-server",
                        "village:scenario"),
    # Run on their own.
    "soak": Scenario("16 streams for minutes with budget changes and cancels: nothing dropped, lost or leaked",
                     "soak:scenario", "soak:options", suite=False, repeats=None),
    "first-start": Scenario("launch to first token with no profile, then the background profile against a reference",
                            "profile_landing:scenario", "profile_landing:options", suite=False, repeats=5),
    "profile-cost": Scenario("what the install-time profile costs, how two agree, how well they predict decode",
                             "profile_report:scenario", "profile_report:options", suite=False, repeats=None),
    "transport": Scenario("one stream through the daemon's gRPC against the same model in-process",
                          "transport_overhead:scenario", "transport_overhead:options", suite=False, repeats=5),
    "placement": Scenario("planned against measured bytes on a GPU-type device (ggml's RPC), per budget",
                          "device_placement:scenario", "device_placement:options", suite=False, repeats=None),
    "vision-beside": Scenario("one NPC's stream while a 1440p screenshot is encoded beside it",
                              "vision_beside:scenario", "vision_beside:options", suite=False, repeats=2),
    "evening": Scenario("one NPC's session for 50 turns of ~200 tokens on the default context",
                        "npc_evening:scenario", "npc_evening:options", suite=False, repeats=None),
    "api-parity": Scenario("n=4 candidate lines against 4 requests, and embeddings/s against llama-server's",
                           "api_parity:scenario", "api_parity:options", suite=False, repeats=3),
    "ram": Scenario("resident memory at idle against llama-server, through a crowd of 16 NPCs, and under --ram-budget",
                    "host_memory:scenario", suite=False, repeats=2),
    "game": Scenario("a 60 fps game loop's frame times beside 4 NPCs: alone, llama-server, the daemon's frame guard off and on",
                     "game:scenario", "game:options", suite=False, repeats=1),
    "tool-choice": Scenario("tool_choice auto: calls where a tool fits, words where none does, against llama-server",
                            "tool_choice:scenario", "tool_choice:options", suite=False, repeats=None),
    "memory": Scenario("NPC memory: planted facts recalled into the prompt after they left the context, and recall's cost per turn",
                       "memory:scenario", "memory:options", suite=False, repeats=None),
    "structured": Scenario("NPC tool calls and JSON replies: jump-forward against token by token and llama-server",
                           "structured:scenario", "structured:options", suite=False, repeats=3),
    "save-games": Scenario("16 NPCs saved with and without KV, a restart, restored against rebuilt and resent in full",
                           "save_games:scenario", "save_games:options", suite=False, repeats=None),
    "prompt-gap": Scenario("3 streams while a prompt at the size limit, 1 MB or 6 MB arrives: their longest gap",
                           "prompt_gap:scenario", "prompt_gap:options", suite=False, repeats=3),
    "busy-cpu": Scenario("4 streams beside a busy core: the thread governor against maxCpuThreads 1 by hand",
                         "busy_cpu:scenario", "busy_cpu:options", suite=False),
}
SUITE = [name for name, s in SCENARIOS.items() if s.suite]


def _resolve(target: str):
    module, function = target.split(":")
    return getattr(importlib.import_module(f"bench.{module}"), function)


def scenario_list() -> str:
    def rows(suite: bool) -> list[str]:
        return [f"  {name:15}{s.about}" for name, s in SCENARIOS.items() if s.suite == suite]

    return "\n".join(["scenarios:", *rows(True), f"  {'all':15}every scenario above, in that order (the suite report.py reads)",
                      "", "run on their own (not in `all`):", *rows(False)])


def build_parser(names: list[str] = ()) -> argparse.ArgumentParser:
    """The runner's options, and the own options of each scenario in `names`."""
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__, epilog=scenario_list(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="+", metavar="SCENARIO", choices=[*SCENARIOS, "all"],
                    help="one or more of: " + ", ".join([*SCENARIOS, "all"]))
    ap.add_argument("--repeats", type=int, default=None, metavar="N",
                    help="repeats per measurement (default 3, or the scenario's own; 1 with --quick)")
    ap.add_argument("--json-dir", type=Path, default=None, metavar="DIR", help="where results go (default bench/results/)")
    ap.add_argument("--quick", action="store_true", help="a smoke run of each scenario: shorter and fewer, not a measurement")
    ap.add_argument("--model", type=Path, default=None, metavar="PATH", help="GGUF to measure (default: the bundled SmolLM2-135M)")
    ap.add_argument("--llama-bin", type=Path, default=None, metavar="DIR", help="folder with llama.cpp's llama-bench and llama-server")
    for name in dict.fromkeys(names):
        if SCENARIOS[name].options:
            try:
                _resolve(SCENARIOS[name].options)(ap.add_argument_group(f"{name} options"))
            except argparse.ArgumentError as e:
                ap.error(f"{name}: {e}: another scenario named takes it too (run them one at a time)")
    return ap


def named(argv: list[str]) -> list[str]:
    """The scenarios on a command line, before parsing it (their options decide the parser)."""
    names = []
    for a in argv:
        names += SUITE if a == "all" else [a] if a in SCENARIOS else []
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(named(argv)).parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    from bench.common import RESULTS, ScenarioFailed, describe_machine, git_commit, machine_line, record, write_record
    from sidecar.model_info.default_model import default_model_path

    args.json_dir = args.json_dir or RESULTS
    args.model_path = args.model or default_model_path()
    names = named(args.scenarios)
    repeats = {name: args.repeats or (1 if args.quick else SCENARIOS[name].repeats) for name in names
               if SCENARIOS[name].repeats is not None}
    shown = set(repeats.values())
    commit = git_commit()
    print(f"machine: {machine_line(describe_machine())}")
    print(f"commit:  {commit['commit'][:12]}{' (with uncommitted changes)' if commit['dirty'] else ''}; "
          f"model: {args.model_path.name}"
          + (f"; repeats: {shown.pop() if len(shown) == 1 else ', '.join(f'{n} {r}' for n, r in repeats.items())}" if shown else "")
          + ("; QUICK (smoke run, not a measurement)" if args.quick else ""))
    written, failed = [], []
    for name in names:
        started = time.time()
        # Each scenario sees the runner's options with its own repeats resolved.
        scenario_args = argparse.Namespace(**{**vars(args), "repeats": repeats.get(name)})
        try:
            results, error = _resolve(SCENARIOS[name].run)(scenario_args), None
        except ScenarioFailed as e:  # its own check failed: the figures are kept
            results, error = e.results, f"{type(e).__name__}: {e}"
            failed.append(name)
        except Exception as e:  # one scenario's failure must not lose the others' results
            traceback.print_exc()
            results, error = {}, f"{type(e).__name__}: {e}"
            failed.append(name)
        path = write_record(record(name, results, scenario_args, argv, started, error), args.json_dir)
        written.append(path)
        print(f"[{name}] {'FAILED: ' + error if error else 'done'} in {time.time() - started:.0f} s -> {path}")
    print("\nresults: " + ", ".join(str(p) for p in written))
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


def load_package() -> None:
    """Make `bench.*` importable when a file of bench/ is run by path (python bench/run.py).

    Python then puts bench/ itself first on sys.path, not the folder that holds the package, so
    the scenarios' `from bench.common import ...` would not resolve. Loading the package from
    this folder by location keeps sys.path alone, and works from any working directory."""
    folder = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("bench", folder / "__init__.py", submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = package
    spec.loader.exec_module(package)


if __name__ == "__main__":
    if __spec__ is None:  # run by path, not as `python -m bench.run`
        load_package()
    sys.exit(main())
