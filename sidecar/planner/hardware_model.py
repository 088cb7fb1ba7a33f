"""The machine the planner plans for: frozen figures, built from a profile or from a short spec.

A HardwareModel is the only hardware input of the cost model. From a profile it carries the
measured kernel times (per op, weight type, batch, threads) plus the roofline constants derived
from them; from a spec (a machine we do not own) only the constants, and the cost model falls
back to a plain roofline. Nothing here measures or reads files.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from sidecar.budget import parse_size
from sidecar.planner.disturbed import cap_disturbed, fill_deferred, quiet_ratios
from sidecar.profiler.database import KernelEntry, ProfileDB
from sidecar.profiler.hardware import GIB
from sidecar.profiler.plan import OP_ATTENTION, OP_FFN, OP_GRAPH_OVERHEAD, OP_LAYER_OVERHEAD, OP_MOE
from sidecar.profiler.quality import entry_disturbed

GB = 1e9
MIB = 1 << 20

# Where a measured figure (and a unit's compute) runs, in planner terms: a profile names each
# GPU by its label, the planner has one.
ON_CPU = "cpu"
ON_GPU = "gpu"
# Overhead kinds: per layer (norms, rope, residuals) and per pass (graph build, launch).
LAYER_OVERHEAD = "layer"
GRAPH_OVERHEAD = "graph"

# Per-lane PCIe payload bandwidth after line coding, GB/s, by generation.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# Host-to-device copies from pageable memory (llama.cpp mmaps weights, so op offload copies
# from pageable pages through a staging buffer) reach about this share of the link.
PCIE_PAGEABLE_EFFICIENCY = 0.6
# While CPU kernels saturate DRAM, pageable copies lose part of their bandwidth.
PCIE_BUSY_FACTOR = 0.8
# One core streams roughly this much DRAM bandwidth on current desktop and laptop CPUs.
DEFAULT_GBPS_PER_CORE = 12.0
# Quantized matmul throughput of one core at large batch with llama.cpp's repacked kernels
# (AVX2 / AVX-512 VNNI class: an 8-core laptop runs an 8B Q4 prompt at roughly 60-80 tokens/s).
DEFAULT_GFLOPS_PER_CORE = 100.0
# CPU kernels slow down while copies share the memory bus (when no profile measured it).
DEFAULT_BUSY_SLOWDOWN = 1.15
# A profile taken while other processes held more than this share of the CPUs gets a warning.
CONTENTION_WARNING = 0.1


@dataclass(frozen=True)
class KernelPoint:
    """One measured per-layer op time, in planner terms.

    op: OP_ATTENTION, OP_FFN or OP_MOE (the profiler's op names). device: ON_CPU or ON_GPU.
    weight_bytes / flops: what the probe's op read and computed at this batch.
    """

    op: str
    device: str
    shape: str
    weight_type: str
    batch: int
    threads: int
    busy: bool
    seconds: float
    weight_bytes: float
    flops: float
    # Measured while other processes held part of the cores (sidecar.profiler.quality).
    disturbed: bool = False


@dataclass(frozen=True)
class OverheadPoint:
    """Measured time that is not a weight's matrix product: per layer or per forward pass."""

    kind: str  # LAYER_OVERHEAD or GRAPH_OVERHEAD
    device: str
    batch: int
    threads: int
    seconds: float
    disturbed: bool = False


@dataclass(frozen=True)
class CpuSpec:
    """The CPU: cores, memory, and its roofline constants."""

    name: str
    physical_cores: int
    logical_cores: int
    ram_bytes: int
    dram_gbps: float
    gbps_per_core: float = DEFAULT_GBPS_PER_CORE
    gflops_per_core: float = DEFAULT_GFLOPS_PER_CORE
    # Factor on CPU kernel time while host-to-device copies run (the profile's "busy" figure).
    busy_slowdown: float = DEFAULT_BUSY_SLOWDOWN


@dataclass(frozen=True)
class GpuSpec:
    """The GPU the budget is granted on, and the link to it."""

    name: str
    vram_bytes: int
    mem_gbps: float
    tflops: float
    # Host-to-device bandwidth from pageable memory, CPU idle / CPU busy.
    pcie_gbps: float
    pcie_busy_gbps: float
    pcie_label: str = ""


@dataclass(frozen=True)
class HardwareModel:
    """Everything the cost model knows about one machine."""

    name: str
    source: str
    cpu: CpuSpec
    gpu: GpuSpec | None
    kernels: tuple[KernelPoint, ...] = ()
    overheads: tuple[OverheadPoint, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def has_gpu(self) -> bool:
        return self.gpu is not None and self.gpu.vram_bytes > 0

    @cached_property
    def kernel_series(self) -> dict[tuple[str, str, str, str, int, bool], tuple[KernelPoint, ...]]:
        """Points grouped by (op, device, shape, weight type, threads, busy), sorted by batch."""
        groups: dict[tuple, list[KernelPoint]] = defaultdict(list)
        for p in self.kernels:
            groups[(p.op, p.device, p.shape, p.weight_type, p.threads, p.busy)].append(p)
        return {k: tuple(sorted(v, key=lambda p: p.batch)) for k, v in groups.items()}

    @cached_property
    def overhead_series(self) -> dict[tuple[str, str, int], tuple[OverheadPoint, ...]]:
        """Overhead points grouped by (kind, device, threads), sorted by batch."""
        groups: dict[tuple, list[OverheadPoint]] = defaultdict(list)
        for p in self.overheads:
            groups[(p.kind, p.device, p.threads)].append(p)
        return {k: tuple(sorted(v, key=lambda p: p.batch)) for k, v in groups.items()}

    def describe(self) -> str:
        """One line: CPU, RAM, GPU and link."""
        c = self.cpu
        text = (f"{self.name}: {c.physical_cores} cores/{c.logical_cores} threads, "
                f"{c.ram_bytes / GIB:.0f} GiB RAM at {c.dram_gbps:.0f} GB/s")
        if self.gpu:
            g = self.gpu
            text += (f"; GPU {g.name} {g.vram_bytes / GIB:.0f} GiB, {g.mem_gbps:.0f} GB/s, "
                     f"{g.tflops:.0f} TFLOPS, PCIe {g.pcie_label or ''} {g.pcie_gbps:.1f} GB/s")
        else:
            text += "; no GPU"
        return text


# ------------------------------------------------------------------ from a profile


def clean_series(points: list[KernelPoint]) -> tuple[list[KernelPoint], int]:
    """Make one (op, shape, type, threads) series physically possible; returns (points, changed).

    A larger batch never takes less time than a smaller one, and never more than the smaller
    one's time scaled by the batch ratio (batching never makes a token dearer). Profiles on a
    busy machine break both now and then; each point is pulled into the band its predecessor
    allows.
    """
    out: list[KernelPoint] = []
    changed = 0
    for p in sorted(points, key=lambda p: p.batch):
        if out:
            prev = out[-1]
            low, high = prev.seconds, prev.seconds * p.batch / prev.batch
            fixed = min(max(p.seconds, low), high)
            if fixed != p.seconds:
                changed += 1
                p = replace(p, seconds=fixed)
        out.append(p)
    return out, changed


def _device(label: str) -> str:
    return ON_CPU if label == "cpu" else ON_GPU


def _kernel_points(entries: tuple[KernelEntry, ...], gpu_label: str | None,
                   logical_cores: int = 1, deferred_threads: tuple[int, ...] = ()) -> tuple[list[KernelPoint], int, int]:
    """(points, figures adjusted to be monotone in batch, disturbed figures capped or estimated)."""
    raw: list[KernelPoint] = []
    for e in entries:
        if e.op not in (OP_ATTENTION, OP_FFN, OP_MOE) or e.seconds <= 0:
            continue
        if e.device != "cpu" and e.device != gpu_label:
            continue
        raw.append(KernelPoint(e.op, _device(e.device), e.shape, e.weight_type, e.batch, e.threads,
                               e.condition != "idle", e.seconds, float(e.weight_bytes), e.flops,
                               entry_disturbed(e.load, e.threads, logical_cores)))
    series_key = ("op", "device", "shape", "weight_type", "batch", "busy")
    ratios = quiet_ratios(raw)
    capped_points, capped = cap_disturbed(raw, series_key, ratios)
    # Deferred thread counts are CPU thread counts: GPU series run on the most threads measured.
    cpu = [p for p in capped_points if p.device == ON_CPU]
    filled, estimated = fill_deferred(cpu, series_key, deferred_threads, ratios)
    capped_points = filled + [p for p in capped_points if p.device != ON_CPU]
    capped += estimated
    groups: dict[tuple, list[KernelPoint]] = defaultdict(list)
    for p in capped_points:
        groups[(p.op, p.device, p.shape, p.weight_type, p.threads, p.busy)].append(p)
    points: list[KernelPoint] = []
    changed = 0
    for series in groups.values():
        cleaned, n = clean_series(series)
        points += cleaned
        changed += n
    return points, changed, capped


def _overhead_points(entries: tuple[KernelEntry, ...], gpu_label: str | None,
                     logical_cores: int = 1, deferred_threads: tuple[int, ...] = ()) -> list[OverheadPoint]:
    # The skeleton's cost does not depend on the weight type, so the median over types is the
    # figure, robust to one noisy probe.
    samples: dict[tuple[str, str, int, int], list[float]] = defaultdict(list)
    disturbed: set[tuple[str, str, int, int]] = set()
    for e in entries:
        kind = {OP_LAYER_OVERHEAD: LAYER_OVERHEAD, OP_GRAPH_OVERHEAD: GRAPH_OVERHEAD}.get(e.op)
        if kind is None or e.condition != "idle" or (e.device != "cpu" and e.device != gpu_label):
            continue
        key = (kind, _device(e.device), e.batch, e.threads)
        samples[key].append(e.seconds)
        if entry_disturbed(e.load, e.threads, logical_cores):
            disturbed.add(key)
    points = [OverheadPoint(k, d, b, t, max(0.0, statistics.median(v)), (k, d, b, t) in disturbed)
              for (k, d, b, t), v in sorted(samples.items())]
    # Overheads are barriers and launches: more threads do not make them cheaper, but a disturbed
    # figure may not make them dearer than the fewer-thread one either.
    capped, _ = cap_disturbed(points, ("kind", "device", "batch"), scale_with_threads=False)
    cpu = [p for p in capped if p.device == ON_CPU]
    filled, _ = fill_deferred(cpu, ("kind", "device", "batch"), deferred_threads, scale_with_threads=False)
    capped = filled + [p for p in capped if p.device != ON_CPU]
    return sorted(capped, key=lambda p: (p.kind, p.device, p.batch, p.threads))


def hardware_from_profile(db: ProfileDB) -> HardwareModel:
    """The HardwareModel a stored profile describes (pure: the profile is data already read).

    Kernel series are cleaned (see `clean_series`) and overheads reduced to medians; GPU
    figures come from the profile's GPU entries and copy bandwidths when it has them, else
    the GPU is described from NVML's report with conservative defaults and a note says so.
    """
    hw = db.hardware
    notes: list[str] = [f"profile {db.fingerprint} ({db.mode}, {db.created_at})"]
    contention = getattr(db, "contention", None)  # absent from profiles older than the field
    if contention is not None and contention > CONTENTION_WARNING:
        notes.append(f"other processes used {contention:.0%} of the CPUs while profiling: figures, above all "
                     "multi-threaded ones, are pessimistic; profile again on a quiet machine")
    gpu_devices = hw.ggml_gpus
    gpu_label = gpu_devices[0].name.lower() if gpu_devices else None
    if len(gpu_devices) > 1:
        notes.append(f"{len(gpu_devices)} GPUs profiled; planning for the first, {gpu_devices[0].name}")
    deferred = tuple(getattr(db, "deferred_threads", ()))
    points, changed, capped = _kernel_points(db.entries, gpu_label, hw.logical_cores, deferred)
    if changed:
        notes.append(f"{changed} kernel figures adjusted to be monotone in batch (noisy profile)")
    if capped:
        notes.append(f"{capped} multi-threaded kernel figures measured under load capped by their "
                     "fewer-thread figures (they may not make fewer threads look faster)"
                     + (f", or estimated from them for the deferred thread counts {list(deferred)}" if deferred else ""))
    dram_by_threads = {b.threads: b.gbps for b in db.bandwidths if b.kind == "dram_read" and b.device == "cpu"}
    dram = db.dram_read_gbps() or DEFAULT_GBPS_PER_CORE * hw.physical_cores
    per_core = dram_by_threads.get(1, dram / max(hw.physical_cores, 1))
    big = [p for p in points if p.device == ON_CPU and not p.busy and p.threads == 1 and p.batch >= 64]
    gflops = max((p.flops / p.seconds / GB for p in big), default=DEFAULT_GFLOPS_PER_CORE)
    busy = [b for b in points if b.busy and b.device == ON_CPU]
    slowdown = DEFAULT_BUSY_SLOWDOWN
    if busy:
        idle = {(p.op, p.shape, p.weight_type, p.batch, p.threads): p.seconds for p in points
                if p.device == ON_CPU and not p.busy}
        ratios = [b.seconds / idle[k] for b in busy
                  if (k := (b.op, b.shape, b.weight_type, b.batch, b.threads)) in idle and idle[k] > 0]
        slowdown = max(1.0, statistics.median(ratios)) if ratios else slowdown
    cpu = CpuSpec(
        name=hw.cpu_model, physical_cores=hw.physical_cores, logical_cores=hw.logical_cores,
        ram_bytes=hw.ram_total, dram_gbps=dram, gbps_per_core=min(per_core, dram),
        gflops_per_core=gflops, busy_slowdown=slowdown,
    )
    gpu = None
    if gpu_devices:
        gpu = _gpu_from_profile(db, gpu_label or "", points, notes)
    return HardwareModel(
        name=hw.cpu_model if gpu is None else f"{hw.cpu_model} + {gpu.name}",
        source=f"profile:{db.fingerprint}", cpu=cpu, gpu=gpu, kernels=tuple(points),
        overheads=tuple(_overhead_points(db.entries, gpu_label, hw.logical_cores, deferred)), notes=tuple(notes),
    )


def _gpu_from_profile(db: ProfileDB, label: str, points: list[KernelPoint], notes: list[str]) -> GpuSpec:
    device = db.hardware.ggml_gpus[0]
    nvml = db.hardware.gpus[0] if db.hardware.gpus else None
    gpu_points = [p for p in points if p.device == ON_GPU]
    mem = max((p.weight_bytes / p.seconds / GB for p in gpu_points if p.batch == 1), default=0.0)
    tflops = max((p.flops / p.seconds / 1e12 for p in gpu_points), default=0.0)
    if not gpu_points:
        notes.append("profile has no GPU kernel figures; GPU compute from defaults")
    pageable = db.bandwidth("h2d", label, "pageable")
    busy = db.bandwidth("h2d", label, "pageable", "cpu_busy")
    link = ""
    if nvml and nvml.pcie_gen and nvml.pcie_width:
        link = f"{nvml.pcie_gen}.0x{nvml.pcie_width}"
    fallback = _pcie_gbps(nvml.pcie_gen or 4, nvml.pcie_width or 16) if nvml else 8.0
    pcie = pageable.gbps if pageable else fallback
    return GpuSpec(
        name=nvml.name if nvml else device.description,
        vram_bytes=device.memory_total or (nvml.vram_total if nvml else 0),
        mem_gbps=mem or 300.0,
        tflops=tflops or 20.0,
        pcie_gbps=pcie,
        pcie_busy_gbps=busy.gbps if busy else pcie * PCIE_BUSY_FACTOR,
        pcie_label=link,
    )


# ------------------------------------------------------------------ from a spec


def _pcie_gbps(gen: int, lanes: int) -> float:
    return PCIE_LANE_GBPS.get(int(gen), PCIE_LANE_GBPS[4]) * int(lanes) * PCIE_PAGEABLE_EFFICIENCY


def parse_pcie(text: str) -> tuple[int, int]:
    """"4.0x8", "4x8", "gen5 x16" -> (generation, lanes); ValueError otherwise."""
    cleaned = text.lower().replace("gen", "").replace(" ", "")
    if "x" not in cleaned:
        raise ValueError(f"PCIe link {text!r}: write it as generation x lanes, e.g. 4.0x8")
    gen, lanes = cleaned.split("x", 1)
    return int(float(gen)), int(lanes)


def _bytes(value: Any) -> int:
    return parse_size(value) if isinstance(value, str) else int(value)


def hardware_from_spec(spec: dict[str, Any]) -> HardwareModel:
    """A HardwareModel from a short description of a machine we do not own.

    Keys (sizes as "16G" or bytes, bandwidths in GB/s, compute in GFLOP/s or TFLOP/s):
      name; ram; cpu: {name, cores, threads, dram_gbps, gbps_per_core, gflops_per_core};
      gpu (optional): {name, vram, mem_gbps, tflops, pcie: "4.0x8" | pcie_gbps}.
    Missing CPU figures take the documented defaults; a GPU needs vram, mem_gbps and tflops.
    Raises ValueError for a spec it cannot read.
    """
    try:
        c = spec.get("cpu", {})
        cores = int(c.get("cores", 8))
        threads = int(c.get("threads", cores))
        per_core = float(c.get("gbps_per_core", DEFAULT_GBPS_PER_CORE))
        cpu = CpuSpec(
            name=str(c.get("name", "CPU")), physical_cores=cores, logical_cores=threads,
            ram_bytes=_bytes(spec.get("ram", "32G")),
            dram_gbps=float(c.get("dram_gbps", per_core * cores)), gbps_per_core=per_core,
            gflops_per_core=float(c.get("gflops_per_core", DEFAULT_GFLOPS_PER_CORE)),
            busy_slowdown=float(c.get("busy_slowdown", DEFAULT_BUSY_SLOWDOWN)),
        )
        gpu = None
        g = spec.get("gpu")
        if g:
            if "pcie_gbps" in g:
                pcie, label = float(g["pcie_gbps"]), str(g.get("pcie", ""))
            else:
                gen, lanes = parse_pcie(str(g.get("pcie", "4.0x16")))
                pcie, label = _pcie_gbps(gen, lanes), f"{gen}.0x{lanes}"
            gpu = GpuSpec(
                name=str(g.get("name", "GPU")), vram_bytes=_bytes(g["vram"]),
                mem_gbps=float(g["mem_gbps"]), tflops=float(g["tflops"]), pcie_gbps=pcie,
                pcie_busy_gbps=float(g.get("pcie_busy_gbps", pcie * PCIE_BUSY_FACTOR)), pcie_label=label,
            )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"hardware spec: missing or malformed {exc}") from exc
    return HardwareModel(name=str(spec.get("name", cpu.name)), source="spec", cpu=cpu, gpu=gpu)


# ------------------------------------------------------------------ presets for tests


def laptop_4gb_pcie4x8() -> HardwareModel:
    """A gaming laptop: 8 cores/16 threads, DDR5 at 60 GB/s, a 4 GB GPU on PCIe 4.0 x8."""
    return hardware_from_spec({
        "name": "laptop 4 GB, PCIe 4.0 x8", "ram": "32G",
        "cpu": {"name": "8-core laptop CPU", "cores": 8, "threads": 16, "dram_gbps": 60},
        "gpu": {"name": "laptop GPU 4 GB", "vram": "4G", "mem_gbps": 192, "tflops": 18, "pcie": "4.0x8"},
    })


def desktop_16gb_pcie5x16() -> HardwareModel:
    """A gaming desktop: 16 cores/32 threads, DDR5 at 80 GB/s, a 16 GB GPU on PCIe 5.0 x16."""
    return hardware_from_spec({
        "name": "desktop 16 GB, PCIe 5.0 x16", "ram": "64G",
        "cpu": {"name": "16-core desktop CPU", "cores": 16, "threads": 32, "dram_gbps": 80,
                "gflops_per_core": 120},
        "gpu": {"name": "desktop GPU 16 GB", "vram": "16G", "mem_gbps": 960, "tflops": 110, "pcie": "5.0x16"},
    })


def cpu_only_box() -> HardwareModel:
    """A machine without a GPU: 8 cores/8 threads, 32 GB at 40 GB/s."""
    return hardware_from_spec({
        "name": "CPU-only box", "ram": "32G",
        "cpu": {"name": "8-core CPU", "cores": 8, "threads": 8, "dram_gbps": 40},
    })
