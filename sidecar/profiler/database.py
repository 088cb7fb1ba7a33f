"""The profile database: frozen records, JSON (optionally gzip) on disk, atomic replace.

Records are pure data with no I/O; the planner reads them. On disk, kernel entries are stored
column-wise (one list of column names, one list per entry) to keep a full profile small.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sidecar.native.ggml_devices import GgmlDevice
from sidecar.profiler.hardware import GpuInfo, HardwareInfo
from sidecar.profiler.plan import ProbeShape

# Bump when a field changes meaning or disappears; readers refuse other versions.
# 2: kernel seconds are the fastest of repeated trials (was the median), with `spread` and the
# step's `load` per entry; a version-1 profile is measured again.
SCHEMA_VERSION = 2


class ProfileError(Exception):
    """A profile file cannot be used."""


class SchemaVersionError(ProfileError):
    """The file was written with another schema version; profile again."""

    def __init__(self, found: Any, expected: int = SCHEMA_VERSION) -> None:
        super().__init__(f"profile schema version {found!r}, this build reads {expected}")
        self.found = found
        self.expected = expected


class ProfileFormatError(ProfileError):
    """The file is not a readable profile (truncated, not JSON, fields missing)."""


@dataclass(frozen=True)
class KernelEntry:
    """One measured figure: how long one layer's `op` takes for `batch` tokens.

    `seconds` is per layer, with the probe model's own overhead (embedding, output, graph
    launch, norms and the tiny stand-in sub-layers; `overhead_seconds` per layer) already
    subtracted. For `attn_qkvo` it covers the Q/K/V/O products plus attention over a KV
    cache that holds exactly `batch` tokens (causal); for `ffn` gate, up and down; for
    `moe_experts` router and routed experts. `weight_bytes` is what the op's weights occupy
    (for MoE, the experts the batch is expected to touch), `flops` its matrix products.
    `condition` is "idle", or "h2d_busy" when measured while host-to-device copies ran.
    `seconds` is the fastest of repeated trials (other load only ever slows a kernel down);
    `spread` says how far the median trial was above it, `load` how busy other processes kept
    the CPUs meanwhile (see sidecar.profiler.quality).

    Two ops are not matrix products: `layer_overhead` (per layer: norms, RoPE, residuals,
    launch and thread sync of a layer's ops) and `graph_overhead` (per forward pass:
    embedding lookup, output norm, graph build). Their weight_type is "" (the median over
    the types measured) and their bytes and FLOPs are 0.
    """

    op: str
    shape: str
    weight_type: str
    rows: int
    cols: int
    batch: int
    threads: int
    device: str
    condition: str
    seconds: float
    overhead_seconds: float
    weight_bytes: int
    flops: float
    depth: int
    # (median - fastest) / fastest of the trials behind `seconds`: how noisy the point was.
    spread: float = 0.0
    # Share of all CPUs other processes kept busy while the step that measured it ran.
    load: float = 0.0

    @property
    def gflops(self) -> float:
        """Matrix-product throughput, GFLOP/s."""
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def weight_gbps(self) -> float:
        """Weights streamed per second, GB/s: the figure that bounds decode."""
        return self.weight_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class BandwidthEntry:
    """One bandwidth figure.

    kind: "dram_read" (weights streamed by a llama.cpp kernel), "memcpy" (numpy copy,
    read+write bytes counted), "h2d" (host to device). memory: "pageable", "pinned" or "".
    condition: "idle", or "cpu_busy" when a CPU kernel ran meanwhile.
    """

    kind: str
    device: str
    method: str
    memory: str
    condition: str
    threads: int
    bytes: int
    gbps: float


@dataclass(frozen=True)
class ProfileDB:
    """Everything measured on one machine for one llama.cpp build."""

    schema_version: int
    fingerprint: str
    mode: str
    created_at: str
    duration_s: float
    # Share of the CPUs other processes kept busy while profiling (0 = idle machine).
    contention: float
    llama_cpp_version: str
    system_info: str
    hardware: HardwareInfo
    shapes: tuple[ProbeShape, ...]
    entries: tuple[KernelEntry, ...]
    bandwidths: tuple[BandwidthEntry, ...]
    notes: tuple[str, ...]
    # CPU thread counts some steps did not measure because other processes' steady load held
    # the cores they need (the background profile on a busy PC): the planner estimates those
    # figures from fewer threads, and the profile is measured again when the machine is quiet.
    # Optional on disk (absent = none), so it needs no schema version of its own.
    deferred_threads: tuple[int, ...] = ()

    def shape(self, name: str) -> ProbeShape | None:
        """The probe shape called `name`, if this profile measured it."""
        return next((s for s in self.shapes if s.name == name), None)

    def kernel(
        self,
        op: str,
        weight_type: str,
        batch: int,
        threads: int,
        device: str = "cpu",
        shape: str | None = None,
        condition: str = "idle",
    ) -> KernelEntry | None:
        """The measured entry nearest to the request, or None when nothing matches.

        op, weight_type, device and condition must match exactly (and shape, when given);
        among the rest the nearest batch wins, then the nearest thread count, both by ratio
        (log distance) because throughput changes with the order of magnitude. No
        interpolation: the planner does that over these entries.
        """
        candidates = [
            e
            for e in self.entries
            if e.op == op
            and e.weight_type == weight_type
            and e.device == device
            and e.condition == condition
            and (shape is None or e.shape == shape)
        ]
        if not candidates:
            return None

        def distance(e: KernelEntry) -> tuple[float, float]:
            return (
                abs(math.log2(max(e.batch, 1) / max(batch, 1))),
                abs(math.log2(max(e.threads, 1) / max(threads, 1))),
            )

        return min(candidates, key=distance)

    def bandwidth(
        self, kind: str, device: str = "cpu", memory: str | None = None, condition: str = "idle"
    ) -> BandwidthEntry | None:
        """The highest figure of that kind (over thread counts and methods), or None."""
        matches = [
            b
            for b in self.bandwidths
            if b.kind == kind
            and b.device == device
            and b.condition == condition
            and (memory is None or b.memory == memory)
        ]
        return max(matches, key=lambda b: b.gbps, default=None)

    def dram_read_gbps(self) -> float | None:
        """DRAM read bandwidth for the roofline: llama.cpp's figure, else the memcpy one."""
        best = self.bandwidth("dram_read") or self.bandwidth("memcpy")
        return best.gbps if best else None


