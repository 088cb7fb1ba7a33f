"""Screenshot questions with and without VLMOpt (issue 7), side by side in one run.

A SigLIP-class encoder (27 blocks, 1152 wide, patch 14, 896 px, f16: Gemma 3's) is generated with
random weights (it costs what a real one costs; it does not see the image) and paired with
SmolLM2-135M. For 480p, 1080p and 1440p screenshots, each in a fresh process so peaks are clean:

  vlmopt     the encoder is loaded for the image and freed before the language model decodes
  resident   the encoder stays loaded, as llama.cpp's own tools run it

Per run: end-to-end latency, encode and load time, host RSS after start, peak RSS while encoding,
peak RSS while decoding. Then, from llama.cpp's own buffer sizes, the VRAM each way would need
on a GPU (this machine has none: those figures are modelled from measured buffers, not read from a
device), the phase check (peak within 10% of the larger phase), and the encoder's attention memory
with and without flash attention at 1440p.

    python bench/run.py vision [--resolutions 480p,1080p,1440p] [--layers 27] [--max-tokens 16] [--threads N]

Run on an idle machine: one 896 px encode is ~5 TFLOP, about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import REPO

RESOLUTIONS = {"480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "1440p": (2560, 1440)}
MIB = 1 << 20


def screenshot_png(width: int, height: int) -> bytes:
    """A game-like frame: smooth gradients and a few shapes (compresses like a real screenshot)."""
    import numpy as np
    from PIL import Image, ImageDraw

    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], axis=2)
    picture = Image.fromarray(rgb.astype("uint8"))
    draw = ImageDraw.Draw(picture)
    for i in range(12):
        draw.ellipse([i * width // 12, height // 3, i * width // 12 + width // 16, height // 3 + height // 8],
                     fill=(255 - 20 * i, 40, 20 * i))
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()


# -- worker (one fresh process per measurement) ------------------------------------------------

class RssSampler:
    """Samples the RSS of this process and its children (the vision worker, which encodes on the
    CPU) every 5 ms, keeping the peak of each named phase."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self.phase = "start"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        import psutil

        total = self._process.memory_info().rss
        for child in self._process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self._rss()
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
            time.sleep(0.005)

    def mark(self, phase: str) -> None:
        rss = self._rss()
        self.peaks[phase] = max(self.peaks.get(phase, 0), rss)
        self.phase = phase

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def worker_ask(spec: dict) -> dict:
    """One image question through the engine, in-process, with RSS by phase."""
    import queue

    from sidecar.model_info.default_model import default_model_path
    from sidecar.engine import Engine
    from sidecar.backend.engine_config import EngineConfig
    from sidecar.backend.requests import IMAGE_MARKER, Finished, GenerationSpec, Prompt, TextDelta
    from sidecar.backend.sampling import SamplingConfig
    from sidecar.vision.encoder_settings import EncoderSettings
    from sidecar.vision.image_input import decode_encoded

    sampler = RssSampler()
    settings = EncoderSettings(Path(spec["projector"]), resident=spec["mode"] == "resident", threads=spec["threads"],
                               fixed_image_size=spec["image_size"], patch_px=spec["patch_px"])
    config = EngineConfig(model_path=default_model_path(), n_ctx=2048, n_seq=1, threads_decode=spec["threads"],
                          threads_prefill=spec["threads"], vision=settings)
    engine = Engine(config)
    time.sleep(3.0)  # the vision worker process starts beside the engine
    sampler.mark("idle")
    images = engine.images  # the CPU encoder runs in the worker; its reply ends the encode phase
    start, done = images._process.start, images._done

    def start_marked(*a):
        sampler.mark("encode")
        return start(*a)

    def done_marked(*a):
        sampler.mark("decode")
        return done(*a)

    images._process.start, images._done = start_marked, done_marked
    png = screenshot_png(*spec["size"])
    t0 = time.perf_counter()
    image = decode_encoded(png, 64 << 20)
    events: queue.Queue = queue.Queue()
    engine.submit(GenerationSpec(prompt=Prompt(messages=(("user", IMAGE_MARKER + "\nWhat is on the screen?"),)),
                                 sampling=SamplingConfig(temperature=0.0), max_tokens=spec["max_tokens"],
                                 image=image, asks_about_image=True), events.put)
    tokens = 0
    while True:
        event = events.get(timeout=1800)
        if isinstance(event, TextDelta):
            tokens += len(event.token_ids)
        elif isinstance(event, Finished):
            break
        else:
            raise RuntimeError(str(event))
    latency = time.perf_counter() - t0
    sampler.mark("after")
    time.sleep(0.2)
    peaks = sampler.stop()
    report = event.image
    stats = engine.snapshot().vision
    load_report = engine.load_report
    engine.close()
    return {
        "latency_s": latency, "encode_ms": report.encode_ms, "load_ms": stats.last_load_ms,
        "ttft_ms": event.timings.time_to_first_token_ms, "tokens": tokens, "image_tokens": report.image_tokens,
        "encoded": list(report.encoded_size), "rss_idle": peaks.get("idle", 0), "rss_encode_peak": peaks.get("encode", 0),
        "rss_decode_peak": peaks.get("decode", 0), "rss_after": peaks.get("after", 0),
        "encoder_compute_bytes": stats.compute_buffer_bytes,
        "text_model_bytes": sum(load_report.model_bytes.values()), "text_kv_bytes": sum(load_report.kv_bytes.values()),
        "text_compute_bytes": sum(load_report.compute_bytes.values()) + sum(load_report.output_bytes.values()),
    }


