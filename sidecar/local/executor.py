"""From the budget in force to what the engine runs: plan, then turn the plan into llama.cpp settings.

The planner is pure; this is its shell for the daemon. At start it gets the machine's profile
(built-in defaults until one is measured, see sidecar.profiler.startup) and the model's header, and for every budget it plans a
Schedule and maps it onto an EngineConfig: tensor overrides, GPU layers, KV placement, op offload,
micro-batch, flash attention and threads per token tier.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from sidecar.budget import Budget
from sidecar.model_info.default_model import default_model_path
from sidecar.engine import EngineConfig
from sidecar.errors import InvalidArgument, ModelLoadError
from sidecar.settings import Settings
from sidecar.vision.encoder_settings import EncoderSettings

log = structlog.get_logger("executor")

# Read once by ggml's CUDA backend when it registers: batches at least this large run
# host-resident weights on the GPU (streamed), smaller ones on the CPU.
OP_OFFLOAD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"


def _plan_memo() -> object:
    """A new memo; the planner is imported where plans are made, not with this module."""
    from sidecar.planner.search import PlanMemo

    return PlanMemo()


@dataclass(frozen=True)
class PlanInputs:
    """What the planner needs besides the budget: the model's structure and this machine."""

    model: object  # sidecar.model_info.ModelInfo
    hardware: object  # sidecar.planner.HardwareModel
    # sidecar.profiler.startup.StartupProfile: where `hardware` came from, and whether a profile
    # is to be measured in the background.
    startup: object = None
    # sidecar.planner.search.PlanMemo: the passes earlier plans priced, so a budget change plans
    # in a fraction of the first plan's time (a 30B MoE: 0.9 s first).
    memo: object = field(default_factory=_plan_memo, compare=False, repr=False)


def load_plan_inputs(settings: Settings, model=None) -> PlanInputs | None:
    """The model header (read here unless `model` already holds it: reading a GGUF header takes
    a second or two) and this machine's profile, or None when planning is off (--profile off)
    or impossible (then the daemon runs the CPU plan and says why).

    Nothing is measured here: without a usable stored profile the planner gets built-in defaults
    (cores, the model's sizes) and the daemon measures the profile in the background."""
    if settings.hardware is not None:
        return _described_inputs(settings, model)
    if settings.profile == "off":
        return None
    try:
        from sidecar.model_info import inspect_gguf
        from sidecar.planner import hardware_from_profile
        from sidecar.planner.default_hardware import hardware_from_facts
        from sidecar.profiler.startup import startup_profile

        start = startup_profile(settings.profile)
        if start.measure_to is not None:
            log.info("profile to measure in the background", reason=start.reason, path=str(start.measure_to))
        hardware = hardware_from_profile(start.db) if start.db is not None else hardware_from_facts(start.hardware)
        return PlanInputs(model or inspect_gguf(settings.model or default_model_path()), hardware, start)
    except Exception as e:  # a planner problem must not keep the game's NPCs silent
        log.warning("planning unavailable; running the CPU plan", reason=f"{type(e).__name__}: {e}")
        return None


def _described_inputs(settings: Settings, model) -> PlanInputs:
    """Plan inputs for --hardware: the machine as described, not as measured (a GPU's speed is
    what a GPU-type device without a GPU cannot show). A bad description is a settings error
    (exit 2), not a reason to fall back silently."""
    from sidecar.model_info import inspect_gguf
    from sidecar.planner.sources import load_hardware

    try:
        hardware, _source = load_hardware(settings.hardware)
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"--hardware {settings.hardware}: {e}") from None
    return PlanInputs(model or inspect_gguf(settings.model or default_model_path()), hardware)


def load_projector(settings: Settings):
    """(projector, text model): the --mmproj file's header (a ModelInfo with `vision`), checked
    against the text model's, whose header comes back for the planner; (None, None) without
    --mmproj. ModelLoadError when it is not a projector or does not pair."""
    if settings.mmproj is None:
        return None, None
    from sidecar.model_info import inspect_gguf
    from sidecar.model_info.gguf_reader import GgufReadError

    path = Path(settings.mmproj)
    try:
        projector = inspect_gguf(path)
    except FileNotFoundError:
        raise ModelLoadError(f"projector file not found: {path}") from None
    except GgufReadError as e:
        raise ModelLoadError(f"--mmproj {path} is not a GGUF projector: {e}") from None
    if projector.vision is None or not projector.vision.n_embd:
        raise ModelLoadError(f"--mmproj {path} is a {projector.arch} model, not a vision projector (mmproj)")
    text = inspect_gguf(settings.model or default_model_path())
    width = projector.vision.projection_dim
    if width and width != text.n_embd:
        raise ModelLoadError(
            f"the projector {path.name} makes {width}-wide image embeddings but {text.name} takes "
            f"{text.n_embd}-wide ones: they are not a pair (use the mmproj file made for this model)"
        )
    return projector, text


