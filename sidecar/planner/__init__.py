"""The placement planner: per token tier, where each sub-layer runs within a VRAM budget.

Pure core (no I/O, no environment reads): model inspection results and a hardware model in,
a frozen Schedule out.

    plan(model: ModelInfo, hw: HardwareModel, budget: Budget, ctx=4096, options=PlanOptions()) -> Schedule
    hardware_from_profile(db: ProfileDB) -> HardwareModel
    hardware_from_spec(spec: dict) -> HardwareModel
    laptop_4gb_pcie4x8(), desktop_16gb_pcie5x16(), cpu_only_box() -> HardwareModel
    anchors(model, hw, budget, ctx, options) -> tuple[Anchor, ...]   (-ngl and --fit emulation)
"""

from sidecar.budget import Budget
from sidecar.planner.anchors import Anchor, anchors
from sidecar.planner.candidates import CPU_ONLY, DYNAMIC, FAMILIES, FULL_GPU, GPU_STREAMING, STATIC
from sidecar.planner.cost_model import DOUBLE_BUFFERED, OP_OFFLOAD, ExecutorModel, PassShape
from sidecar.planner.hardware_model import (
    HardwareModel,
    cpu_only_box,
    desktop_16gb_pcie5x16,
    hardware_from_profile,
    hardware_from_spec,
    laptop_4gb_pcie4x8,
)
from sidecar.planner.options import PlanOptions
from sidecar.planner.schedule import Schedule, TierPlan, UnitPlacement
from sidecar.planner.planning import PlanError, plan

__all__ = [
    "CPU_ONLY",
    "DOUBLE_BUFFERED",
    "DYNAMIC",
    "FAMILIES",
    "FULL_GPU",
    "GPU_STREAMING",
    "OP_OFFLOAD",
    "STATIC",
    "Anchor",
    "Budget",
    "ExecutorModel",
    "HardwareModel",
    "PassShape",
    "PlanError",
    "PlanOptions",
    "Schedule",
    "TierPlan",
    "UnitPlacement",
    "anchors",
    "cpu_only_box",
    "desktop_16gb_pcie5x16",
    "hardware_from_profile",
    "hardware_from_spec",
    "laptop_4gb_pcie4x8",
    "plan",
]
