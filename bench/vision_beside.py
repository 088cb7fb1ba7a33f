"""Screenshots beside dialogue (issue 18, 4): one NPC's stream while another question's 1440p
screenshot is encoded by the SigLIP-class generated projector, on one daemon, rounds interleaved.

Per round, one after another on the same daemon:
  stream alone   one Generate stream, tokens/s over `--window` seconds
  image alone    one AskImage (1440p), latency from the call to its last chunk
  both           the stream running, then the AskImage: the stream's tokens/s and longest gap
                 between chunks while the image encodes, and the image's latency
Targets: longest gap <= 1 s; stream tokens/s during the encode >= 40% of alone; image latency
<= 1.5x alone. The stream is a chain of long story requests, so it outlasts any encode; the gap
between two requests of the chain counts like any other.

    python bench/run.py vision-beside [--repeats 2] [--layers 27] [--window 20]

Writes the 850 MB projector to the cache on first use (bench/vision_benchmark.py's). One round is
about four minutes on 2 cores (--quick: one round of a 4-block projector, 5 s windows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

STORY = "Tell me a very long story about {tag}, a lighthouse keeper, and the sea, with many chapters."


class ChainedStream(threading.Thread):
    """Back-to-back long requests on one client; records (arrival time, tokens) per chunk."""

    def __init__(self, daemon, tag: str) -> None:
        super().__init__(daemon=True)
        self._daemon, self._tag = daemon, tag
        self.chunks: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from sidecar.api import pb

        with self._daemon.client(timeout_s=900) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                text = STORY.format(tag=f"{self._tag} part {n}")
                request = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]),
                                             max_tokens=2000, sampling=pb.SamplingParams(temperature=0.0))
                calls = client._stub.Generate(request, timeout=900)
                for chunk in calls:
                    self.chunks.append((time.perf_counter(), len(chunk.token_ids)))
                    if self.stop.is_set():
                        calls.cancel()
                        break

    def rate(self, start: float, end: float) -> float:
        return sum(n for t, n in self.chunks if start < t <= end) / max(end - start, 1e-9)

    def longest_gap(self, start: float, end: float) -> float:
        times = [start] + [t for t, _ in self.chunks if start < t <= end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))


def ask(daemon, png: bytes) -> tuple[float, float]:
    """(latency s, encode ms) of one screenshot question."""
    from sidecar.api import pb

    with daemon.client(timeout_s=900) as client:
        t0 = time.perf_counter()
        final = list(client.ask_image_stream(pb.AskImageRequest(
            image=pb.Image(encoded=png), question="What is on the screen?", max_tokens=16,
            sampling=pb.SamplingParams(temperature=0.0))))[-1].final
        return time.perf_counter() - t0, final.image.encode_ms


def stream_alone(daemon, seconds: float, tag: str) -> float:
    stream = ChainedStream(daemon, tag)
    stream.start()
    while not stream.chunks:
        time.sleep(0.02)
    start = time.perf_counter() + 0.5
    time.sleep(seconds + 0.5)
    stream.stop.set()
    stream.join()
    return stream.rate(start, start + seconds)


def both(daemon, png: bytes, tag: str) -> dict:
    stream = ChainedStream(daemon, tag)
    stream.start()
    while len(stream.chunks) < 5:
        time.sleep(0.02)
    asked = time.perf_counter()
    latency, encode_ms = ask(daemon, png)
    stream.stop.set()
    stream.join()
    end = asked + encode_ms / 1000.0  # the encode starts within ms of the call: the worker is up
    return {"latency_s": latency, "encode_ms": encode_ms, "stream_tps": stream.rate(asked, end),
            "longest_gap_s": stream.longest_gap(asked, end)}


def options(group) -> None:
    group.add_argument("--layers", type=int, default=None, help="encoder blocks (default 27; 4 with --quick)")
    group.add_argument("--window", type=float, default=None,
                       help="seconds of the stream-alone measurement (default 20; 5 with --quick)")


def scenario(args: argparse.Namespace) -> dict:
    from bench.vision_benchmark import RESOLUTIONS, ensure_projector, screenshot_png
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    layers = args.layers or (4 if args.quick else 27)
    window = args.window or (5.0 if args.quick else 20.0)
    projector = ensure_projector(layers)
    png = screenshot_png(*RESOLUTIONS["1440p"])
    daemon = start_daemon("--mmproj", str(projector), "--no-websocket", "--no-http")
    rows = []
    try:
        ask(daemon, screenshot_png(640, 360))  # warm-up: first touch of the encoder's pages
        for r in range(args.repeats):
            load = os.getloadavg()[0]
            alone_tps = stream_alone(daemon, window, f"round {r} alone")
            alone_latency, alone_encode = ask(daemon, png)
            mixed = both(daemon, png, f"round {r} both")
            row = {"round": r, "load": load, "stream_alone_tps": alone_tps, "image_alone_s": alone_latency,
                   "image_alone_encode_ms": alone_encode, **{f"both_{k}": v for k, v in mixed.items()}}
            rows.append(row)
            print(f"round {r} (load {load:.2f}): stream alone {alone_tps:.1f} tok/s; image alone {alone_latency:.1f} s "
                  f"(encode {alone_encode / 1000:.1f} s); both: stream {mixed['stream_tps']:.1f} tok/s "
                  f"({mixed['stream_tps'] / alone_tps:.0%}), longest gap {mixed['longest_gap_s'] * 1000:.0f} ms, "
                  f"image {mixed['latency_s']:.1f} s ({mixed['latency_s'] / alone_latency:.2f}x, encode "
                  f"{mixed['encode_ms'] / 1000:.1f} s)", flush=True)
    finally:
        stop_daemon(daemon)
    med = lambda key: statistics.median(row[key] for row in rows)
    share = med("both_stream_tps") / med("stream_alone_tps")
    latency = med("both_latency_s") / med("image_alone_s")
    gap = max(row["both_longest_gap_s"] for row in rows)
    print(f"\nmedians over {len(rows)} rounds: longest gap {gap * 1000:.0f} ms (target <= 1000); stream during the "
          f"encode {share:.0%} of alone (target >= 40%); image latency {latency:.2f}x alone (target <= 1.5x); "
          f"load now {os.getloadavg()[0]:.2f}")
    return {"rounds": rows, "share": share, "latency_ratio": latency, "gap_s": gap}