def engine_config(
    settings: Settings, budget: Budget | None = None, inputs: PlanInputs | None = None, projector=None,
    kv_type: str | None = None, micro_batch: int | None = None,
) -> EngineConfig:
    """The engine configuration for `budget` (default: the one the daemon was started with).

    `kv_type` pins the KV cache type (re-plans of a running daemon pass the one in force:
    llama.cpp restores a saved sequence only into a cache of the same type, so a budget change
    that switched F16 for Q8_0 would lose every conversation); None lets the planner choose.
    `micro_batch` pins n_ubatch likewise (BudgetControl keeps the one in force when nothing else
    would move)."""
    budget = budget or settings.budget_value
    base = cpu_engine_config(settings, budget)
    schedule = None
    if inputs is not None:
        from sidecar.planner import PlanOptions, plan

        choices = _default_plan_options(inputs)
        if micro_batch is not None:
            choices["micro_batches"] = (micro_batch,)
        schedule = plan(
            inputs.model,
            inputs.hardware,
            budget,
            ctx=settings.ctx * settings.sequences(),
            options=PlanOptions(n_batch=settings.batch, flash_attention=settings.flash_attention_flag,
                                kv_type=kv_type or "auto", **choices),
            memo=inputs.memo,
        )
        base = config_from_schedule(base, schedule, settings.threads, placement_device(settings))
    if projector is None:
        return base
    vision = vision_plan(settings, budget, projector, inputs, schedule)
    encoder = encoder_settings(settings, projector, vision, base.threads_prefill)
    # An image's embeddings go into the text model in one micro-batch when the projector wants
    # them to attend to each other both ways (Gemma 3); make room for the largest image.
    n_ubatch = max(base.n_ubatch, min(vision.cost.output_tokens, 8192))
    return replace(base, vision=encoder, n_ubatch=n_ubatch, n_batch=max(base.n_batch, n_ubatch))


def _default_plan_options(inputs: PlanInputs) -> dict:
    # Without measured kernels the roofline cannot tell micro-batches apart; llama.cpp's default
    # (512, what measured plans on CPUs mostly pick) keeps the first plan's numerics those of the
    # plan that follows once the background profile lands.
    return {"micro_batches": (512,)} if getattr(inputs.hardware, "source", "") == "defaults" else {}


def vision_plan(settings: Settings, budget: Budget, projector, inputs: PlanInputs | None, schedule):
    """VLMOpt's placement of the encoder beside the language schedule (a CPU plan without a profile)."""
    from sidecar.planner import cpu_only_box
    from sidecar.planner.vision import plan_vision

    hardware = inputs.hardware if inputs is not None else cpu_only_box()
    resident = phase = 0
    if schedule is not None:
        parts = dict(schedule.vram_bytes_by_component)
        resident = sum(b for name, b in parts.items() if name.startswith("weights.") or name == "kv_cache")
        phase = schedule.vram_bytes
    return plan_vision(
        projector, hardware, budget, language_resident_vram=resident, language_phase_vram=phase,
        vlmopt=settings.vlmopt, threads=settings.cpu_threads(),
    )


def encoder_settings(settings: Settings, projector, vision, threads: int) -> EncoderSettings:
    from sidecar.planner.vision import CPU, merge_factor

    v = projector.vision
    return EncoderSettings(
        projector_path=Path(settings.mmproj),
        use_gpu=vision.placement != CPU and placement_device(settings) != "CPU",
        flash_attention=vision.flash_attention,
        image_max_tokens=vision.image_max_tokens,
        max_image_side=vision.max_image_side,
        resident=not vision.vlmopt,
        threads=threads,
        fixed_image_size=0 if vision.dynamic_resolution else v.image_size,
        patch_px=max(1, v.patch_size) * merge_factor(v),
    )


def config_from_schedule(base: EngineConfig, schedule, threads_flag: int = 0, device: str | None = None) -> EngineConfig:
    """`base` with the schedule's placement and threads, the plan's GPU mapped onto ggml device
    `device` (default: the first GPU-type one). An explicit --threads caps every tier."""

    def cap(n: int) -> int:
        return min(n, threads_flag) if threads_flag else n

    tiers = tuple(sorted({(t.max_tokens, cap(t.threads)) for t in schedule.tiers}))
    gpu = device or placement_device()
    overrides = tuple((pattern, gpu if device == "GPU0" else "CPU") for pattern, device in schedule.tensor_overrides)
    if schedule.op_offload and gpu != "CPU":
        # Only takes effect before the CUDA backend registers (the first model load).
        os.environ.setdefault(OP_OFFLOAD_ENV, str(schedule.op_offload_min_batch))
    return replace(
        base,
        n_ubatch=min(schedule.micro_batch, base.n_batch),
        threads_decode=cap(schedule.threads_decode),
        threads_prefill=cap(schedule.threads_prefill),
        tier_threads=tiers,
        flash_attention=schedule.flash_attention,
        n_gpu_layers=schedule.n_gpu_layers if gpu != "CPU" else 0,
        tensor_overrides=overrides if gpu != "CPU" else (),
        op_offload=schedule.op_offload,
        kv_on_gpu=schedule.kv_on_gpu,
        kv_type=schedule.kv_type,
        n_outputs_max=min(max(schedule.n_outputs_max, base.n_seq), base.n_batch),
        planned_vram_bytes=schedule.vram_bytes if gpu != "CPU" else 0,
        device=gpu,
        schedule=schedule,
    )


