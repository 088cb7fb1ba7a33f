"""One placement's pass time summed over its units in array operations (cost_model.placed_pass_cost).

A search prices thousands of placements of the same pass: a 30B MoE on a desktop took 3,264 of
them per plan, over ~100 units each, and built ~900 passes' figures. Summed unit by unit in Python
that loop was 55% of a plan's wall time (sampled), and finding which units cost alike, again for
every pass, most of the rest of the figures' time. Here the units' layout is found once per search
(UnitLayout), each pass's figures become columns once (UnitColumns), each placement's masks once
(placement_masks), and each placement's sum is a handful of operations on them.

The sum is the loop's, term for term: per unit, its compute where it runs (CPU at its busy figure
when the next unit's copy overlaps it); attention over the cache where the cache lives (a round
trip of two device switches when that is not where the unit runs); a switch at each change of
device between units that multiply rows (the embedding lookup starts on the CPU); one layer
overhead per layer, on the device of its attention unit; and the copies: a streamed unit's weights
cross PCIe during the previous split, hidden by the executor's overlap. Only the order of the
additions differs, so figures agree to rounding (tests/unit/test_placement_sum.py checks them against
the loop on random placements).

Pure: arrays in, a PassCost out; the masks' memo is keyed by the placement alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sidecar.model_info.units import ATTENTION, EMBEDDING, SubLayer
from sidecar.planner.hardware_model import ON_CPU, ON_GPU

STREAMED = "streamed"  # cost_model.STREAMED (which imports this module)


@dataclass(frozen=True)
class PassCost:
    """Predicted time of one pass and where it went (seconds)."""

    seconds: float
    cpu_seconds: float
    gpu_seconds: float
    copy_seconds: float
    exposed_copy_seconds: float
    overhead_seconds: float
    copy_bytes: float
    # CPU time spent while copies run: the staging of pageable copies, plus CPU splits that
    # overlap a copy.
    cpu_busy_seconds: float


class PricedUnit(Protocol):
    """What unit_columns reads of one unit's price (cost_model.UnitCost, frozen: read-only)."""

    @property
    def cpu_seconds(self) -> float: ...
    @property
    def cpu_contended_seconds(self) -> float: ...
    @property
    def gpu_seconds(self) -> float: ...
    @property
    def copy_seconds(self) -> float: ...
    @property
    def copy_contended_seconds(self) -> float: ...
    @property
    def copy_bytes(self) -> float: ...
    @property
    def has_rows(self) -> bool: ...


@dataclass(frozen=True, eq=False)
class UnitColumns:
    """A pass's per-unit figures as columns, and the facts about its units the sum reads."""

    cpu: np.ndarray
    cpu_contended: np.ndarray
    gpu: np.ndarray
    # The next unit's copy, idle and contended (0 after the last unit): what a split prefetches.
    next_copy: np.ndarray
    next_copy_contended: np.ndarray
    copy: np.ndarray
    copy_bytes: np.ndarray
    has_rows: np.ndarray
    # Each attention unit's layer's attention over a cache held on the CPU and (where there is
    # one) the GPU, in the order of layout.attention_at.
    attention_core_cpu: np.ndarray
    attention_core_gpu: np.ndarray
    layout: UnitLayout


@dataclass(frozen=True, eq=False)
class UnitLayout:
    """What placement_sum and pass_figures read of one model's units, found once per search: a
    search builds ~900 passes' figures over the same ~100 units."""

    # Units that cost alike (cost_model.cost_signature): one representative of each, and for
    # every unit the index of its representative.
    representatives: tuple[SubLayer, ...]
    index: np.ndarray
    # One attention layer of each kind (sliding window or not) stands for all of them.
    standing_for: Mapping[bool, int]
    not_embedding: np.ndarray
    # The attention units (a layer's): their indices, layers, and whether they slide.
    attention_at: np.ndarray
    attention_layers: tuple[int, ...]
    attention_sliding: np.ndarray
    # Of those, the first unit of each layer: the layer's overhead goes to its device.
    first_of_layer: np.ndarray