def worker_flash(spec: dict) -> dict:
    """The encoder's compute buffer (attention included) as llama.cpp sizes it, flash attention on
    and off. llama.cpp reserves it for its largest image at load when warm-up is on."""
    import os

    import llama_cpp
    from llama_cpp import mtmd_cpp

    from sidecar.model_info.default_model import default_model_path
    from sidecar.native.log_capture import capture_native_log
    from sidecar.native.model import NativeModel
    from sidecar.vision.encoder import _COMPUTE_BUFFER

    model = NativeModel(default_model_path())
    out = {}
    for flash in (True, False):
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu, params.warmup = False, True
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        with capture_native_log() as lines:
            ctx = mtmd_cpp.mtmd_init_from_file(os.fsencode(spec["projector"]), model.ptr, params)
        sizes = [float(m.group(1)) for line in lines if (m := _COMPUTE_BUFFER.search(line))]
        out["flash" if flash else "no_flash"] = int(max(sizes) * MIB) if sizes else 0
        mtmd_cpp.mtmd_free(ctx)
    model.close()
    return out


WORKERS = {"ask": worker_ask, "flash": worker_flash}


def run_worker(kind: str, spec: dict) -> dict:
    # From the repository's root, `-m` finds the bench package (see the end of this file).
    done = subprocess.run([sys.executable, "-m", "bench.vision_benchmark", kind, json.dumps(spec)], capture_output=True,
                          text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the comparison ----------------------------------------------------------------------------

def ensure_projector(layers: int) -> Path:
    from platformdirs import user_cache_dir

    from sidecar.testmodels.projector import write_siglip_projector

    folder = Path(user_cache_dir("xlm-sidecar")) / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"siglip_projector_{layers}l.gguf"
    if not path.exists():
        print(f"writing a SigLIP-class projector ({layers} blocks) to {path} ...", flush=True)
        write_siglip_projector(path, n_layer=layers)
    return path


def modelled_vram(run: dict, encoder_weights: int) -> dict:
    """VRAM on a GPU holding the whole text model, from the buffers llama.cpp reported here."""
    language_resident = run["text_model_bytes"] + run["text_kv_bytes"]
    language_phase = language_resident + run["text_compute_bytes"]
    encoder = encoder_weights + run["encoder_compute_bytes"]
    vision_phase = language_resident + encoder
    return {
        "language_phase": language_phase, "vision_phase": vision_phase,
        "peak_vlmopt": max(language_phase, vision_phase), "peak_resident": language_phase + encoder,
    }


def options(group) -> None:
    group.add_argument("--resolutions", default=None, help="default 480p,1080p,1440p (480p with --quick)")
    group.add_argument("--layers", type=int, default=None,
                       help="encoder blocks (default 27 = SigLIP-So400m; 4 with --quick, for a quick look)")
    group.add_argument("--max-tokens", type=int, default=16)
    group.add_argument("--threads", type=int, default=0, help="CPU threads (default: one per physical core)")


def scenario(args: argparse.Namespace) -> dict:
    import psutil

    from sidecar.model_info import inspect_gguf
    from sidecar.planner.vision import encoder_cost

    resolutions = args.resolutions or ("480p" if args.quick else "480p,1080p,1440p")
    layers = args.layers or (4 if args.quick else 27)
    threads = args.threads or psutil.cpu_count(logical=False) or 1
    projector = ensure_projector(layers)
    info = inspect_gguf(projector)
    weights = sum(t.n_bytes for t in info.tensors)
    print(f"encoder: {info.vision.n_layer} blocks, {info.vision.n_embd} wide, patch {info.vision.patch_size}, "
          f"{info.vision.image_size} px, {weights / MIB:.0f} MiB of weights; text model SmolLM2-135M; {threads} threads")

    flash = run_worker("flash", {"projector": str(projector)})
    predicted = encoder_cost(info, info.vision.tokens_per_image)
    print(f"\nencoder compute buffer at 1440p (the encoder sees {info.vision.tokens_per_image} patches at any resolution):")
    print(f"  flash attention on  {flash['flash'] / MIB:8.1f} MiB   (planner: {predicted.compute_bytes(True) / MIB:.1f})")
    print(f"  flash attention off {flash['no_flash'] / MIB:8.1f} MiB   (planner: {predicted.compute_bytes(False) / MIB:.1f})")
    print(f"  attention memory saved by flash attention: {(flash['no_flash'] - flash['flash']) / MIB:.0f} MiB "
          f"({flash['no_flash'] / max(flash['flash'], 1):.1f}x less compute buffer)")

    rows = []
    for name in resolutions.split(","):
        for mode in ("vlmopt", "resident"):
            spec = {"projector": str(projector), "mode": mode, "size": RESOLUTIONS[name], "threads": threads,
                    "max_tokens": args.max_tokens, "image_size": info.vision.image_size,
                    "patch_px": info.vision.patch_size * info.vision.scale_factor}
            print(f"  {name} {mode} ...", end="", flush=True)
            run = run_worker("ask", spec)
            run |= {"resolution": name, "mode": mode, "vram": modelled_vram(run, weights)}
            rows.append(run)
            print(f" {run['latency_s']:.1f} s")

    print(f"\n{'resolution':10} {'mode':9} {'latency s':>9} {'encode s':>9} {'load ms':>8} {'RSS idle':>9} "
          f"{'RSS encode':>10} {'RSS decode':>10}   (MiB)")
    for r in rows:
        load = r["load_ms"] if r["mode"] == "vlmopt" else 0.0
        print(f"{r['resolution']:10} {r['mode']:9} {r['latency_s']:9.2f} {r['encode_ms'] / 1000:9.2f} {load:8.0f} "
              f"{r['rss_idle'] / MIB:9.0f} {r['rss_encode_peak'] / MIB:10.0f} {r['rss_decode_peak'] / MIB:10.0f}")
    by = {(r["resolution"], r["mode"]): r for r in rows}
    print("\nVLMOpt against resident, per resolution:")
    for name in resolutions.split(","):
        a, b = by[(name, "vlmopt")], by[(name, "resident")]
        print(f"  {name:6} latency {a['latency_s'] / b['latency_s']:.2f}x, RSS while decoding "
              f"{(b['rss_decode_peak'] - a['rss_decode_peak']) / MIB:+.0f} MiB saved, peak RSS "
              f"{a['rss_encode_peak'] / MIB:.0f} vs {b['rss_encode_peak'] / MIB:.0f} MiB")
    v = rows[-1]["vram"]
    larger = max(v["language_phase"], v["vision_phase"])
    print("\nVRAM on a GPU (modelled from the buffers llama.cpp reported here; no GPU on this machine):")
    print(f"  language phase {v['language_phase'] / MIB:.0f} MiB, vision phase {v['vision_phase'] / MIB:.0f} MiB")
    print(f"  peak with VLMOpt {v['peak_vlmopt'] / MIB:.0f} MiB = {v['peak_vlmopt'] / larger:.2f}x the larger phase "
          f"(target <= 1.10); resident encoder {v['peak_resident'] / MIB:.0f} MiB = {v['peak_resident'] / larger:.2f}x")
    budget = larger + (v["peak_resident"] - larger) // 2
    print(f"  a budget of {budget / MIB:.0f} MiB runs 1440p with VLMOpt; the resident encoder needs "
          f"{v['peak_resident'] / MIB:.0f} MiB there and does not fit")
    return {"flash_compute_bytes": flash, "runs": rows, "encoder_weight_bytes": weights, "threads": threads}


if __name__ == "__main__":  # one measurement in a fresh process (run_worker): its peaks are its own
    print(json.dumps(WORKERS[sys.argv[1]](json.loads(sys.argv[2]))))
