"""A real profile on a tiny shape, through llama.cpp, plus the CLI and ensure_profile.

Timing ratios are not asserted beyond what noise cannot break: the shared test machine may
be busy.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sidecar.profiler import probe_models
from sidecar.cli import main
from sidecar.profiler.database import SCHEMA_VERSION, load_profile
from sidecar.profiler.kernels import ProbeSession, RepeatPolicy, median_seconds
from sidecar.profiler.plan import (
    OP_ATTENTION,
    OP_FFN,
    OP_GRAPH_OVERHEAD,
    OP_LAYER_OVERHEAD,
    TINY,
    ProbeFamily,
    tiny_plan,
)
from sidecar.profiler.runner import run_profile


@pytest.fixture(scope="module")
def probe_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("probes")


@pytest.fixture(scope="module")
def tiny_profile(probe_cache):
    return run_profile(tiny_plan(threads=(1, 2)), cache_dir=probe_cache)


def test_tiny_profile_entries_are_positive_and_complete(tiny_profile):
    db = tiny_profile
    assert db.mode == "quick" and len(db.fingerprint) == 16
    kernels = [e for e in db.entries if e.op in (OP_ATTENTION, OP_FFN)]
    # 2 ops x 2 types x 3 batches x 2 thread counts
    assert len(kernels) == 24
    for e in kernels:
        assert e.device == "cpu" and e.condition == "idle"
        assert math.isfinite(e.seconds) and e.seconds > 0
        assert e.weight_bytes > 0 and e.flops > 0 and e.gflops > 0
        assert e.depth >= 1
    overheads = [e for e in db.entries if e.op in (OP_LAYER_OVERHEAD, OP_GRAPH_OVERHEAD)]
    assert overheads and all(e.seconds >= 0 for e in overheads)


def test_small_batches_ran_on_deep_probes(tiny_profile):
    for e in tiny_profile.entries:
        if e.op in (OP_ATTENTION, OP_FFN):
            assert (e.depth > 1) == (e.batch <= 16), e


def test_bigger_batches_take_longer(tiny_profile):
    # 64 tokens do 64x the work of one; faster than a single token would be nonsense.
    # (Throughput is not compared: a cache-resident tiny probe at batch 1 is overhead-bound
    # and noisy.)
    db = tiny_profile
    for op in (OP_ATTENTION, OP_FFN):
        for wtype in ("F16", "Q4_0"):
            for threads in (1, 2):
                one = db.kernel(op, wtype, 1, threads, shape="tiny")
                many = db.kernel(op, wtype, 64, threads, shape="tiny")
                assert (one.batch, many.batch) == (1, 64)
                assert many.seconds > one.seconds, (op, wtype, threads)


def test_every_thread_count_is_measured(tiny_profile):
    threads = {e.threads for e in tiny_profile.entries}
    assert threads == {1, 2}


def test_bandwidths_and_no_gpu_note(tiny_profile):
    db = tiny_profile
    assert db.bandwidth("memcpy").gbps > 0
    dram = db.bandwidth("dram_read")
    assert dram is not None and dram.gbps > 0 and "F16" in dram.method
    if not db.hardware.ggml_gpus:
        assert any(n.startswith("no GPU") for n in db.notes)
        assert all(e.device == "cpu" for e in db.entries)


def test_probe_files_are_cached_and_deterministic(probe_cache, tmp_path):
    cached = sorted(p.name for p in probe_cache.iterdir())
    assert any("-ffn-Q4_0-" in n for n in cached) and any("-skeleton-F16-" in n for n in cached)
    again = probe_models.one_layer_probe(TINY, OP_FFN, "Q4_0", tmp_path, 2)
    assert again.read_bytes() == (probe_cache / again.name).read_bytes()


def test_deep_probe_repeats_the_layer(probe_cache, tmp_path):
    import gguf

    one = probe_models.one_layer_probe(TINY, OP_FFN, "Q4_0", probe_cache, 2)
    deep = probe_models.deep_probe(one, TINY, OP_FFN, 3, tmp_path / "deep.gguf")
    reader = gguf.GGUFReader(str(deep))
    names = {t.name for t in reader.tensors}
    assert {f"blk.{i}.ffn_up.weight" for i in range(3)} <= names
    up = {t.name: bytes(t.data) for t in reader.tensors if t.name.endswith("ffn_up.weight")}
    assert len(set(up.values())) == 1
    with ProbeSession(deep, 16) as session:
        session.set_threads(1)
        assert median_seconds(session, 16, RepeatPolicy(0.01, 2, 3)) > 0
        with pytest.raises(ValueError):
            session.decode_seconds(17)


def test_copy_and_overlap_code_paths_on_the_cpu_device(probe_cache):
    # No GPU here: the CPU device stands in, so the ctypes plumbing is still exercised.
    from sidecar.profiler.busy import measure_overlap
    from sidecar.native.ggml_devices import list_ggml_devices
    from sidecar.profiler.transfers import CopyLoop, measure_h2d

    cpu = next(d for d in list_ggml_devices() if d.kind == "cpu")
    assert measure_h2d(cpu.index, 4 << 20, pinned=False).gbps > 0
    with pytest.raises(NotImplementedError):
        measure_h2d(cpu.index, 1 << 20, pinned=True)
    path = probe_models.one_layer_probe(TINY, OP_FFN, "Q4_0", probe_cache, 2)
    with ProbeSession(path, 16) as session, CopyLoop(cpu.index, 4 << 20, False) as copy:
        session.set_threads(1)
        figures = measure_overlap(session, (1, 16), copy, RepeatPolicy(0.01, 2, 3), copy_repeats=3)
    assert figures.copy_idle_s > 0 and figures.copy_busy_s > 0
    assert set(figures.cpu_busy_s) == {1, 16} and min(figures.cpu_busy_s.values()) > 0


def test_cli_profile_then_show(tmp_path, monkeypatch, probe_cache, capsys):
    import sidecar.profiler.plan as plan_module

    monkeypatch.setattr(plan_module, "QUICK_PLAN", tiny_plan(threads=(1,)))
    monkeypatch.setattr("sidecar.profiler.probe_models.probe_cache_dir", lambda: probe_cache)
    monkeypatch.setattr("sidecar.profiler.steps.probe_cache_dir", lambda: probe_cache)
    out = tmp_path / "profile.json"
    assert main(["profile", "--quick", "--out", str(out)]) == 0
    assert "wrote quick profile" in capsys.readouterr().out
    db = load_profile(out)
    assert out.stat().st_size < 200_000
    # Up to date: a second run measures nothing unless forced.
    assert main(["profile", "--quick", "--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().err
    assert load_profile(out).created_at == db.created_at
    assert main(["profile", "--show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "Kernels" in shown and "ffn" in shown and db.fingerprint in shown
    assert main(["profile", "--show", str(tmp_path / "absent.json")]) == 1


def test_ensure_profile_creates_once_then_loads(tmp_path, monkeypatch, probe_cache):
    import sidecar.profiler.store as store

    monkeypatch.setattr(store, "QUICK_PLAN", tiny_plan(threads=(1,)))
    monkeypatch.setattr(store, "profiles_dir", lambda: tmp_path / "profiles")
    monkeypatch.setattr("sidecar.profiler.steps.probe_cache_dir", lambda: probe_cache)
    lines = []

    class Log:
        def info(self, event, **kw):
            lines.append(event)

        warning = info

    db, created = store.ensure_profile(log=Log())
    assert created and "profile_missing" in lines and "profile_saved" in lines
    path = store.default_profile_path()
    assert path.parent == tmp_path / "profiles" and path.name == store.profile_file_name(db.fingerprint)
    again, created_again = store.ensure_profile(log=Log())
    assert not created_again and again.created_at == db.created_at
    # A profile from another schema version is replaced, not trusted.
    path.write_text(path.read_text().replace(f'"schema_version":{SCHEMA_VERSION}', '"schema_version":99'))
    _, recreated = store.ensure_profile(log=Log())
    assert recreated and "profile_unusable" in lines


def test_plan_threads_follow_the_machine():
    from sidecar.profiler.plan import thread_counts

    assert thread_counts(2, 2, quick=False) == (1, 2)
    assert thread_counts(16, 8, quick=False) == (1, 2, 4, 8, 16)
    assert thread_counts(16, 8, quick=True) == (1, 8, 16)
    assert thread_counts(1, None, quick=True) == (1,)
    assert replace(tiny_plan(), threads=(3,)).threads == (3,)


def test_gpu_branch_runs_or_fails_softly_on_a_stand_in_device(probe_cache):
    # No GPU here: a fake "CUDA0" entry pointing at the CPU's registry slot drives the GPU
    # orchestration (placement, copies, overlap). llama.cpp either runs the probes anyway or
    # refuses the placement; either way the profile must finish with its CPU figures.
    from sidecar.native.ggml_devices import GgmlDevice, list_ggml_devices
    from sidecar.profiler.hardware import discover_hardware

    cpu = next(d for d in list_ggml_devices() if d.kind == "cpu")
    stand_in = GgmlDevice(cpu.index, "CUDA0", "stand-in", "gpu", cpu.memory_total, cpu.memory_free)
    hardware = discover_hardware(ggml_probe=lambda: (stand_in, cpu))
    plan = tiny_plan(
        threads=(1,), measure_busy=True, gpu_batches=(1, 64),
        families=(ProbeFamily(TINY, (OP_FFN,), ("Q4_0",)),),
    )
    db = run_profile(plan, hardware=hardware, cache_dir=probe_cache)
    assert any(e.device == "cpu" and e.op == OP_FFN for e in db.entries)
    gpu_entries = [e for e in db.entries if e.device == "cuda0"]
    gpu_notes = [n for n in db.notes if n.startswith("cuda0") or "CUDA0" in n or "overlap" in n]
    assert gpu_entries or gpu_notes
    if gpu_entries:
        assert {e.batch for e in gpu_entries if e.op == OP_FFN} == {1, 64}
    h2d = [b for b in db.bandwidths if b.kind == "h2d"]
    assert all(b.gbps > 0 for b in h2d)


class ScriptedSession:
    """Stands in for ProbeSession: decode times come from a function of (batch, threads, call)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.threads = 1
        self.calls = 0

    def set_threads(self, threads):
        self.threads = threads

    def decode_seconds(self, batch):
        self.calls += 1
        return self.seconds(batch, self.threads, self.calls)