def unit_layout(units: Sequence[SubLayer], swa_layers: frozenset[int], signature: Callable[[SubLayer], tuple]) -> UnitLayout:
    """The layout of `units`; `signature` says which units cost alike."""
    slot_of: dict[tuple, int] = {}
    representatives: list[SubLayer] = []
    index: list[int] = []
    for u in units:
        key = signature(u)
        k = slot_of.get(key)
        if k is None:
            k = slot_of[key] = len(representatives)
            representatives.append(u)
        index.append(k)
    at = [i for i, u in enumerate(units) if u.layer is not None and u.kind == ATTENTION]
    layers = tuple(int(units[i].layer) for i in at)  # type: ignore[arg-type]  # filtered above
    standing_for: dict[bool, int] = {}
    seen: set[int] = set()
    first = []
    for layer in layers:
        standing_for.setdefault(layer in swa_layers, layer)
        first.append(layer not in seen)
        seen.add(layer)
    return UnitLayout(
        representatives=tuple(representatives), index=np.array(index, dtype=np.intp), standing_for=standing_for,
        not_embedding=np.array([u.kind != EMBEDDING for u in units], dtype=bool),
        attention_at=np.array(at, dtype=np.intp), attention_layers=layers,
        attention_sliding=np.array([layer in swa_layers for layer in layers], dtype=bool),
        first_of_layer=np.array(first, dtype=bool),
    )


def unit_columns(costs: Sequence[PricedUnit], layout: UnitLayout,
                 attention: Mapping[tuple[bool, str], float]) -> UnitColumns:
    """Columns of `costs` (one per representative of `layout`); `attention` is
    PassFigures.attention, by (sliding-window layer, device holding the KV)."""
    rows = [(c.cpu_seconds, c.cpu_contended_seconds, c.gpu_seconds, c.copy_seconds,
             c.copy_contended_seconds, c.copy_bytes, float(c.has_rows)) for c in costs]
    cpu, cpu_contended, gpu, copy, copy_contended, copy_bytes, has_rows = np.array(rows)[layout.index].T.copy()
    sliding = layout.attention_sliding
    return UnitColumns(
        cpu=cpu, cpu_contended=cpu_contended, gpu=gpu,
        next_copy=np.append(copy[1:], 0.0), next_copy_contended=np.append(copy_contended[1:], 0.0),
        copy=copy, copy_bytes=copy_bytes, has_rows=has_rows > 0,
        attention_core_cpu=np.where(sliding, attention.get((True, ON_CPU), np.inf), attention.get((False, ON_CPU), np.inf)),
        attention_core_gpu=np.where(sliding, attention.get((True, ON_GPU), np.inf), attention.get((False, ON_GPU), np.inf)),
        layout=layout,
    )


@dataclass(frozen=True, eq=False)
class PlacementMasks:
    on_cpu: np.ndarray
    on_gpu: np.ndarray  # from VRAM or streamed
    streamed: np.ndarray
    next_streams: np.ndarray  # the next unit streams
    streaming: bool


@functools.lru_cache(maxsize=4096)
def placement_masks(where: tuple[str, ...]) -> PlacementMasks:
    """`where` (one of ON_CPU, ON_GPU, STREAMED per unit) as masks; a search asks for the same
    placement under many pass shapes."""
    placed = np.array(where)
    on_cpu, streamed = placed == ON_CPU, placed == STREAMED
    return PlacementMasks(on_cpu, ~on_cpu, streamed, np.append(streamed[1:], False), bool(streamed.any()))


@functools.lru_cache(maxsize=1024)
def _kv_on_gpu(layers: tuple[int, ...], kv_gpu_layers: frozenset[int]) -> np.ndarray:
    return np.array([layer in kv_gpu_layers for layer in layers], dtype=bool)


