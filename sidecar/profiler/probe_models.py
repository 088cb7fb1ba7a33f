"""Probe models: llama-arch GGUF files whose layers have a target shape and random weights.

Each probe isolates one sub-layer kind. An `attn_qkvo` probe has the shape's attention and a
32-wide stand-in FFN; an `ffn` or `moe_experts` probe has the shape's FFN and a one-head,
32-wide stand-in attention; a `skeleton` probe has both stand-ins. Timing a probe and
subtracting the skeleton of the same depth and type leaves the cost of the sub-layer.

Files are built as one layer of F16 (seeded, so deterministic), quantized with llama.cpp's
own `llama_model_quantize`, and cached. A deep probe (many copies of that layer, so its
weights do not fit the CPU caches) is assembled from the cached one-layer file by copying
the quantized bytes, which is valid because quantization works row by row.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidecar.profiler.plan import FTYPE_BY_WEIGHT_TYPE, OP_ATTENTION, OP_FFN, OP_MOE, ProbeShape

SKELETON = "skeleton"
# Bump when what a probe file contains changes: cached files of other versions are ignored.
PROBE_FORMAT = 1
STANDIN_WIDTH = 32
N_VOCAB = 258  # 256 byte tokens, bos, eos
ATTENTION_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output")
FFN_TENSORS = ("ffn_gate", "ffn_up", "ffn_down")
MOE_TENSORS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def op_tensor_names(op: str) -> tuple[str, ...]:
    """Names (without the blk.N. prefix or .weight) of the tensors that make up `op`."""
    return {OP_ATTENTION: ATTENTION_TENSORS, OP_FFN: FFN_TENSORS, OP_MOE: MOE_TENSORS}[op]


@dataclass(frozen=True)
class LayerDims:
    """The dimensions actually written for one probe kind of one shape."""

    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_expert: int
    n_expert_used: int

    @classmethod
    def for_probe(cls, shape: ProbeShape, kind: str) -> LayerDims:
        """Target attention for attn probes, target FFN for ffn/moe probes, stand-ins elsewhere."""
        full_attention = kind == OP_ATTENTION
        full_ffn = kind in (OP_FFN, OP_MOE)
        return cls(
            n_embd=shape.n_embd,
            n_head=shape.n_head if full_attention else 1,
            n_head_kv=shape.n_head_kv if full_attention else 1,
            head_dim=shape.head_dim if full_attention else STANDIN_WIDTH,
            n_ff=shape.n_ff if full_ffn else STANDIN_WIDTH,
            n_expert=shape.n_expert if kind == OP_MOE else 0,
            n_expert_used=shape.n_expert_used if kind == OP_MOE else 0,
        )


def _seed(dims: LayerDims) -> int:
    return int.from_bytes(hashlib.sha256(repr(dims).encode()).digest()[:8], "little")


def _layer_arrays(dims: LayerDims) -> dict[str, np.ndarray]:
    # Numpy shapes are (out, in); gguf writes them reversed, as ggml's (ne0=in, ne1=out).
    rng = np.random.default_rng(_seed(dims))

    def weights(*shape: int) -> np.ndarray:
        # Small values keep activations finite through many identical layers.
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    e, q = dims.n_embd, dims.n_head * dims.head_dim
    kv = dims.n_head_kv * dims.head_dim
    arrays = {
        "attn_norm": np.ones(e, np.float32),
        "ffn_norm": np.ones(e, np.float32),
        "attn_q": weights(q, e),
        "attn_k": weights(kv, e),
        "attn_v": weights(kv, e),
        "attn_output": weights(e, q),
    }
    if dims.n_expert:
        n = dims.n_expert
        arrays["ffn_gate_inp"] = rng.standard_normal((n, e), dtype=np.float32)
        arrays["ffn_gate_exps"] = weights(n, dims.n_ff, e)
        arrays["ffn_up_exps"] = weights(n, dims.n_ff, e)
        arrays["ffn_down_exps"] = weights(n, e, dims.n_ff)
    else:
        arrays["ffn_gate"] = weights(dims.n_ff, e)
        arrays["ffn_up"] = weights(dims.n_ff, e)
        arrays["ffn_down"] = weights(e, dims.n_ff)
    return arrays


def _start_writer(path: Path, dims: LayerDims, depth: int, ftype: int):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_embedding_length(dims.n_embd)
    w.add_block_count(depth)
    w.add_feed_forward_length(dims.n_ff)
    w.add_head_count(dims.n_head)
    w.add_head_count_kv(dims.n_head_kv)
    w.add_key_length(dims.head_dim)
    w.add_value_length(dims.head_dim)
    w.add_rope_dimension_count(dims.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if dims.n_expert:
        w.add_expert_count(dims.n_expert)
        w.add_expert_used_count(dims.n_expert_used)
    # Token ids are fed directly; the vocabulary only has to load.
    w.add_tokenizer_model("gpt2")
    w.add_token_list([bytes([i]).decode("latin-1") for i in range(256)] + ["<s>", "</s>"])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    return w


def _finish_writer(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@contextlib.contextmanager
def _atomic_target(path: Path) -> Iterator[Path]:
    # A profile killed half-way must not leave a torn probe that later runs trust.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def write_f16_probe(path: Path, shape: ProbeShape, kind: str) -> Path:
    """Write the one-layer F16 probe of `kind` for `shape` (deterministic random weights)."""
    dims = LayerDims.for_probe(shape, kind)
    arrays = _layer_arrays(dims)
    rng = np.random.default_rng(_seed(dims) + 1)
    with _atomic_target(path) as tmp:
        w = _start_writer(tmp, dims, depth=1, ftype=FTYPE_BY_WEIGHT_TYPE["F16"])
        embd = (rng.standard_normal((N_VOCAB, dims.n_embd), dtype=np.float32) * 0.02)
        w.add_tensor("token_embd.weight", embd.astype(np.float16))
        w.add_tensor("output_norm.weight", np.ones(dims.n_embd, np.float32))
        for name, array in arrays.items():
            w.add_tensor(f"blk.0.{name}.weight", array)
        _finish_writer(w)
    return path


def quantize_probe(src: Path, dst: Path, weight_type: str, threads: int) -> Path:
    """Quantize every 2-D weight of `src` to exactly `weight_type` with llama.cpp."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPE_BY_WEIGHT_TYPE[weight_type]
    params.pure = True  # no per-tensor type mixing: the probe measures one type
    params.nthread = threads
    with _atomic_target(dst) as tmp:
        rc = llama_cpp.llama_model_quantize(
            str(src).encode(), str(tmp).encode(), ctypes.byref(params)
        )
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({weight_type}) failed with {rc}")
    return dst


