"""Reading llama.cpp's load log back into a placement report."""

from sidecar.backend.load_report import parse_load_log
from sidecar.native.context import NativeContext
from sidecar.native.model import NativeModel

MIB = 1024 * 1024

SAMPLE = [
    "load_tensors: offloading 20 repeating layers to GPU\n",
    "load_tensors:        CUDA0 model buffer size =  1500.50 MiB\n",
    "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB\n",
    "tensor blk.3.ffn_up_exps.weight (288 MiB q4_K) buffer type overridden to CPU\n",
    "llama_context:  CUDA_Host  output buffer size =     0.58 MiB\n",
    "llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB\n",
    "llama_kv_cache: size =  256.00 MiB (  4096 cells,  30 layers,  4/4 seqs), K (q8_0):  128.00 MiB, V (q8_0):  128.00 MiB\n",
    "llama_context:      CUDA0 compute buffer size =   300.01 MiB\n",
    "llama_context:  CUDA_Host compute buffer size =    12.01 MiB\n",
]


def test_buffers_and_overrides_are_read_per_device() -> None:
    r = parse_load_log(SAMPLE)
    assert r.model_bytes == {"CUDA0": int(1500.5 * MIB), "CPU_Mapped": int(92.1 * MIB)}
    assert r.kv_bytes == {"CUDA0": 256 * MIB}
    assert r.overridden == {"blk.3.ffn_up_exps.weight": "CPU"}
    assert (r.kv_k_type, r.kv_v_type) == ("Q8_0", "Q8_0")
    # CUDA_Host is pinned host memory, not VRAM: only "CUDA0"-named buffers count as device bytes.
    assert r.device_bytes("CUDA0") == int(1500.5 * MIB) + 256 * MIB + int(300.01 * MIB)
    assert r.vram_bytes() == r.device_bytes("CUDA0")


def test_a_real_load_reports_the_override_it_was_given(smollm2_path) -> None:
    model = NativeModel(smollm2_path, tensor_overrides=((r"blk\.(0|1)\.ffn_(up|down)\.weight", "CPU"),))
    ctx = NativeContext(model, n_seq=1, ctx_per_seq=256, n_batch=64, n_ubatch=64, threads_decode=1, threads_prefill=1, flash_attention=None)
    try:
        report = parse_load_log(model.load_log + ctx.load_log)
    finally:
        ctx.close()
        model.close()
    assert set(report.overridden) == {f"blk.{i}.ffn_{w}.weight" for i in (0, 1) for w in ("up", "down")}
    assert sum(report.model_bytes.values()) > 80 * MIB
    assert report.kv_bytes and report.compute_bytes
    assert (report.kv_k_type, report.kv_v_type) == ("F16", "F16")
