"""placement_sum.py's array sum against the unit-by-unit loop it replaced (kept below as the
reference): every field of every pass cost agrees to rounding, on random placements of real models'
units (a dense 8B, a 30B MoE, and Gemma 3 with its sliding-window layers) on each preset machine, decode and prefill passes, with the
executor that copies synchronously and the one that overlaps copies, and random KV placements."""

from __future__ import annotations

import random

import pytest

from sidecar.model_info import ATTENTION, model_from_hf_config, sub_layers
from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import EMBEDDING, SubLayer
from sidecar.planner.cost_model import (
    DOUBLE_BUFFERED, OP_OFFLOAD, STREAMED, ExecutorModel, PassCost, PassFigures, PassShape, graph_overhead_seconds,
    pass_figures, placed_pass_cost,
)
from sidecar.planner.hardware_model import ON_CPU, ON_GPU, HardwareModel
from support.hf_models import GEMMA3_4B, HARDWARE, model

FIELDS = ("seconds", "cpu_seconds", "gpu_seconds", "copy_seconds", "exposed_copy_seconds", "overhead_seconds",
          "copy_bytes", "cpu_busy_seconds")


@pytest.mark.parametrize("hw_name", sorted(HARDWARE))
@pytest.mark.parametrize("model_name", ["llama_8b", "qwen3_30b_a3b", "gemma3_4b"])
def test_the_array_sum_equals_the_unit_loop(hw_name: str, model_name: str) -> None:
    hw = HARDWARE[hw_name]()
    m = model_from_hf_config(GEMMA3_4B, "Q4_K_M", name="Gemma-3-4B") if model_name == "gemma3_4b" else model(model_name)
    assert m.swa_layers or model_name != "gemma3_4b", "Gemma 3's sliding-window layers are what it is here for"
    units = sub_layers(m)
    rng = random.Random(f"{hw_name}/{model_name}")
    ways = (ON_CPU, ON_GPU, STREAMED) if hw.has_gpu else (ON_CPU,)
    checked = 0
    for shape in (PassShape.decode(1, 700), PassShape.decode(8, 3000), PassShape(512, 1, 0, 1), PassShape(96, 4, 900, 0)):
        for executor in (OP_OFFLOAD, DOUBLE_BUFFERED):
            contention = executor.copy_overlap > 0
            figures = pass_figures(hw, m, units, shape, 4, "F16", contention)
            for _ in range(25):
                # Runs of one way, as placements are, and single units flipped inside them.
                where = []
                while len(where) < len(units):
                    where += [rng.choice(ways)] * rng.randint(1, 12)
                where = tuple(where[: len(units)])
                layers = {u.layer for u in units if u.layer is not None}
                kv = frozenset(layer for layer in layers if hw.has_gpu and rng.random() < 0.5)
                got = placed_pass_cost(hw, m, units, where, kv, shape, 4, executor, figures)
                want = loop_pass_cost(hw, m, units, where, kv, shape, 4, executor, figures)
                for field in FIELDS:
                    assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-9, abs=1e-15), field
                checked += 1
    assert checked == 4 * 2 * 25


def loop_pass_cost(hw: HardwareModel, model: ModelInfo, units: tuple[SubLayer, ...], where: tuple[str, ...],
                     kv_gpu_layers: frozenset[int], shape: PassShape, threads: int, executor: ExecutorModel,
                     figures: PassFigures) -> PassCost:
    """The sum as cost_model summed it unit by unit before placement_sum.py, kept as the reference."""
    if len(where) != len(units) or len(figures.units) != len(units):
        raise ValueError("one placement and one figure per unit")
    streaming = STREAMED in where
    overlap = executor.copy_overlap if streaming else 0.0
    has_gpu = hw.has_gpu
    switch = figures.switch_seconds
    swa = frozenset(model.swa_layers)
    cpu_s = gpu_s = copy_s = exposed = overhead = copy_bytes = cpu_busy = 0.0
    switches = 0
    prev_device = ON_CPU  # the token embedding lookup always runs on the host
    layer_device: dict[int, str] = {}
    n = len(units)
    figs = figures.units
    streamed = [w == STREAMED for w in where]
    if streaming and streamed[0]:
        exposed += figs[0].copy_seconds
    for i, u in enumerate(units):
        w = where[i]
        device = ON_CPU if w == ON_CPU else ON_GPU
        f = figs[i]
        # The next unit's weights are copied during this split when it streams; a CPU split
        # and a copy that really overlap slow each other (the profile's busy figures).
        nxt_streams = i + 1 < n and streamed[i + 1]
        contended = overlap > 0 and device == ON_CPU and nxt_streams
        if nxt_streams:
            nxt = figs[i + 1].copy_contended_seconds if contended else figs[i + 1].copy_seconds
        else:
            nxt = 0.0
        if device == ON_CPU:
            c = f.cpu_contended_seconds if contended else f.cpu_seconds
        else:
            c = f.gpu_seconds
        if u.layer is not None and u.kind == ATTENTION:
            kv_device = ON_GPU if has_gpu and u.layer in kv_gpu_layers else ON_CPU
            core = figures.attention[(u.layer in swa, kv_device)]
            if kv_device == device:
                c += core
            else:
                # The attention core follows the cache: a round trip to its device and back.
                if kv_device == ON_CPU:
                    cpu_s += core
                else:
                    gpu_s += core
                overhead += 2 * switch
            layer_device.setdefault(u.layer, device)
        if device == ON_CPU:
            cpu_s += c
        else:
            gpu_s += c
        if f.has_rows and device != prev_device:
            switches += 1
            prev_device = device
        if w == STREAMED:
            copy_s += f.copy_seconds
            copy_bytes += f.copy_bytes
        if contended:
            cpu_busy += c
        # Per split: max(compute, overlap x next prefetch) + (1 - overlap) x next prefetch.
        exposed += max(c, overlap * nxt) - c + (1.0 - overlap) * nxt
    overhead += switches * switch
    for device in layer_device.values():
        overhead += figures.layer_overhead[device]
    uses_gpu = any(w != ON_CPU for w in where)
    uses_cpu = any(w == ON_CPU for w, u in zip(where, units) if u.kind != EMBEDDING)
    overhead += graph_overhead_seconds(hw, uses_cpu, uses_gpu, shape.tokens, threads)
    total = cpu_s + gpu_s + exposed + overhead
    return PassCost(
        seconds=total, cpu_seconds=cpu_s, gpu_seconds=gpu_s, copy_seconds=copy_s,
        exposed_copy_seconds=exposed, overhead_seconds=overhead, copy_bytes=copy_bytes,
        # Pageable copies stage through a CPU thread; overlapped CPU splits run at busy speed.
        cpu_busy_seconds=copy_s + cpu_busy,
    )