def placement_sum(col: UnitColumns, masks: PlacementMasks, kv_gpu_layers: frozenset[int], has_gpu: bool,
                  copy_overlap: float, switch_seconds: float, layer_overhead: Mapping[str, float],
                  graph_overhead: Callable[[bool, bool], float]) -> PassCost:
    """The pass cost of one placement (`masks`); `copy_overlap` is the executor's, and
    `graph_overhead(uses_cpu, uses_gpu)` the pass's own (cost_model.graph_overhead_seconds)."""
    layout = col.layout
    on_cpu, on_gpu = masks.on_cpu, masks.on_gpu
    overlap = copy_overlap if masks.streaming else 0.0
    if overlap > 0:
        contended = on_cpu & masks.next_streams
        compute = np.where(on_cpu, np.where(contended, col.cpu_contended, col.cpu), col.gpu)
    else:
        contended = None
        compute = np.where(on_cpu, col.cpu, col.gpu)
    cpu_s = gpu_s = overhead = 0.0
    at = layout.attention_at
    if at.size:
        if has_gpu and kv_gpu_layers:
            kv_on_gpu = _kv_on_gpu(layout.attention_layers, kv_gpu_layers)
            core = np.where(kv_on_gpu, col.attention_core_gpu, col.attention_core_cpu)
        else:
            kv_on_gpu = np.zeros(at.size, dtype=bool)
            core = col.attention_core_cpu
        runs_on_gpu = on_gpu[at]
        beside = kv_on_gpu == runs_on_gpu
        compute[at] += np.where(beside, core, 0.0)
        if not beside.all():
            # The attention core follows the cache: a round trip to its device and back.
            away = ~beside
            cpu_s += float(core[away & ~kv_on_gpu].sum())
            gpu_s += float(core[away & kv_on_gpu].sum())
            overhead += 2 * switch_seconds * int(away.sum())
        first_on_gpu = runs_on_gpu[layout.first_of_layer]
        on_gpu_layers = int(first_on_gpu.sum())
        overhead += ((first_on_gpu.size - on_gpu_layers) * layer_overhead[ON_CPU]
                     + on_gpu_layers * layer_overhead[ON_GPU])
    cpu_s += float(compute[on_cpu].sum())
    gpu_s += float(compute[on_gpu].sum())
    # Device changes along the units that multiply rows, from the CPU's embedding lookup.
    devices = on_gpu[col.has_rows]
    overhead += (int(devices[0]) + int((devices[1:] != devices[:-1]).sum())) * switch_seconds if devices.size else 0.0
    copy_s = copy_bytes = exposed = busy = 0.0
    if masks.streaming:
        streamed = masks.streamed
        nxt = masks.next_streams
        upcoming = col.next_copy if contended is None else np.where(contended, col.next_copy_contended, col.next_copy)
        prefetch = np.where(nxt, upcoming, 0.0)
        exposed = float(col.copy[0]) if streamed[0] else 0.0
        # Per split: max(compute, overlap x next prefetch) + (1 - overlap) x next prefetch.
        exposed += float((np.maximum(compute, overlap * prefetch) - compute + (1.0 - overlap) * prefetch).sum())
        copy_s = float(col.copy[streamed].sum())
        copy_bytes = float(col.copy_bytes[streamed].sum())
        if contended is not None:
            busy = float(compute[contended].sum())
    overhead += graph_overhead(bool((on_cpu & layout.not_embedding).any()), bool(on_gpu.any()))
    return PassCost(
        seconds=cpu_s + gpu_s + exposed + overhead, cpu_seconds=cpu_s, gpu_seconds=gpu_s, copy_seconds=copy_s,
        exposed_copy_seconds=exposed, overhead_seconds=overhead, copy_bytes=copy_bytes,
        # Pageable copies stage through a CPU thread; overlapped CPU splits run at busy speed.
        cpu_busy_seconds=copy_s + busy,
    )
