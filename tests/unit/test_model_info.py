"""Model inspection: GGUF headers and Hugging Face configs give the same ModelInfo, grouped into
sub-layer units with per-token costs; KV-cache sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from sidecar.model_info.default_model import default_model_path
from sidecar.model_info import (
    ATTENTION,
    EMBEDDING,
    FFN,
    MOE_EXPERTS,
    MOE_ROUTER,
    MOE_SHARED,
    NORM,
    OUTPUT,
    GgufReadError,
    experts_touched,
    inspect_gguf,
    kv_bytes_per_token,
    kv_cache_bytes,
    model_from_hf_config,
    projector_from_hf_config,
    sub_layers,
)
from sidecar.model_info.ggml_types import bits_per_weight, tensor_bytes
from sidecar.model_info.kv import kv_cells
from support.hf_models import GEMMA3_4B

SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "vocab_size": 49152,
    "max_position_embeddings": 8192, "tie_word_embeddings": True,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def models(model_files) -> dict[str, Path]:
    return model_files()


@pytest.fixture(scope="module")
def smollm2():
    return inspect_gguf(default_model_path())


def test_smollm2_header(smollm2):
    m = smollm2
    assert (m.arch, m.n_layer, m.n_embd, m.n_ff, m.n_head, m.n_head_kv) == ("llama", 30, 576, 1536, 9, 3)
    assert (m.head_dim_k, m.n_vocab, m.n_ctx_train, m.file_type) == (64, 49152, 8192, "Q4_1")
    assert not m.is_moe and not m.has_output_tensor
    assert m.total_bytes == sum(t.n_bytes for t in m.tensors)
    # The file is header + tensor data (+ alignment), so the tensors are nearly all of it.
    assert 0.9 < m.total_bytes / default_model_path().stat().st_size <= 1.0


def test_every_tensor_lands_in_exactly_one_unit(smollm2):
    units = sub_layers(smollm2)
    named = [n for u in units for n in u.tensors if not (u.tied and n == "token_embd.weight")]
    assert sorted(named) == sorted(t.name for t in smollm2.tensors)
    kinds = [u.kind for u in units]
    assert kinds[0] == EMBEDDING and kinds[-1] == OUTPUT
    assert kinds.count(ATTENTION) == kinds.count(FFN) == 30


def test_tied_output_reuses_the_embedding(smollm2):
    output = sub_layers(smollm2)[-1]
    assert output.tied and "token_embd.weight" in output.tensors
    embd = smollm2.tensor("token_embd.weight")
    assert output.weight_bytes == embd.n_bytes + smollm2.tensor("output_norm.weight").n_bytes
    # One token's logits read the whole matrix; its embedding reads one row.
    assert output.flops(1) == 2 * 576 * 49152
    assert sub_layers(smollm2)[0].bytes_read(1) == pytest.approx(embd.n_bytes / 49152)


@pytest.mark.parametrize(
    "name, kinds_layer0",
    [
        ("tiny_llama", [ATTENTION, FFN]),
        ("tiny_llama_moe", [ATTENTION, NORM, MOE_ROUTER, MOE_EXPERTS]),
        ("tiny_qwen3moe", [ATTENTION, NORM, MOE_ROUTER, MOE_EXPERTS]),
    ],
)
def test_units_per_layer(models, name, kinds_layer0):
    m = inspect_gguf(models[name])
    assert [u.kind for u in sub_layers(m) if u.layer == 0] == kinds_layer0


def test_qwen3moe_attention_includes_qk_norms(models):
    m = inspect_gguf(models["tiny_qwen3moe"])
    attention = next(u for u in sub_layers(m) if u.kind == ATTENTION)
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.attn_norm.weight"} <= set(attention.tensors)
    assert (m.n_expert, m.n_expert_used, m.n_ff_expert) == (8, 2, 32)


def test_moe_expert_unit_costs(models):
    m = inspect_gguf(models["tiny_qwen3moe"])
    experts = next(u for u in sub_layers(m) if u.kind == MOE_EXPERTS)
    per_expert = experts.weight_bytes / 8
    assert experts.bytes_per_token == pytest.approx(2 * per_expert)
    assert experts.flops(1) == pytest.approx(2 * 3 * 64 * 32 * 2)
    assert experts.bytes_read(1) == pytest.approx(2 * per_expert)
    assert experts.bytes_read(1000) == pytest.approx(experts.weight_bytes, rel=1e-6)
    assert experts.tokens_per_expert(8) == pytest.approx(8 * 2 / experts_touched(8, 2, 8))


@pytest.mark.parametrize(
    "n_expert, used, tokens, expected",
    [(8, 2, 0, 0.0), (8, 2, 1, 2.0), (8, 8, 5, 8.0), (128, 8, 1, 8.0), (4, 2, 2, 4 * (1 - 0.25)),
     (128, 8, 512, 128 * (1 - (120 / 128) ** 512)), (0, 0, 10, 0.0)],
)
def test_experts_touched(n_expert, used, tokens, expected):
    assert experts_touched(n_expert, used, tokens) == pytest.approx(expected)


def test_projector_units(models):
    m = inspect_gguf(models["tiny_projector"])
    assert m.is_projector and m.vision.tokens_per_image == 64 and m.vision.output_tokens == 16
    units = sub_layers(m)
    assert [u.kind for u in units] == [EMBEDDING, ATTENTION, FFN, ATTENTION, FFN, OUTPUT]
    assert sorted(n for u in units for n in u.tensors) == sorted(t.name for t in m.tensors)


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(GgufReadError):
        inspect_gguf(bad)
    with pytest.raises(FileNotFoundError):
        inspect_gguf(tmp_path / "missing.gguf")


def _write_tiny_gemma3(path: Path, n_layer: int = 7) -> Path:
    w = GGUFWriter(str(path), "gemma3")
    e, ff, heads, kv_heads, hd, vocab = 64, 128, 4, 2, 16, 300
    w.add_context_length(8192)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_sliding_window(256)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))  # numpy order: (out, in)

    t("token_embd.weight", vocab, e)
    for i in range(n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", e)
        t(p + "attn_q.weight", heads * hd, e)
        t(p + "attn_k.weight", kv_heads * hd, e)
        t(p + "attn_v.weight", kv_heads * hd, e)
        t(p + "attn_output.weight", e, heads * hd)
        t(p + "attn_q_norm.weight", hd)
        t(p + "attn_k_norm.weight", hd)
        t(p + "post_attention_norm.weight", e)
        t(p + "ffn_norm.weight", e)
        t(p + "ffn_gate.weight", ff, e)
        t(p + "ffn_up.weight", ff, e)
        t(p + "ffn_down.weight", e, ff)
        t(p + "post_ffw_norm.weight", e)
    t("output_norm.weight", e)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma3_sliding_window_layers_and_cache(tmp_path):
    m = inspect_gguf(_write_tiny_gemma3(tmp_path / "gemma3.gguf"))
    assert m.arch == "gemma3" and m.sliding_window == 256
    # Every sixth layer attends globally; the others over the window.
    assert m.swa_layers == (0, 1, 2, 3, 4, 6)
    assert kv_cells(m, 5, 8192) == 8192 and kv_cells(m, 0, 8192, n_ubatch=512) == 768
    per_token = kv_bytes_per_token(m, 0)
    assert kv_cache_bytes(m, 8192, n_ubatch=512) == per_token * (8192 + 6 * 768)
    units = sub_layers(m)
    attention = next(u for u in units if u.kind == ATTENTION)
    ffn = next(u for u in units if u.kind == FFN)
    assert "blk.0.post_attention_norm.weight" in attention.tensors
    assert "blk.0.post_ffw_norm.weight" in ffn.tensors


@pytest.mark.parametrize(
    "kv_type, per_token",
    [("F16", 3 * 128 * 2), ("Q8_0", 3 * 128 * 34 / 32), ("Q4_0", 3 * 128 * 18 / 32), ("F32", 3 * 128 * 4)],
)
def test_kv_bytes_per_token(smollm2, kv_type, per_token):
    assert kv_bytes_per_token(smollm2, 0, kv_type) == pytest.approx(per_token)


def test_kv_cache_matches_llama_cpp(smollm2):
    # llama.cpp reports "CPU KV buffer size = 90.00 MiB" for SmolLM2 at n_ctx 4096.
    assert kv_cache_bytes(smollm2, 4096) == 90 * (1 << 20)
    assert kv_cache_bytes(smollm2, 4000) == kv_cache_bytes(smollm2, 4096)  # padded to 256 cells
    with pytest.raises(ValueError):
        kv_bytes_per_token(smollm2, 0, "Q3_K")


def test_hf_config_reproduces_the_real_smollm2_file(smollm2):
    synthesized = model_from_hf_config(SMOLLM2_CONFIG, "Q4_1")
    real = {t.name: t for t in smollm2.tensors}
    assert {t.name for t in synthesized.tensors} == set(real)
    for t in synthesized.tensors:
        assert (t.shape, t.ggml_type, t.n_bytes) == (real[t.name].shape, real[t.name].ggml_type, real[t.name].n_bytes)
    assert synthesized.total_bytes == smollm2.total_bytes


def test_hf_config_matches_the_tiny_qwen3moe_layout(models):
    gguf_model = inspect_gguf(models["tiny_qwen3moe"])
    config = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
              "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 269, "tie_word_embeddings": True}
    synthesized = model_from_hf_config(config, "F32")
    assert {(t.name, t.shape) for t in synthesized.tensors} == {(t.name, t.shape) for t in gguf_model.tensors}
    assert [u.kind for u in sub_layers(synthesized)] == [u.kind for u in sub_layers(gguf_model)]


@pytest.mark.parametrize(
    "weight_type, low_gb, high_gb",
    [("Q4_K_M", 18.0, 19.0), ("Q4_0", 16.5, 17.8), ("Q8_0", 31.0, 33.0), ("Q2_K", 10.0, 12.0), ("F16", 60.0, 62.0)],
)
def test_qwen3_30b_a3b_sizes_before_download(weight_type, low_gb, high_gb):
    # Published GGUF sizes: Q4_K_M 18.6 GB, Q8_0 32.5 GB, F16 61.1 GB.
    m = model_from_hf_config(QWEN3_30B_A3B, weight_type)
    assert low_gb < m.total_bytes / 1e9 < high_gb
    assert (m.n_expert, m.n_expert_used, m.n_ff_expert, m.n_layer) == (128, 8, 768, 48)
    experts = next(u for u in sub_layers(m) if u.kind == MOE_EXPERTS)
    # Active parameters per token: about 3B of 30B.
    active = sum(u.flops_per_token for u in sub_layers(m)) / 2
    assert 2.5e9 < active < 3.6e9
    assert experts.bytes_per_token == pytest.approx(experts.weight_bytes * 8 / 128)


def test_hf_config_shared_experts_and_mixtral():
    qwen2moe = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
                "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4,
                "vocab_size": 151936}
    m = model_from_hf_config(qwen2moe, "Q4_0")
    assert [u.kind for u in sub_layers(m) if u.layer == 0] == [ATTENTION, NORM, MOE_ROUTER, MOE_SHARED, MOE_EXPERTS]
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_key_value_heads": 8, "num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
               "vocab_size": 32000}
    m = model_from_hf_config(mixtral, "Q4_K_M")
    assert m.arch == "llama" and m.n_expert == 8 and m.n_ff_expert == 14336
    assert 25e9 < m.total_bytes < 30e9  # Mixtral-8x7B Q4_K_M is 26.4 GB


def test_gemma3_from_hf_config_text_and_vision():
    text = model_from_hf_config(GEMMA3_4B, "Q4_K_M", name="gemma-3-4b-it")
    assert text.arch == "gemma3" and text.n_layer == 34 and not text.has_output_tensor
    assert len(text.swa_layers) == 34 - 34 // 6 and 5 not in text.swa_layers
    assert 2.0e9 < text.total_bytes < 3.0e9  # gemma-3-4b-it Q4_K_M is 2.49 GB
    vision = projector_from_hf_config(GEMMA3_4B, "F16")
    assert vision.is_projector and vision.vision.tokens_per_image == 4096 and vision.vision.output_tokens == 256
    assert 0.8e9 < vision.total_bytes < 0.9e9  # mmproj-F16 is 851 MB
    with pytest.raises(ValueError):
        projector_from_hf_config(SMOLLM2_CONFIG)


@pytest.mark.parametrize("bad", ["Q9_X", "int4", ""])
def test_unknown_weight_type(bad):
    with pytest.raises(ValueError, match="weight type"):
        model_from_hf_config(SMOLLM2_CONFIG, bad)


def test_config_without_sizes():
    with pytest.raises(ValueError, match="hidden_size"):
        model_from_hf_config({"model_type": "llama", "num_hidden_layers": 2}, "Q4_0")


@pytest.mark.parametrize("type_name, n, expected", [("Q4_0", 64, 36), ("Q4_K", 256, 144), ("F16", 3, 6), ("Q8_0", 33, 68)])
def test_tensor_bytes(type_name, n, expected):
    assert tensor_bytes(type_name, n) == expected


def test_bits_per_weight():
    assert bits_per_weight("Q4_0") == 4.5 and bits_per_weight("F16") == 16 and bits_per_weight("Q6_K") == 6.5625


def test_hf_config_round_trips_through_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    from sidecar.planner.sources import load_model

    m = load_model(path, "Q4_K_M")
    assert m.is_moe and m.source == "hf_config:Q4_K_M"
