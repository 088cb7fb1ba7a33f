#!/usr/bin/env python3
"""The README's performance section and its plots, from bench/run.py's results.

Reads the newest JSON of each scenario in --json-dir, writes PNGs to --out-dir (docs/perf/) and
replaces the text between `<!-- perf:begin -->` and `<!-- perf:end -->` in --readme with tables,
the plots, the machine the figures come from and the commands that produced them.

    python bench/report.py [--json-dir bench/results] [--out-dir docs/perf] [--readme README.md]
                           [--stdout]
    python -m bench.report ...          (the same, from the repository's root)

--stdout prints the section instead of writing the README (the PNGs are written either way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"
MIB = 1 << 20


class MarkersMissing(ValueError):
    pass


# -- reading results ------------------------------------------------------------------------------


def load_latest(json_dir: Path) -> dict[str, dict]:
    """The newest record of each scenario in `json_dir` (by its timestamp, then file name)."""
    latest: dict[str, tuple[tuple[str, str], dict]] = {}
    for path in sorted(json_dir.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict) or "scenario" not in rec or "results" not in rec:
            continue
        key = (rec.get("timestamp", ""), path.name)
        if rec["scenario"] not in latest or key > latest[rec["scenario"]][0]:
            latest[rec["scenario"]] = (key, rec)
    return {name: rec for name, (_, rec) in latest.items()}


# -- formatting -----------------------------------------------------------------------------------


def cell(values: list[float], digits: int = 1) -> str:
    """A table cell: 'median [min .. max]', the single value, or '-' for none."""
    from bench.common import spread

    if not values:
        return "-"
    if len(values) == 1:
        return f"{statistics.median(values):.{digits}f}"
    return spread(values, f".{digits}f", sep=" ")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def image(name: str, rel: str, alt: str) -> str:
    return f"![{alt}]({rel}/{name})"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _errbars(values_per_x: list[list[float]]) -> tuple[list[float], list[list[float]]]:
    meds = [statistics.median(v) for v in values_per_x]
    return meds, [[m - min(v) for m, v in zip(meds, values_per_x)], [max(v) - m for m, v in zip(meds, values_per_x)]]


# -- one section per scenario: (markdown, plots written) ---------------------------------------------------


def section_single(res: dict, out: Path, rel: str) -> str:
    ttft = res.get("ttft_ms", {})
    rows = [[name, cell(v), cell(ttft[name], 0) if name in ttft else "n/a"] for name, v in res["rows"].items()]
    r = res["ratios"]
    text = [table(["side", "decode tokens/s", "time to first token (ms)"], rows), "",
            f"Daemon / Llama() defaults: **{r['vs_defaults']:.2f}x** decode (target 1.3x); / hand-tuned "
            f"**{r['vs_hand_tuned']:.2f}x** (target 1.0x)"
            + (f"; / llama-bench **{r['vs_llama_bench']:.2f}x** (aim 0.95x)" if "vs_llama_bench" in r else "; llama-bench not run")
            + f". {res.get('tokens', 128)} tokens per reply, greedy"
            + (", runs interleaved." if res.get("interleaved") else ".")]
    if "llama_bench_vs_defaults" in r:
        text.append(f"llama.cpp's own best (llama-bench) / Llama() defaults is {r['llama_bench_vs_defaults']:.2f}x on this "
                    "machine: llama.cpp's decode loop with no sampling and no streaming, what any side built on it is measured against.")
    plt = _plt()
    names = list(res["rows"])
    meds, err = _errbars([res["rows"][n] for n in names])
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    ax.barh(names, meds, xerr=err, color=["tab:blue"] + ["tab:gray"] * (len(names) - 1), capsize=4)
    ax.invert_yaxis()
    ax.set_xlabel("decode tokens/s (one stream)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "single_stream.png", dpi=110)
    plt.close(fig)
    text += ["", image("single_stream.png", rel, "decode tokens/s, one stream")]
    return "\n".join(text)


def section_batch(res: dict, out: Path, rel: str) -> str:
    sides = list(res["table"])
    streams = sorted({int(n) for row in res["table"].values() for n in row})
    rows = [[side] + [cell(res["table"][side].get(str(n), [])) for n in streams] for side in sides]

    def label(n: int) -> str:
        return f"{n} stream" + ("s" if n != 1 else "")

    r = res["ratios"]
    ratio_cells = [f"{label(n)} {r[f'vs_llama_cpp_python_{n}']:.2f}x" for n in streams if f"vs_llama_cpp_python_{n}" in r]
    text = [table(["aggregate tokens/s"] + [label(n) for n in streams], rows), "",
            "Daemon / llama-cpp-python server: " + ", ".join(ratio_cells) + " (targets 2.5x at 4, 4x at 16)."]
    server = [f"{label(n)} {r[f'vs_llama_server_{n}']:.2f}x" for n in streams if f"vs_llama_server_{n}" in r]
    text.append(("Daemon / llama-server (slots = streams): " + ", ".join(server) + " (target >= 1.0x).")
                if server else "llama-server not run.")
    http = [f"{label(n)} {r[f'http_vs_llama_server_{n}']:.2f}x" for n in streams if f"http_vs_llama_server_{n}" in r]
    if http:
        text.append("Daemon HTTP API / llama-server, the same OpenAI client code and requests: " + ", ".join(http)
                    + " (target >= 1.0x).")
    if "single_stream_decode_http_vs_grpc" in r:
        text.append(f"One stream's decode tokens/s, daemon HTTP / gRPC: {r['single_stream_decode_http_vs_grpc']:.3f}x"
                    " (target >= 0.97x).")
    text.append(f"{res.get('max_tokens', 64)} tokens per conversation, greedy, every side streamed"
                + (", rounds interleaved" if res.get("interleaved") else "") + "; "
                + res.get("token_counting", "") + ".")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for side in sides:
        xs = [n for n in streams if res["table"][side].get(str(n))]
        meds, err = _errbars([res["table"][side][str(n)] for n in xs])
        ax.errorbar(xs, meds, yerr=err, marker="o", capsize=3, label=side)
    ax.set_xscale("log", base=2)
    ax.set_xticks(streams, [str(n) for n in streams])
    ax.set_xlabel("concurrent conversations")
    ax.set_ylabel("aggregate tokens/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "batch_throughput.png", dpi=110)
    plt.close(fig)
    text += ["", image("batch_throughput.png", rel, "aggregate tokens/s against concurrent conversations")]
    return "\n".join(text)


def section_roofline(res: dict, out: Path, rel: str) -> str:
    t = res["traffic"]
    rows = [["decode (daemon, one stream)", cell(res["decode_tokens_per_s"]) + " tokens/s"],
            ["bytes read per token", f"{t['total'] / 1e6:.1f} MB (weights {t['weight_bytes'] / 1e6:.1f} MB, KV "
                                     f"{t['kv_bytes'] / 1e6:.2f} MB at a mean context of {t['mean_context']:.0f}, {res.get('kv_type', 'F16')})"],
            ["achieved", cell(res["achieved_gbps"], 2) + " GB/s"],
            ["measured DRAM read bandwidth", f"{res['dram_gbps']:.1f} GB/s (profile)"],
            ["achieved / DRAM", cell(res["ratio"], 2)]]
    return table(["", ""], rows)


def section_planner(res: dict, out: Path, rel: str) -> str:
    text = []
    fid = res.get("fidelity")
    plt = _plt()
    if fid:
        points = fid["points"]
        models = sorted({p["model"] for p in points})
        text.append(f"Fidelity: median absolute error of predicted against measured pass time "
                    f"**{fid['median_abs_error']:.1%}** over {len(points)} passes (target <= 15%).")
        per_model = [[m, str(sum(p["model"] == m for p in points)),
                      f"{statistics.median(abs(p['error']) for p in points if p['model'] == m):.1%}"] for m in models]
        text += ["", table(["model", "passes", "median abs error"], per_model)]
        if fid.get("decisions"):
            dec = [[d["model"], d["tier"], d["chosen"], f"{d['chosen_ms']:.2f}", d["best"], f"{d['best_ms']:.2f}", f"{d['loss']:.1%}"]
                   for d in fid["decisions"]]
            text += ["", "Decision quality: the schedule's knobs against the best of an exhaustive sweep (target: within 5%).", "",
                     table(["model", "tier", "chosen", "ms", "best", "ms", "loss"], dec)]
        fig, ax = plt.subplots(figsize=(6, 6))
        for m in models:
            sub = [p for p in points if p["model"] == m]
            ax.scatter([p["measured_ms"] for p in sub], [p["predicted_ms"] for p in sub], label=m, s=18)
        lo = min(min(p["measured_ms"], p["predicted_ms"]) for p in points) * 0.8
        hi = max(max(p["measured_ms"], p["predicted_ms"]) for p in points) * 1.25
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
        ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="gray", alpha=0.2, label="±15%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured ms per pass")
        ax.set_ylabel("predicted ms per pass")
        ax.legend(fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "planner_fidelity.png", dpi=110)
        plt.close(fig)
        text += ["", image("planner_fidelity.png", rel, "predicted against measured pass time")]
    sweep = res.get("budget_sweep")
    if sweep and sweep.get("points"):
        pts = sweep["points"]
        rows = [[f"{p['vram_bytes'] / MIB:.0f} MiB", str(p["max_cpu_threads"]), cell(p["measured_tokens_per_s"]),
                 f"{p['predicted_tokens_per_s']:.1f}"] for p in pts]
        text += ["", "Decode tokens/s against the budget (one stream, through the daemon) beside the planner's prediction:", "",
                 table(["VRAM budget", "thread cap", "measured tokens/s", "predicted"], rows)]
        vrams = sorted({p["vram_bytes"] for p in pts})
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if len(vrams) == 1:  # no GPU: the budget that changes is the thread cap
            xs = [p["max_cpu_threads"] for p in pts]
            meds, err = _errbars([p["measured_tokens_per_s"] for p in pts])
            ax.errorbar(xs, meds, yerr=err, marker="o", capsize=3, label="measured")
            ax.plot(xs, [p["predicted_tokens_per_s"] for p in pts], marker="s", ls="--", label="predicted")
            ax.set_xticks(xs)
            ax.set_xlabel(f"CPU thread cap (VRAM budget {vrams[0] / MIB:.0f} MiB)")
        else:
            for cap in sorted({p["max_cpu_threads"] for p in pts}):
                sub = [p for p in pts if p["max_cpu_threads"] == cap]
                xs = [p["vram_bytes"] / (1 << 30) for p in sub]
                meds, err = _errbars([p["measured_tokens_per_s"] for p in sub])
                line = ax.errorbar(xs, meds, yerr=err, marker="o", capsize=3, label=f"measured, {cap} threads")
                ax.plot(xs, [p["predicted_tokens_per_s"] for p in sub], marker="s", ls="--", color=line[0].get_color(),
                        label=f"predicted, {cap} threads")
            ax.set_xlabel("VRAM budget (GiB)")
        ax.set_ylabel("decode tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "budget_tokens_per_s.png", dpi=110)
        plt.close(fig)
        text += ["", image("budget_tokens_per_s.png", rel, "decode tokens/s against the budget")]
    return "\n".join(text) or "No figures in this result."


def section_vision(res: dict, out: Path, rel: str) -> str:
    runs = res["runs"]
    rows = [[r["resolution"], r["mode"], f"{r['latency_s']:.2f}", f"{r['encode_ms'] / 1000:.2f}",
             f"{r['rss_encode_peak'] / MIB:.0f}", f"{r['rss_decode_peak'] / MIB:.0f}", f"{r['vram']['peak_vlmopt' if r['mode'] == 'vlmopt' else 'peak_resident'] / MIB:.0f}"]
            for r in runs]
    flash = res.get("flash_compute_bytes") or {}
    text = [table(["resolution", "mode", "latency s", "encode s", "peak RSS encoding (MiB)", "peak RSS decoding (MiB)",
                   "modelled VRAM peak (MiB)"], rows)]
    if flash:
        text += ["", f"Encoder compute buffer: {flash['flash'] / MIB:.0f} MiB with flash attention, "
                     f"{flash['no_flash'] / MIB:.0f} MiB without."]
    plt = _plt()
    resolutions = list(dict.fromkeys(r["resolution"] for r in runs))
    by = {(r["resolution"], r["mode"]): r for r in runs}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for k, mode in enumerate(("vlmopt", "resident")):
        xs = [i + (k - 0.5) * width for i in range(len(resolutions))]
        axes[0].bar(xs, [by[(res_, mode)]["rss_encode_peak"] / MIB if (res_, mode) in by else 0 for res_ in resolutions],
                    width, label=mode)
        key = "peak_vlmopt" if mode == "vlmopt" else "peak_resident"
        axes[1].bar(xs, [by[(res_, mode)]["vram"][key] / MIB if (res_, mode) in by else 0 for res_ in resolutions], width, label=mode)
    for ax, title in zip(axes, ("peak host RSS while encoding (MiB)", "modelled VRAM peak on a GPU (MiB)")):
        ax.set_xticks(range(len(resolutions)), resolutions)
        ax.set_title(title, fontsize="medium")
        ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "vision_memory.png", dpi=110)
    plt.close(fig)
    text += ["", image("vision_memory.png", rel, "vision peak memory by resolution, VLMOpt against a resident encoder")]
    return "\n".join(text)


def section_churn(res: dict, out: Path, rel: str) -> str:
    pauses = res.get("pause_ms") or []
    how = ("SetBudget through the daemon" if res.get("via") == "daemon"
           else "forced reloads in the engine (`Engine.reload(config, force=True)`): without a GPU no budget changes placement")
    rows = [["reloads", str(len(pauses))],
            ["pause (ms)", (f"median {statistics.median(pauses):.0f}, p90 {res['pause_p90_ms']:.0f}, max {max(pauses):.0f}"
                            if pauses else "no reload happened")],
            ["longest gap a stream saw (ms, per round)", ", ".join(f"{g:.0f}" for g in res.get("max_gap_ms", []))],
            ["streams complete with the uninterrupted run's tokens", "yes" if res.get("ok") else
             "NO: " + "; ".join(res.get("problems", [])[:3])]]
    return f"{res.get('streams', 8)} live streams, a change every {res.get('every_s', 2):g} s, via {how}.\n\n" + table(["", ""], rows)


def section_session(res: dict, out: Path, rel: str) -> str:
    rows = [[f"turn 1 ({res.get('persona_prompt_tokens', '?')} prompt tokens)", cell(res["turn1_ms"], 0)],
            ["turn 2 (same session)", cell(res["turn2_ms"], 0)],
            ["turn 2 / turn 1", f"{res['ratio']:.2f}x (target 0.2x)"]]
    return table(["time to first token", "ms"], rows)


def section_village(res: dict, out: Path, rel: str) -> str:
    keys = [("npc1_ttft_ms", "NPC 1 ttft (ms)"), ("npc2_16_ttft_median_ms", "others, median (ms)"),
            ("ttft_p90_ms", "p90 (ms)"), ("all_spoken_ms", "all spoken (ms)"), ("tokens_per_s", "tokens/s"),
            ("decode_tokens_per_s", "decode tokens/s"), ("prompt_tokens_computed", "prompt tokens computed")]
    parts = []
    for wave, title in (("wave1", "first turns, all at once"), ("wave2", "follow-ups in the sessions")):
        rows = []
        for side, waves in res["table"].items():
            cells = []
            for key, _ in keys:
                values = [r[key] for r in waves[wave] if r.get(key) is not None]
                cells.append(cell(values, 0) if values else "n/a")
            rows.append([side, *cells])
        parts.append(f"{title}:\n\n" + table(["side", *(label for _, label in keys)], rows))
    r, s = res["ratios"], res["sizes"]
    parts.append(
        f"{res['npcs']} NPCs, a {s['world_tokens']}-token world, {s['persona_tokens']:.0f}-token personas, "
        f"{s['line_tokens']:.0f}-token lines, {res['reply_tokens']} reply tokens, greedy. With the cache, all spoken "
        f"**{r['all_spoken_speedup_vs_no_cache']:.1f}x** sooner than without (target 3x), decode tokens/s "
        f"{r['decode_tokens_per_s_vs_no_cache']:.2f}x (target >= 1.0x); "
        + (f"all spoken **{r['all_spoken_speedup_vs_llama_server']:.1f}x** sooner than llama-server (target 3x); "
           if "all_spoken_speedup_vs_llama_server" in r else "llama-server not run; ")
        + f"NPCs 2-{res['npcs']} / NPC 1: "
        f"{r['npc2_16_over_npc1']:.2f}x (target 0.25x: out of reach when all are sent at once, every NPC waits "
        "for the one prefill of the shared world)."
    )
    return "\n\n".join(parts)


SECTIONS: dict[str, tuple[str, Callable[[dict, Path, str], str]]] = {
    "single": ("Single stream", section_single),
    "batch": ("Many conversations at once", section_batch),
    "roofline": ("Decode against the memory roofline", section_roofline),
    "planner": ("Planner: fidelity, decisions, tokens/s against budget", section_planner),
    "vision": ("Vision: VLMOpt against a resident encoder", section_vision),
    "churn": ("Budget churn: reload pauses", section_churn),
    "session": ("Sessions: time to first token of turn 2", section_session),
    "village": ("A village: 16 NPCs sharing a world prompt", section_village),
}


# -- the whole section ------------------------------------------------------------------------------


def render(records: dict[str, dict], out_dir: Path, rel: str) -> str:
    """The Markdown between the markers; writes the plots into out_dir."""
    from bench.common import machine_line
    from bench.run import SUITE

    out_dir.mkdir(parents=True, exist_ok=True)
    parts: list[str] = []
    if not records:
        return "No benchmark results yet: run `python bench/run.py all`, then `python bench/report.py`."
    machines = list(dict.fromkeys(machine_line(r["machine"]) for r in records.values() if r.get("machine")))
    commits = list(dict.fromkeys(r.get("commit", "unknown")[:12] + (" (uncommitted changes)" if r.get("dirty") else "")
                                 for r in records.values()))
    commands = list(dict.fromkeys(r.get("command", "") for r in records.values() if r.get("command")))
    stamps = sorted(r.get("timestamp", "") for r in records.values())
    parts.append("Generated by `python bench/report.py` from these runs:\n")
    parts.append("```sh\n" + "\n".join(commands) + "\n```\n")
    parts.append("- machine: " + "; and ".join(machines) if machines else "- machine: not recorded")
    parts.append(f"- commit: {', '.join(commits)}")
    parts.append(f"- measured: {stamps[0][:16].replace('T', ' ')}" + (f" to {stamps[-1][:16].replace('T', ' ')}" if stamps[-1] != stamps[0] else ""))
    loads = [r["machine"].get("load_average_1m") for r in records.values() if r.get("machine", {}).get("load_average_1m") is not None]
    if loads:
        span = f"{min(loads):.2f}" if min(loads) == max(loads) else f"{min(loads):.2f} to {max(loads):.2f}"
        parts.append(f"- load average (1 min) as the runs started: {span} "
                     "(other work on the same cores distorts every figure)")
    parts.append("\nFigures are medians over the repeats, with [min .. max].")
    for name in SUITE:
        title, render_one = SECTIONS[name]
        rec = records.get(name)
        parts.append(f"\n### {title}\n")
        if rec is None:
            parts.append(f"Not run: `python bench/run.py {name}`.")
            continue
        if rec.get("error"):
            parts.append(f"The run failed: {rec['error']}.")
            continue
        if rec.get("quick"):
            parts.append("*A smoke run (`--quick`): shorter replies and fewer repeats, not a measurement.*\n")
        parts.append(render_one(rec["results"], out_dir, rel))
    return "\n".join(parts).strip()


def replace_section(readme: str, body: str) -> str:
    """`readme` with the text between the markers replaced by `body`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < 0 or end < start:
        raise MarkersMissing(f"the README needs {BEGIN} and {END} (in that order) around the performance section")
    return readme[: start + len(BEGIN)] + "\n" + body + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    from bench.common import REPO, RESULTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json-dir", type=Path, default=RESULTS)
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "perf")
    ap.add_argument("--readme", type=Path, default=REPO / "README.md")
    ap.add_argument("--stdout", action="store_true", help="print the section instead of writing it into the README")
    args = ap.parse_args(argv)
    records = load_latest(args.json_dir)
    rel = Path(os.path.relpath(args.out_dir.resolve(), args.readme.resolve().parent)).as_posix()
    body = render(records, args.out_dir, rel)
    if args.stdout:
        print(body)
        return 0
    try:
        args.readme.write_text(replace_section(args.readme.read_text(), body))
    except MarkersMissing as e:
        print(f"{args.readme}: {e}", file=sys.stderr)
        return 2
    print(f"wrote the performance section of {args.readme} from {len(records)} scenario(s) "
          f"({', '.join(sorted(records)) or 'none'}) and plots in {args.out_dir}")
    return 0


if __name__ == "__main__":
    if __spec__ is None:  # run by path: bench/ is first on sys.path, so run.py is found as `run`
        from run import load_package

        load_package()
    sys.exit(main())
