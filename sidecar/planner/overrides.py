"""A residency as llama.cpp load settings: n_gpu_layers plus `-ot` tensor-override patterns.

n_gpu_layers puts a suffix of the layers (and first of all the output) on the GPU, their KV
cache with them. Overrides then move single units against that default: host FFNs of GPU
layers to "CPU" and, in general, anything resident below the GPU suffix to "GPU0". Patterns
are ECMAScript regexes searched in tensor names (llama.cpp uses std::regex_search); the first
that matches wins.
"""

from __future__ import annotations

import re

from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import EMBEDDING, OUTPUT, SubLayer
from sidecar.planner.budget_fill import Residency
from sidecar.planner.schedule import CPU, GPU0

_SUFFIX = re.compile(r"\.(weight|bias|scale)$")


def _stems(unit: SubLayer) -> list[str]:
    stems = []
    for name in unit.tensors:
        stem = _SUFFIX.sub("", re.sub(r"^(v\.)?blk\.\d+\.", "", name))
        if stem not in stems:
            stems.append(stem)
    return stems


def number_range_regex(lo: int, hi: int) -> str:
    """A regex alternation matching exactly the decimal integers lo..hi (no leading zeros),
    e.g. 0..46 -> "[0-9]|[1-3]\\d|4[0-6]"."""
    if lo > hi or lo < 0:
        raise ValueError(f"bad range {lo}..{hi}")
    parts: list[str] = []
    if lo <= 9:
        # One-digit numbers first: beyond them no block starts at 0, so no leading zeros.
        top = min(hi, 9)
        parts.append(str(lo) if lo == top else f"[{lo}-{top}]")
        lo = top + 1
    while lo <= hi:
        # The largest block lo .. lo + k*step - 1 with lo aligned to step, within hi.
        step = 1
        while lo % (step * 10) == 0 and lo + step * 10 - 1 <= hi:
            step *= 10
        room = 10 - (lo // step) % 10
        count = min(room, (hi - lo + 1) // step)
        top = lo + count * step - 1
        head_lo, head_hi = str(lo // step), str(top // step)
        first, last = head_lo[-1], head_hi[-1]
        digit = first if first == last else f"[{first}-{last}]"
        parts.append(head_lo[:-1] + digit + r"\d" * (len(str(step)) - 1))
        lo = top + 1
    return "|".join(parts)


def _runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def _layer_pattern(layers: list[int], all_layers: bool) -> str:
    if all_layers:
        return r"\d+"
    return "(" + "|".join(number_range_regex(a, b) for a, b in _runs(layers)) + ")"


def gpu_layer_start(model: ModelInfo, n_gpu_layers: int) -> int:
    """First layer llama.cpp puts on the GPU for `n_gpu_layers` (the output counts first)."""
    return model.n_layer + 1 - max(0, min(n_gpu_layers, model.n_layer + 1))


def default_device(unit: SubLayer, model: ModelInfo, n_gpu_layers: int) -> str:
    """Where a unit's weights go from n_gpu_layers alone, before overrides."""
    if unit.kind == EMBEDDING:
        return CPU
    if unit.kind == OUTPUT:
        return GPU0 if n_gpu_layers >= 1 else CPU
    return GPU0 if unit.layer is not None and unit.layer >= gpu_layer_start(model, n_gpu_layers) else CPU


def tensor_overrides(model: ModelInfo, units: tuple[SubLayer, ...], residency: Residency) -> tuple[tuple[str, str], ...]:
    """The (pattern, device) pairs that, with residency.n_gpu_layers, load exactly the
    residency: one pattern per (unit kind, direction), listing the layers it applies to."""
    if not residency.resident and not residency.kv_layers:
        return ()
    ngl = residency.n_gpu_layers
    moves: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}
    global_moves: list[tuple[str, str]] = []
    for u in units:
        if u.kind == EMBEDDING:
            continue
        want = GPU0 if u.name in residency.resident else CPU
        if want == default_device(u, model, ngl):
            continue
        stems = tuple(_stems(u))
        if u.layer is None:
            names = "|".join(re.escape(s) for s in stems)
            global_moves.append((rf"^({names})\.(weight|bias)$", want))
        else:
            moves.setdefault((want, u.kind, stems), []).append(u.layer)
    patterns: list[tuple[str, str]] = []
    gpu_layers = set(range(gpu_layer_start(model, ngl), model.n_layer))
    for (want, _kind, stems), layers in sorted(moves.items()):
        eligible = gpu_layers if want == CPU else set(range(model.n_layer)) - gpu_layers
        layer_re = _layer_pattern(layers, set(layers) == eligible and len(eligible) == model.n_layer)
        stem_re = "|".join(re.escape(s) for s in stems)
        patterns.append((rf"^blk\.{layer_re}\.({stem_re})\.", want))
    return tuple(patterns + global_moves)


def resolve(model: ModelInfo, units: tuple[SubLayer, ...], overrides: tuple[tuple[str, str], ...],
            n_gpu_layers: int) -> dict[str, str]:
    """Where llama.cpp would put each unit's weights ("GPU0" / "CPU") with these settings.

    A unit counts as on the GPU only when all its tensors are (as placement is per tensor).
    """
    compiled = [(re.compile(p), d) for p, d in overrides]
    where: dict[str, str] = {}
    for u in units:
        default = default_device(u, model, n_gpu_layers)
        devices = set()
        for name in u.tensors:
            hit = next((d for p, d in compiled if p.search(name)), None)
            devices.add(hit or default)
        where[u.name] = GPU0 if devices == {GPU0} else CPU
    return where