def test_contended_points_are_measured_again():
    from sidecar.profiler.kernels import _recheck_contended

    # Two threads first looked 50x slower (a neighbour held a core); later runs are normal.
    session = ScriptedSession(lambda b, t, n: 0.001 * b / t)
    results = {(1, 1): 0.001, (16, 1): 0.016, (1, 2): 0.05, (16, 2): 0.008}
    rechecked = _recheck_contended(session, results, (1, 16), (1, 2), RepeatPolicy(0.01, 2, 3))
    assert rechecked == 1
    assert results[(1, 2)] == pytest.approx(0.0005)
    assert results[(16, 2)] == 0.008  # plausible points are left alone


def test_really_slower_threads_are_kept_after_retries():
    from sidecar.profiler.kernels import CONTENTION_RETRIES, _recheck_contended

    session = ScriptedSession(lambda b, t, n: 0.01 * t)  # genuinely worse with more threads
    results = {(1, 1): 0.01, (1, 2): 0.03}
    _recheck_contended(session, results, (1,), (1, 2), RepeatPolicy(0.001, 1, 1))
    assert results[(1, 2)] == pytest.approx(0.02)
    # Bounded work: warm-up plus a few runs per retry, never an endless loop.
    assert session.calls <= CONTENTION_RETRIES * 4


def test_f16_sources_are_not_kept_for_families_without_f16(tmp_path):
    plan = tiny_plan(threads=(1,), batches=(1,), families=(ProbeFamily(TINY, (OP_FFN,), ("Q4_0",)),))
    run_profile(plan, cache_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any("-ffn-Q4_0-" in n for n in names)
    assert not any("-F16-" in n for n in names)
