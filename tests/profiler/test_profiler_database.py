"""Profile database: round trip, schema version checks, atomic writes, lookups, size."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import replace

import pytest

from sidecar.profiler.database import (
    SCHEMA_VERSION,
    BandwidthEntry,
    KernelEntry,
    ProfileDB,
    ProfileFormatError,
    SchemaVersionError,
    encode_profile,
    load_profile,
    save_profile,
)
from sidecar.native.ggml_devices import GgmlDevice
from sidecar.profiler.hardware import GpuInfo, HardwareInfo
from sidecar.profiler.plan import FULL_PLAN, LARGE, MOE, SMALL

GIB = 1 << 30


def make_db(threads=(1, 2), types=("F16", "Q4_0"), fingerprint="0123456789abcdef") -> ProfileDB:
    entries = []
    for shape in (SMALL, LARGE):
        for op in ("attn_qkvo", "ffn"):
            rows, cols = shape.op_rows_cols(op)
            for wtype in types:
                for t in threads:
                    for b in (1, 4, 16, 64, 512):
                        seconds = 1e-4 * b / t + 1.234567e-5
                        entries.append(
                            KernelEntry(op, shape.name, wtype, rows, cols, b, t, "cpu", "idle",
                                        seconds, 1.5e-6, shape.op_params(op), shape.flops(op, b), 8)
                        )
    hardware = HardwareInfo(
        cpu_model="AMD EPYC", physical_cores=2, logical_cores=2, ram_total=24 * GIB,
        ram_free=20 * GIB, l3_cache_bytes=32 << 20,
        gpus=(GpuInfo(0, "NVIDIA GeForce RTX 4070", 12 * GIB, 9 * GIB, 3 * GIB, None, 4, 16, 4, 16, "580.12"),),
        ggml_devices=(GgmlDevice(0, "CPU", "AMD EPYC", "cpu", 24 * GIB, 20 * GIB),),
        gpu_note="",
    )
    return ProfileDB(
        schema_version=SCHEMA_VERSION, fingerprint=fingerprint, mode="full",
        created_at="2026-11-29T10:00:00+00:00", duration_s=97.25, contention=0.0, llama_cpp_version="0.3.36",
        system_info="CPU : AVX2 = 1", hardware=hardware, shapes=(SMALL, LARGE, MOE),
        entries=tuple(entries),
        bandwidths=(BandwidthEntry("dram_read", "cpu", "llama_decode", "", "idle", 2, 1 << 26, 41.5),
                    BandwidthEntry("memcpy", "cpu", "numpy", "", "idle", 1, 1 << 28, 30.25)),
        notes=("no GPU: test",),
    )


def assert_same(a: ProfileDB, b: ProfileDB) -> None:
    # Floats are stored to 5 significant digits.
    assert b.hardware == a.hardware and b.shapes == a.shapes and b.notes == a.notes
    assert (b.fingerprint, b.mode, b.schema_version) == (a.fingerprint, a.mode, a.schema_version)
    assert len(b.entries) == len(a.entries)
    for x, y in zip(a.entries, b.entries):
        assert (x.op, x.shape, x.weight_type, x.batch, x.threads) == (y.op, y.shape, y.weight_type, y.batch, y.threads)
        assert y.seconds == pytest.approx(x.seconds, rel=1e-4)
    assert b.bandwidths == a.bandwidths


@pytest.mark.parametrize("name", ["profile.json", "profile.json.gz"])
def test_round_trip(tmp_path, name):
    db = make_db()
    path = save_profile(db, tmp_path / "nested" / name)
    assert_same(db, load_profile(path))
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_loaded_profile_is_frozen(tmp_path):
    db = load_profile(save_profile(make_db(), tmp_path / "p.json"))
    with pytest.raises(AttributeError):
        db.mode = "quick"  # type: ignore[misc]
    assert isinstance(db.entries, tuple) and isinstance(db.hardware.gpus, tuple)


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 0, None, "1"])
def test_other_schema_version_raises_typed_error(tmp_path, version):
    data = json.loads(encode_profile(make_db()))
    data["schema_version"] = version
    if version is None:
        del data["schema_version"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaVersionError) as info:
        load_profile(path)
    assert info.value.found == version and info.value.expected == SCHEMA_VERSION


@pytest.mark.parametrize(
    "content", [b"", b"{not json", b"[]", b'{"schema_version": %d}' % SCHEMA_VERSION, gzip.compress(b"{")[:10]]
)
def test_unreadable_file_raises_format_error(tmp_path, content):
    path = tmp_path / "p.json"
    path.write_bytes(content)
    with pytest.raises(ProfileFormatError):
        load_profile(path)


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_profile(tmp_path / "absent.json")


def test_crash_during_write_keeps_previous_profile(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    old = make_db(fingerprint="aaaaaaaaaaaaaaaa")
    save_profile(old, path)
    before = path.read_bytes()

    def crash(*_args):
        raise KeyboardInterrupt("killed half-way")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_profile(make_db(fingerprint="bbbbbbbbbbbbbbbb"), path)
    assert path.read_bytes() == before
    assert load_profile(path).fingerprint == "aaaaaaaaaaaaaaaa"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temp file left behind


def test_crash_while_writing_bytes_keeps_previous_profile(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    save_profile(make_db(fingerprint="aaaaaaaaaaaaaaaa"), path)

    def crash(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        save_profile(make_db(fingerprint="bbbbbbbbbbbbbbbb"), path)
    assert load_profile(path).fingerprint == "aaaaaaaaaaaaaaaa"
    assert len(list(tmp_path.iterdir())) == 1


def test_lookup_picks_nearest_batch_then_threads():
    db = make_db()
    exact = db.kernel("ffn", "Q4_0", batch=16, threads=2, shape="small")
    assert (exact.batch, exact.threads, exact.shape) == (16, 2, "small")
    near = db.kernel("ffn", "Q4_0", batch=24, threads=2, shape="small")
    assert near.batch == 16  # log distance: 24 is nearer 16 than 64
    assert db.kernel("ffn", "Q4_0", batch=1000, threads=64, shape="small").batch == 512
    assert db.kernel("ffn", "Q4_0", batch=1000, threads=64, shape="small").threads == 2
    assert db.kernel("ffn", "Q6_K", batch=1, threads=1) is None
    assert db.kernel("ffn", "Q4_0", batch=1, threads=1, device="cuda0") is None
    e = db.kernel("attn_qkvo", "F16", 512, 1, shape="large")
    assert e.gflops == pytest.approx(e.flops / e.seconds / 1e9)
    assert e.weight_gbps == pytest.approx(e.weight_bytes / e.seconds / 1e9)


def test_bandwidth_lookup():
    db = make_db()
    assert db.dram_read_gbps() == 41.5
    assert db.bandwidth("memcpy").gbps == 30.25
    assert db.bandwidth("h2d", device="cuda0") is None


def test_full_size_profile_stays_small():
    # A full profile of a 16-thread machine with one GPU: every shape and type of the full
    # plan at 5 thread counts on the CPU, 3 batch sizes on the GPU, overheads per shape.
    threads, batches, gpu_batches = (1, 2, 4, 8, 16), (1, 4, 16, 64, 512), (1, 64, 512)
    entries = []
    for family in FULL_PLAN.families:
        shape = family.shape
        for op in family.ops:
            rows, cols = shape.op_rows_cols(op)
            for wtype in family.weight_types:
                points = [("cpu", b, t) for b in batches for t in threads]
                points += [("cuda0", b, 16) for b in gpu_batches]
                for device, b, t in points:
                    entries.append(KernelEntry(op, shape.name, wtype, rows, cols, b, t, device, "idle",
                                               1.234567e-4 * b, 2.345678e-5, 123456789, 9.87654e11, 48))
        for op in ("layer_overhead", "graph_overhead"):
            for device, b, t in [("cpu", b, t) for b in batches for t in threads]:
                entries.append(KernelEntry(op, shape.name, "", 0, 0, b, t, device, "idle",
                                           1.234567e-5, 0.0, 0, 0.0, 48))
    db = replace(make_db(), entries=tuple(entries))
    assert len(entries) > 1400
    assert len(encode_profile(db)) < 200_000


def test_deferred_thread_counts_round_trip_and_are_optional(tmp_path) -> None:
    import json
    from dataclasses import replace

    from sidecar.profiler.database import load_profile, save_profile
    from sidecar.profiler.quality import profile_disturbed

    db = replace(make_db(), deferred_threads=(2,))
    loaded = load_profile(save_profile(db, tmp_path / "p.json"))
    assert loaded.deferred_threads == (2,) and profile_disturbed(loaded)
    # A file written before the field existed reads as nothing deferred.
    data = json.loads((tmp_path / "p.json").read_text())
    del data["deferred_threads"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_profile(tmp_path / "old.json").deferred_threads == ()
