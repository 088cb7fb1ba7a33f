"""The planner's one way in: `plan` checks the request, caps the budget to the machine, searches
(search.py) and turns the winner into the Schedule (assemble.py). Only this module calls both,
so assembly reads the search's results without the search having to know about assembly."""

from __future__ import annotations

from contextlib import nullcontext

from sidecar.budget import Budget
from sidecar.model_info.model import ModelInfo
from sidecar.planner.assemble import build_schedule
from sidecar.planner.candidates import smallest_gpu_need
from sidecar.planner.hardware_model import GIB, MIB, HardwareModel
from sidecar.planner.options import PlanOptions
from sidecar.planner.schedule import Schedule
from sidecar.planner.search import PlanMemo, search


class PlanError(ValueError):
    """No schedule can be made for this request (the message says why and what would work)."""


def plan(model: ModelInfo, hw: HardwareModel, budget: Budget, ctx: int = 4096,
         options: PlanOptions = PlanOptions(), memo: PlanMemo | None = None) -> Schedule:
    """The best schedule for `model` on `hw` within `budget` (VRAM bytes and CPU thread cap).

    Budget 0 or no GPU gives CPU only, still choosing threads per tier and the micro-batch. A
    budget that cannot hold even the smallest GPU plan gives the CPU plan, with a note saying
    how much the smallest GPU plan needs. Raises PlanError for a projector file or a context
    below one token.

    `memo` (search.PlanMemo), kept by a caller that plans the same model on the same machine
    again, makes the next plan reuse the passes this one priced: the schedule is the same with
    it or without.
    """
    if model.is_projector:
        raise PlanError(f"{model.name} is a vision projector: plan its language model; the method keeps "
                        "vision weights on the host and streams them while an image is encoded")
    if ctx < 1:
        raise PlanError(f"context of {ctx} tokens: need at least 1")
    notes: list[str] = []
    gpu_budget = budget.vram_bytes
    if budget.vram_bytes and not hw.has_gpu:
        notes.append(f"{hw.name} has no GPU: the VRAM budget is unused, CPU only")
        gpu_budget = 0
    elif hw.gpu and budget.vram_bytes > hw.gpu.vram_bytes:
        notes.append(f"budget above the GPU's {hw.gpu.vram_bytes / GIB:.1f} GiB: capped")
        gpu_budget = hw.gpu.vram_bytes
    with memo.lock if memo is not None else nullcontext():  # a search sets the memo's evaluators' threads
        found = search(model, hw, gpu_budget, budget.max_cpu_threads, ctx, options, memo)
        best, inputs = found.result, found.inputs
        if gpu_budget > 0 and not best.candidate.residency.uses_gpu:
            need = smallest_gpu_need(inputs)
            if need > gpu_budget:
                notes.append(f"budget {gpu_budget / MIB:.0f} MiB is below the smallest GPU plan "
                             f"({need / MIB:.0f} MiB: compute scratch and a stream slot): CPU only")
        return build_schedule(model, hw, budget, ctx, options, found, notes)
