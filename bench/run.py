#!/usr/bin/env python3
"""xlm-sidecar's benchmarks, one scenario or all, each side by side with its peers in one run.

    python bench/run.py SCENARIO [SCENARIO ...] [--repeats N] [--json-dir DIR] [--quick]
                        [--model PATH] [--llama-bin DIR]

Scenarios:
  single    one stream: decode tokens/s and time to first token; the daemon against llama-cpp-
            python Llama() with defaults and hand-tuned, and llama.cpp's llama-bench (if found)
  batch     aggregate tokens/s at 1, 4, 16 and 64 concurrent conversations, all streamed: the
            daemon against llama-cpp-python's server and llama-server (if found)
  roofline  single-stream decode x bytes read per token, over the DRAM bandwidth the profiler
            measured on this machine
  planner   planner fidelity (predicted against measured pass times) and decision quality
            (against an exhaustive sweep), and decode tokens/s against the budget, measured
            through the daemon beside the planner's prediction
  vision    screenshot questions: peak memory and latency by resolution with and without
            VLMOpt (slow: about a minute per encode on 2 cores)
  churn     reload pauses while the budget keeps changing under 8 live streams
  session   time to first token of turn 2 of a session against turn 1
  village   16 NPCs at once sharing a 1,000-token world prompt, then follow-ups in their
            sessions: the daemon with and without its prefix cache, and llama-server (if found)
  all       every scenario above, in that order

Each scenario prints its table (medians over --repeats, [min .. max]) and writes one JSON to
--json-dir (default bench/results/, not committed) with the commit, the machine, the command
line and the time, for comparing commits. `python bench/report.py` turns the newest result of
each scenario into the README's performance section and the PNGs in docs/perf/.

Measure on an otherwise idle machine: llama.cpp's threads spin, so any other process on the same
cores distorts every figure. --quick shrinks every scenario to a smoke run (not a measurement).
A llama.cpp build with llama-bench and llama-server is found on PATH, in $LLAMA_CPP_BIN or via
--llama-bin; peers that are absent are skipped, and the output says so.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))

DEFAULT_JSON_DIR = BENCH / "results"


def _engine_scenario(name: str) -> Callable[[argparse.Namespace], dict]:
    def scenario(args: argparse.Namespace) -> dict:
        import engine_benchmark

        results: dict = {}
        engine_benchmark.SCENARIOS[name](args.model_path, args, results)
        return results[name]
    return scenario


def scenario_roofline(args: argparse.Namespace) -> dict:
    import roofline

    return roofline.run(args.model_path, tokens=32 if args.quick else 128, repeats=args.repeats)


def scenario_planner(args: argparse.Namespace) -> dict:
    import budget_sweep
    import planner_fidelity

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fidelity.json"
        argv = ["--json", str(out), "--rounds", str(max(3, args.repeats))]
        if args.quick:
            argv += ["--models", "smollm2", "--max-wait", "5"]
        code = planner_fidelity.main(argv)
        if code != 0:
            raise RuntimeError(f"planner_fidelity.py exited with {code}")
        fidelity = json.loads(out.read_text())
    sweep = budget_sweep.run(args.model_path, tokens=32 if args.quick else 64, repeats=args.repeats)
    return {"fidelity": fidelity, "budget_sweep": sweep}


def scenario_vision(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vision.json"
        cmd = [sys.executable, str(BENCH / "vision_benchmark.py"), "--json", str(out)]
        if args.quick:
            cmd += ["--resolutions", "480p", "--layers", "4"]
        subprocess.run(cmd, check=True)
        return json.loads(out.read_text())


def scenario_village(args: argparse.Namespace) -> dict:
    import village

    results: dict = {}
    village.run(args.model_path, args, results)
    return results["village"]


def scenario_churn(args: argparse.Namespace) -> dict:
    import churn

    # On the RPC device (no GPU here) "4G" is all on the device and 24M part of the attention.
    return churn.run(args.model_path, tokens=96 if args.quick else 192, reloads=3 if args.quick else 10,
                     vram="4G", vram_low="24M")


# name -> (what it measures, how to run it); `all` runs them in this order.
SCENARIOS: dict[str, tuple[str, Callable[[argparse.Namespace], dict]]] = {
    "single": ("single-stream decode and time to first token against Llama() and llama-bench", _engine_scenario("single")),
    "batch": ("aggregate tokens/s at 1/4/16/64 streams against llama-cpp-python's server and llama-server", _engine_scenario("batch")),
    "roofline": ("decode bytes/s over this machine's measured DRAM bandwidth", scenario_roofline),
    "planner": ("planner fidelity, decision quality, tokens/s against budget", scenario_planner),
    "vision": ("peak memory and latency by resolution with and without VLMOpt (slow)", scenario_vision),
    "churn": ("reload pauses under budget changes with 8 live streams", scenario_churn),
    "session": ("time to first token of a session's turn 2 against turn 1", _engine_scenario("session")),
    "village": ("16 NPCs at once sharing a world prompt, with and without the prefix cache, and llama-server", scenario_village),
}


def record(name: str, results: dict, args: argparse.Namespace, argv: list[str], started: float, error: str | None) -> dict:
    from machine import describe_machine, git_commit

    return {
        "scenario": name,
        **git_commit(),
        "machine": describe_machine(),
        "command": "python " + shlex.join(["bench/run.py", *argv]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": time.time() - started,
        "repeats": args.repeats,
        "quick": args.quick,
        "model": args.model_path.name,
        "results": results,
        "error": error,
    }


def write_record(rec: dict, json_dir: Path) -> Path:
    json_dir.mkdir(parents=True, exist_ok=True)
    stamp = rec["timestamp"][:19].replace("-", "").replace(":", "")
    path = json_dir / f"{rec['scenario']}-{stamp}-{rec['commit'][:8]}.json"
    path.write_text(json.dumps(rec, indent=2, default=str))
    return path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="+", metavar="SCENARIO", choices=[*SCENARIOS, "all"],
                    help="one or more of: " + ", ".join([*SCENARIOS, "all"]))
    ap.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3; 1 with --quick)")
    ap.add_argument("--json-dir", type=Path, default=DEFAULT_JSON_DIR, help="where results go (default bench/results/)")
    ap.add_argument("--quick", action="store_true", help="a smoke run of each scenario: shorter and fewer, not a measurement")
    ap.add_argument("--model", type=Path, default=None, help="GGUF to measure (default: the bundled SmolLM2-135M)")
    ap.add_argument("--llama-bin", type=Path, default=None, help="folder with llama.cpp's llama-bench and llama-server")
    ap.add_argument("--streams", type=lambda s: tuple(int(n) for n in s.split(",")), default=None,
                    help="batch: concurrent stream counts, e.g. 1,4 (default 1,4,16,64)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    from machine import describe_machine, git_commit, machine_line
    from sidecar.default_model import default_model_path

    args.model_path = args.model or default_model_path()
    names = list(SCENARIOS) if "all" in args.scenarios else list(dict.fromkeys(args.scenarios))
    commit = git_commit()
    print(f"machine: {machine_line(describe_machine())}")
    print(f"commit:  {commit['commit'][:12]}{' (with uncommitted changes)' if commit['dirty'] else ''}; "
          f"model: {args.model_path.name}; repeats: {args.repeats}{'; QUICK (smoke run, not a measurement)' if args.quick else ''}")
    written, failed = [], []
    for name in names:
        started = time.time()
        try:
            results, error = SCENARIOS[name][1](args), None
        except Exception as e:  # one scenario's failure must not lose the others' results
            traceback.print_exc()
            results, error = {}, f"{type(e).__name__}: {e}"
            failed.append(name)
        path = write_record(record(name, results, args, argv, started, error), args.json_dir)
        written.append(path)
        print(f"[{name}] {'FAILED: ' + error if error else 'done'} in {time.time() - started:.0f} s -> {path}")
    print("\nresults: " + ", ".join(str(p) for p in written))
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