def describe_placement(config: EngineConfig) -> str:
    """One line for the log: where the weights and the KV cache live."""
    if config.n_gpu_layers == 0 and not config.tensor_overrides:
        return "cpu only"
    kv = "KV in VRAM" if config.kv_on_gpu else "KV in host memory"
    return f"{config.n_gpu_layers} layers on the GPU, {len(config.tensor_overrides)} tensor overrides, {kv}"


def register_devices(settings: Settings) -> tuple[str, ...]:
    """Register the --rpc servers in llama.cpp's device registry (before any planning or load);
    returns the device names they added. ModelLoadError when a server cannot be reached."""
    from sidecar.native.ggml_rpc import RpcUnavailable, add_rpc_server

    added: list[str] = []
    for endpoint in filter(None, (e.strip() for e in (settings.rpc or "").split(","))):
        try:
            added += add_rpc_server(endpoint)
        except (RpcUnavailable, RuntimeError) as e:
            raise ModelLoadError(f"--rpc {endpoint}: {e}") from None
    return tuple(added)


def placement_device(settings: Settings | None = None) -> str:
    """The ggml device the plan's GPU placement maps onto, whatever its backend (CUDA0, Vulkan0,
    RPC0): --device when given, else the first GPU-type device llama.cpp lists, else "CPU"."""
    from sidecar.native.ggml_devices import gpu_device_names

    gpus = gpu_device_names()
    wanted = settings.device if settings is not None else None
    if wanted:
        if wanted not in gpus:
            raise InvalidArgument(
                f"--device {wanted}: llama.cpp lists no such GPU-type device (it has: {', '.join(gpus) or 'none'})"
            )
        return wanted
    return gpus[0] if gpus else "CPU"


def cpu_engine_config(settings: Settings, budget: Budget) -> EngineConfig:
    """Everything in host memory, one thread count for all tiers, capped by the game."""
    threads = settings.cpu_threads()
    if budget.max_cpu_threads:
        threads = min(threads, budget.max_cpu_threads)
    return EngineConfig(
        model_path=settings.model or default_model_path(),
        n_ctx=settings.ctx,
        n_seq=settings.sequences(),
        n_seq_start=settings.start_sequences(),
        n_batch=settings.batch,
        threads_decode=threads,
        threads_prefill=threads,
        # Everything on the CPU: flash attention off unless asked for (planner/search.py says why).
        flash_attention=bool(settings.flash_attention_flag),
        n_gpu_layers=0,
        max_sessions=settings.max_sessions,
        max_prompt_tokens=min(settings.max_prompt_tokens, settings.ctx - 1),  # 0 stays 0: the engine's default
        max_tokens_per_request=settings.max_tokens_per_request,
        n_outputs_max=min(settings.sequences(), settings.batch),  # one logits row per sequence and pass
        adaptive_threads=settings.adaptive_threads,
        jump_forward=settings.jump_forward,
        prefix_cache_bytes=settings.prefix_cache_bytes,
        saved_sessions_bytes=settings.saved_sessions_bytes,
        # Under a RAM budget the old context goes before the new one is made (kv_demand.py).
        grow_beside=not settings.ram_budget_bytes,
    )


def gpu_free_bytes(device: str = "CUDA0") -> int | None:
    """Free memory on the placement device, or None without one. NVML's figure for a CUDA device
    (it counts every process's use, the game's included); otherwise (Vulkan, RPC, or no NVML) what
    ggml's backend reports for the device. CUDA's device order is taken as NVML's, which holds
    unless CUDA_VISIBLE_DEVICES reorders them."""
    if device == "CPU":
        return None
    if device.startswith("CUDA") and device[4:].isdigit():
        free = _nvml_free_bytes(int(device[4:]))
        if free is not None:
            return free
    from sidecar.native.ggml_devices import device_memory

    memory = device_memory(device)
    return memory[0] if memory is not None else None


def _nvml_free_bytes(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, NVMLError (no driver, no device), OSError (no library)
        return None