# ---------------------------------------------------------------- serialization


def _round(value: float) -> float:
    # Five significant digits: more than timing noise allows, and it halves the file.
    return float(f"{value:.5g}")


_ENTRY_COLUMNS = [f.name for f in fields(KernelEntry)]
_FLOAT_COLUMNS = {"seconds", "overhead_seconds", "flops", "spread", "load"}


def profile_to_dict(db: ProfileDB) -> dict[str, Any]:
    """The JSON-ready form of a profile."""
    return {
        "schema_version": db.schema_version,
        "fingerprint": db.fingerprint,
        "mode": db.mode,
        "created_at": db.created_at,
        "duration_s": round(db.duration_s, 2),
        "contention": round(db.contention, 3),
        "llama_cpp_version": db.llama_cpp_version,
        "system_info": db.system_info,
        "hardware": asdict(db.hardware),
        "shapes": [asdict(s) for s in db.shapes],
        "entries": {
            "columns": _ENTRY_COLUMNS,
            "rows": [
                [_round(v) if c in _FLOAT_COLUMNS else v for c, v in zip(_ENTRY_COLUMNS, astuple_entry(e))]
                for e in db.entries
            ],
        },
        "bandwidths": [{**asdict(b), "gbps": _round(b.gbps)} for b in db.bandwidths],
        "notes": list(db.notes),
        "deferred_threads": list(db.deferred_threads),
    }


def astuple_entry(entry: KernelEntry) -> tuple[Any, ...]:
    """The entry's field values in column order (shallow, unlike dataclasses.astuple)."""
    return tuple(getattr(entry, c) for c in _ENTRY_COLUMNS)


def _hardware_from_dict(data: dict[str, Any]) -> HardwareInfo:
    return HardwareInfo(
        **{
            **data,
            "gpus": tuple(GpuInfo(**g) for g in data["gpus"]),
            "ggml_devices": tuple(GgmlDevice(**d) for d in data["ggml_devices"]),
        }
    )


def profile_from_dict(data: dict[str, Any]) -> ProfileDB:
    """Rebuild a profile from its JSON form; checks the schema version first.

    Raises SchemaVersionError for another version, ProfileFormatError for anything malformed.
    """
    if not isinstance(data, dict):
        raise ProfileFormatError("profile is not a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(version)
    try:
        table = data["entries"]
        columns = table["columns"]
        if columns != _ENTRY_COLUMNS:
            raise ProfileFormatError(f"entry columns {columns} differ from {_ENTRY_COLUMNS}")
        return ProfileDB(
            schema_version=version,
            fingerprint=data["fingerprint"],
            mode=data["mode"],
            created_at=data["created_at"],
            duration_s=float(data["duration_s"]),
            contention=float(data["contention"]),
            llama_cpp_version=data["llama_cpp_version"],
            system_info=data["system_info"],
            hardware=_hardware_from_dict(data["hardware"]),
            shapes=tuple(ProbeShape(**s) for s in data["shapes"]),
            entries=tuple(KernelEntry(*row) for row in table["rows"]),
            bandwidths=tuple(BandwidthEntry(**b) for b in data["bandwidths"]),
            notes=tuple(data["notes"]),
            deferred_threads=tuple(int(t) for t in data.get("deferred_threads", ())),
        )
    except ProfileFormatError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileFormatError(f"malformed profile: {exc!r}") from exc


def encode_profile(db: ProfileDB, compress: bool = False) -> bytes:
    """The bytes `save_profile` writes: compact JSON, gzip-compressed when asked."""
    blob = json.dumps(profile_to_dict(db), separators=(",", ":")).encode()
    # mtime=0 keeps identical profiles byte-identical.
    return gzip.compress(blob, mtime=0) if compress else blob


def save_profile(db: ProfileDB, path: Path | str) -> Path:
    """Write the profile to `path` atomically (gzip when the name ends in .gz).

    The bytes go to a temporary file in the same directory, are flushed to disk, and replace
    the target in one rename: a crash at any point leaves either the old file or the new
    one, never a torn one. Creates parent directories.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = encode_profile(db, compress=path.suffix == ".gz")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(blob)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return path


def load_profile(path: Path | str) -> ProfileDB:
    """Read a profile written by `save_profile` (plain or gzip JSON).

    Raises FileNotFoundError when absent, SchemaVersionError for another schema version,
    ProfileFormatError when unreadable.
    """
    raw = Path(path).read_bytes()
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, ValueError) as exc:
        raise ProfileFormatError(f"{path}: not a profile ({exc})") from exc
    return profile_from_dict(data)
