"""A model and its context, loaded as an EngineConfig says: at start-up and on every reload."""

from __future__ import annotations

from dataclasses import replace

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.load_report import LoadReport, parse_load_log
from sidecar.native.context import NativeContext
from sidecar.native.model import NativeModel


def load_model_and_context(config: EngineConfig, n_seq: int | None = None) -> tuple[NativeModel, NativeContext]:
    """Raises ModelLoadError (or ResourceExhausted for a context that does not fit); nothing is
    left allocated when it does. `n_seq`: the sequences to allocate (kv_demand.py), at most the
    configuration's; None allocates them all."""
    model = NativeModel(
        config.model_path, n_gpu_layers=config.n_gpu_layers, tensor_overrides=config.tensor_overrides
    )
    try:
        ctx = context_for(model, config, n_seq or config.n_seq)
    except BaseException:
        model.close()
        raise
    return model, ctx


def context_for(model: NativeModel, config: EngineConfig, n_seq: int) -> NativeContext:
    """A context of `n_seq` sequences on `model`, otherwise as the configuration says."""
    return NativeContext(
        model,
        n_seq=n_seq,
        ctx_per_seq=config.n_ctx,
        n_batch=config.n_batch,
        n_ubatch=config.n_ubatch,
        threads_decode=config.threads_decode,
        threads_prefill=config.threads_prefill,
        flash_attention=config.flash_attention,
        op_offload=config.op_offload,
        kv_on_gpu=config.kv_on_gpu,
        kv_type=config.kv_type,
        n_outputs_max=config.n_outputs_max,
    )


# The host buffer llama.cpp computes from in the file's mapping, as its load log names it.
MAPPED_BUFFER = "CPU_Mapped"


def load_report_of(model: NativeModel, ctx: NativeContext) -> LoadReport:
    """What llama.cpp logged it allocated for this model and context, the mapped buffer counted by
    what stays resident: less the pages given back once their weights were copied out
    (native/mapped_weights.py), so every sum over the report (status, a device's bytes) sees it."""
    report = parse_load_log(model.load_log + ctx.load_log)
    if not model.released_mapped_bytes or MAPPED_BUFFER not in report.model_bytes:
        return report
    resident = max(0, report.model_bytes[MAPPED_BUFFER] - model.released_mapped_bytes)
    return replace(report, model_bytes={**report.model_bytes, MAPPED_BUFFER: resident})