def probe_cache_dir() -> Path:
    """Where one-layer probe files are cached (the user cache dir, per probe format)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("xlm-sidecar")) / "probes" / f"v{PROBE_FORMAT}"


def probe_name(shape: ProbeShape, kind: str, weight_type: str) -> str:
    """File name of a one-layer probe; the hash covers every dimension, not just the name."""
    digest = hashlib.sha256(repr((LayerDims.for_probe(shape, kind), PROBE_FORMAT)).encode())
    return f"{shape.name}-{kind}-{weight_type}-{digest.hexdigest()[:10]}.gguf"


def one_layer_probe(
    shape: ProbeShape, kind: str, weight_type: str, cache_dir: Path, threads: int
) -> Path:
    """The cached one-layer probe, built (F16 first, then quantized) if missing."""
    target = cache_dir / probe_name(shape, kind, weight_type)
    if target.exists():
        return target
    source = cache_dir / probe_name(shape, kind, "F16")
    if not source.exists():
        write_f16_probe(source, shape, kind)
    if weight_type == "F16":
        return source
    return quantize_probe(source, target, weight_type, threads)


def drop_f16_source(shape: ProbeShape, kind: str, cache_dir: Path) -> None:
    """Delete the cached F16 source of a probe whose F16 figures nobody asked for.

    Quantized probes are cached on their own, so the source (the largest file) is only
    needed again if a quantized one goes missing, and is then rebuilt.
    """
    with contextlib.suppress(FileNotFoundError):
        (cache_dir / probe_name(shape, kind, "F16")).unlink()


@dataclass(frozen=True)
class ProbeWeights:
    """What a one-layer probe file holds: the target tensors' bytes and their types."""

    op_bytes: int
    types: frozenset[str]


def probe_weights(path: Path, op: str) -> ProbeWeights:
    """Bytes and types of layer 0's tensors belonging to `op`, read from the file."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    wanted = {f"blk.0.{n}.weight" for n in op_tensor_names(op)}
    tensors = [t for t in reader.tensors if t.name in wanted]
    # The router stays F32 by llama.cpp's rule; it says nothing about the probe's type.
    types = {t.tensor_type.name for t in tensors if not t.name.endswith("gate_inp.weight")}
    return ProbeWeights(op_bytes=int(sum(t.n_bytes for t in tensors)), types=frozenset(types))


def deep_probe(one_layer: Path, shape: ProbeShape, kind: str, depth: int, out: Path) -> Path:
    """Write a `depth`-layer copy of a one-layer probe to `out` (quantized bytes reused)."""
    import gguf

    if depth == 1:
        return one_layer
    reader = gguf.GGUFReader(str(one_layer))
    ftype_field = reader.fields["general.file_type"]
    ftype = int(ftype_field.parts[ftype_field.data[0]][0])
    dims = LayerDims.for_probe(shape, kind)
    with _atomic_target(out) as tmp:
        w = _start_writer(tmp, dims, depth=depth, ftype=ftype)
        layer = [t for t in reader.tensors if t.name.startswith("blk.0.")]
        for t in reader.tensors:
            if not t.name.startswith("blk."):
                w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        for i in range(depth):
            for t in layer:
                name = f"blk.{i}." + t.name[len("blk.0."):]
                w.add_tensor(name, t.data, raw_dtype=t.tensor_type)
        _finish_writer(w)
    return out
