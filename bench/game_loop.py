"""A stand-in for a game's main loop (bench scenario `game`, issue 26): a fixed frame rate, a fixed
amount of real CPU work per frame on one or more threads, sleeping until the next frame's deadline.
It records every frame and, with --report, tells the daemon how its frames go once a second, the
way the Unity and Godot clients do (ReportFrames).

    python -m bench.game_loop --calibrate                      units of work per millisecond, quiet
    python -m bench.game_loop --units N --seconds 60 --out F   run; F gets every frame's times

The work is a fixed count of SHA-256 rounds over 64 KiB (hashlib releases the GIL for inputs that
large, so two threads run in parallel): a fixed amount of work, not a fixed time, so a core taken
by someone else shows as a longer frame, as it would in a game. Without --start-file the loop
starts at once; with it, it waits (idle) until that file exists, so the bench can start a daemon
that watches this process before the frames begin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from bench.common import percentile

BLOCK = os.urandom(64 * 1024)


def work(units: int) -> None:
    h = hashlib.sha256()
    for _ in range(units):
        h.update(BLOCK)


def calibrate(target_ms: float = 50.0) -> float:
    """Units per millisecond on this machine, the fastest of several tries (a quiet machine's)."""
    best = 0.0
    for _ in range(12):
        t0 = time.perf_counter()
        work(64)
        elapsed = (time.perf_counter() - t0) * 1000
        best = max(best, 64 / elapsed)
        time.sleep(0.01)
    units = max(1, int(best * target_ms))
    for _ in range(5):
        t0 = time.perf_counter()
        work(units)
        best = max(best, units / ((time.perf_counter() - t0) * 1000))
    return best


class Workers:
    """`threads` threads that each do `units` of work when a frame starts; the frame's work is done
    when the last of them is (a main thread and, in the two-thread variant, a render thread)."""

    def __init__(self, threads: int, units: int) -> None:
        self.units = units
        self._go = [threading.Event() for _ in range(threads)]
        self._done = [threading.Event() for _ in range(threads)]
        self._stop = False
        for i in range(1, threads):
            threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"game-worker-{i}").start()

    def _serve(self, i: int) -> None:
        while True:
            self._go[i].wait()
            self._go[i].clear()
            if self._stop:
                return
            work(self.units)
            self._done[i].set()

    def frame(self) -> None:
        for i in range(1, len(self._go)):
            self._go[i].set()
        work(self.units)
        for i in range(1, len(self._done)):
            self._done[i].wait()
            self._done[i].clear()

    def stop(self) -> None:
        self._stop = True
        for go in self._go[1:]:
            go.set()


class FrameReporter:
    """Once a second: the last second's frames, to the daemon's ReportFrames, on its own thread so
    a slow daemon never delays a frame. What the daemon answered is kept (the guard's levers)."""

    def __init__(self, address: str, token: str | None, budget_ms: float) -> None:
        self.budget_ms = budget_ms
        self.address, self.token = address, token
        self.pending: list[float] = []
        self.lock = threading.Lock()
        self.answers: list[dict] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="game-frame-report")
        self._thread.start()

    def add(self, frame_ms: float) -> None:
        with self.lock:
            self.pending.append(frame_ms)

    def _run(self) -> None:
        import grpc

        from sidecar.api import pb, rpc

        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else ()
        channel = grpc.insecure_channel(self.address)
        stub = rpc.SidecarStub(channel)
        last = time.perf_counter()
        while not self._stop.wait(1.0):
            with self.lock:
                frames, self.pending = self.pending, []
            now = time.perf_counter()
            window_ms, last = (now - last) * 1000, now
            if not frames:
                continue
            report = pb.FrameReport(
                frames=len(frames), window_ms=window_ms, frame_budget_ms=self.budget_ms,
                frame_ms_p50=percentile(frames, 50), frame_ms_p99=percentile(frames, 99), frame_ms_max=max(frames),
                frames_over_budget=sum(1 for f in frames if f > self.budget_ms))
            try:
                state = stub.ReportFrames(report, metadata=metadata, timeout=2)
                self.answers.append({"t": now, "threads": state.max_threads, "pass_tokens": state.max_pass_tokens,
                                     "pause_ms": state.pause_ms, "reason": state.reason})
            except grpc.RpcError:
                self.errors += 1
        channel.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3)


def run(fps: float, units: int, threads: int, seconds: float, reporter: FrameReporter | None) -> dict:
    budget_s = 1.0 / fps
    workers = Workers(threads, units)
    work_ms: list[float] = []
    late = 0
    next_start = time.perf_counter()
    end = next_start + seconds
    while next_start < end:
        now = time.perf_counter()
        if now < next_start:
            time.sleep(next_start - now)
        start = time.perf_counter()
        workers.frame()
        done = time.perf_counter()
        frame_ms = (done - start) * 1000
        work_ms.append(frame_ms)
        deadline = next_start + budget_s
        if done > deadline:
            late += 1
        if reporter is not None:
            reporter.add(frame_ms)
        # A late frame pushes the next one back, as a game's would (no catching up in a burst).
        next_start = max(deadline, done)
    workers.stop()
    return {"fps": fps, "threads": threads, "units": units, "frame_work_ms": work_ms, "late": late}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrate", action="store_true", help="print units of work per ms and exit")
    ap.add_argument("--fps", type=float, default=60.0)
    ap.add_argument("--units", type=int, default=0, help="units of work per frame per thread (from --calibrate)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--start-file", type=Path, help="wait until this file exists before the first frame")
    ap.add_argument("--report", metavar="HOST:PORT", help="report frames to the daemon there (ReportFrames)")
    args = ap.parse_args(argv)
    if args.calibrate:
        print(json.dumps({"units_per_ms": calibrate()}))
        return 0
    if args.units <= 0 or args.out is None:
        ap.error("--units and --out are needed (see --calibrate)")
    while args.start_file is not None and not args.start_file.exists():
        time.sleep(0.05)
    reporter = FrameReporter(args.report, os.environ.get("XLM_SIDECAR_TOKEN"), 1000.0 / args.fps) if args.report else None
    result = run(args.fps, args.units, args.threads, args.seconds, reporter)
    if reporter is not None:
        reporter.stop()
        result["guard_answers"], result["report_errors"] = reporter.answers, reporter.errors
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
