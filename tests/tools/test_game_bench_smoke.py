"""The game scenario (bench/run.py game --quick) as a smoke test: the game loop, a daemon beside it
with the guard off, on with frame reports, and on watching the game, each side's figures written.
The targets themselves are the benchmark's to check, on a quiet machine (README, "The frame-time
guard"): a timed assertion here would fail on a busy one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.suite_model import suite_model_path

REPO = Path(__file__).resolve().parents[2]
SIDES = ("alone", "guard off", "guard on (reports)", "guard on (watching)")


def test_the_game_scenario_runs_every_side_and_writes_its_figures(tmp_path: Path) -> None:
    # Short replies, on the suite's model: what is checked is that each side runs and
    # reports, not its figures (41 s of the loaded suite with 128-token replies; the sides stay 3 s
    # long, as a shorter one ends before the game's first frame report reaches the guard).
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "game", "--quick", "--json-dir", str(tmp_path),
         "--model", str(suite_model_path()), "--game-threads", "1", "--seconds", "3", "--tokens", "32",
         "--sides", ",".join(SIDES)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = tmp_path.glob("game-*.json")
    sides = json.loads(result.read_text())["results"]["variants"]["1"]
    assert set(sides) == set(SIDES)
    for name, (figures,) in sides.items():
        assert figures["p50"] > 0 and figures["p99"] >= figures["p50"], (name, figures)
        assert 0 <= figures["late_pct"] <= 100 and 0 <= figures["hitch_pct"] <= 100
        if name != "alone":  # the NPCs streamed beside the game, and none of their requests failed
            assert figures["tokens_per_s"] > 0 and figures["npc_errors"] == 0, (name, figures)
    assert sides["guard off"][0]["guard"]["source"] == "off"
    assert sides["guard on (reports)"][0]["guard"]["source"] == "frame reports"
    assert sides["guard on (reports)"][0]["report_errors"] == 0  # the game's reports count (game token)
    assert sides["guard on (watching)"][0]["guard"]["source"] == "watching the game process"
    assert "game on 1 thread(s)" in done.stdout
