"""Generated test models: deterministic bytes, and llama.cpp (via llama-cpp-python) loads,
decodes and encodes images with them."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import pytest
from gguf import GGUFReader
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from sidecar.testmodels import (
    CHATML_TEMPLATE,
    TINY_MODELS,
    byte_vocab,
    ensure_test_models,
    siglip_vision_shape,
    smollm2_source_path,
    tiny_vision_shape,
    write_smollm2_moe,
    write_smollm2_projector,
    write_tiny_llama,
    write_tiny_llama_moe,
    write_tiny_projector,
)
from sidecar.testmodels.cli import register

TEXT_MODELS = ("tiny_llama", "tiny_llama_moe", "tiny_qwen3moe")
N_GENERATE = 8


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fields(path: Path) -> dict:
    reader = GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """ggml-order shapes (ne0 first), as llama.cpp sees them."""
    return {t.name: tuple(int(d) for d in t.shape) for t in GGUFReader(path).tensors}


def load(path: Path) -> llama_cpp.Llama:
    # One thread: tiny models gain nothing from more, and a busy machine then cannot stall
    # a thread barrier on every token.
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    """Logits after the last evaluated token (Llama.scores only fills every row with logits_all)."""
    row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()


def greedy(llm: llama_cpp.Llama, tokens: list[int], n: int) -> list[int]:
    """n greedy tokens; Llama.generate does not stop at EOS, so the count is exact."""
    out = []
    for token in llm.generate(tokens, temp=0.0):
        out.append(token)
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return ensure_test_models(tmp_path_factory.mktemp("testmodels"))


# --- generation of the files ------------------------------------------------------------------


def test_all_tiny_models_are_written_in_seconds(tmp_path):
    start = time.perf_counter()
    paths = ensure_test_models(tmp_path)
    elapsed = time.perf_counter() - start
    assert set(paths) == set(TINY_MODELS)
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())
    print(f"writing the tiny models took {elapsed:.2f} s")
    # Well under a second here. The bound is generous because machines differ and are shared; it
    # is there to catch a writer gone quadratic (minutes), not to time this one.
    assert elapsed < 60.0, f"writing the tiny models took {elapsed:.2f} s"


def test_ensure_test_models_reuses_existing_files(tmp_path):
    first = ensure_test_models(tmp_path)
    stamps = {name: p.stat().st_mtime_ns for name, p in first.items()}
    second = ensure_test_models(tmp_path)
    assert second == first
    assert {name: p.stat().st_mtime_ns for name, p in second.items()} == stamps
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_same_arguments_give_identical_bytes(tmp_path, name):
    generator = TINY_MODELS[name]
    a = generator(tmp_path / "a.gguf")
    b = generator(tmp_path / "b.gguf")
    assert sha256(a) == sha256(b)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_seed_changes_the_weights(tmp_path, name):
    generator = TINY_MODELS[name]
    assert sha256(generator(tmp_path / "a.gguf", seed=1)) != sha256(generator(tmp_path / "b.gguf", seed=2))


def test_generators_return_the_path_they_were_given(tmp_path):
    target = tmp_path / "sub" / "model.gguf"
    assert write_tiny_llama(target) == target
    assert write_tiny_llama(str(target)) == target


# --- shapes and metadata ----------------------------------------------------------------------


def test_vocab_has_bytes_merges_and_chatml_controls():
    vocab = byte_vocab()
    assert vocab.size > 256 + 3
    assert len(set(vocab.tokens)) == vocab.size
    assert vocab.merges
    for left_right in vocab.merges:
        assert left_right.replace(" ", "") in vocab.tokens
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(vocab.tokens)


def test_tiny_llama_metadata(models):
    meta = fields(models["tiny_llama"])
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.chat_template"] == CHATML_TEMPLATE
    vocab = byte_vocab()
    assert meta["tokenizer.ggml.eos_token_id"] == vocab.token_id("<|im_end|>")
    assert meta["tokenizer.ggml.bos_token_id"] == vocab.token_id("<|endoftext|>")
    shapes = tensor_shapes(models["tiny_llama"])
    assert shapes["blk.0.ffn_up.weight"] == (64, 128)
    assert shapes["blk.0.ffn_down.weight"] == (128, 64)
    assert shapes["blk.0.attn_k.weight"] == (64, 32)  # 2 kv heads of 16


def test_llama_moe_has_mixtral_layout(models):
    meta = fields(models["tiny_llama_moe"])
    assert meta["llama.expert_count"] == 4
    assert meta["llama.expert_used_count"] == 2
    shapes = tensor_shapes(models["tiny_llama_moe"])
    assert shapes["blk.1.ffn_gate_inp.weight"] == (64, 4)
    assert shapes["blk.1.ffn_gate_exps.weight"] == (64, 128, 4)
    assert shapes["blk.1.ffn_up_exps.weight"] == (64, 128, 4)
    assert shapes["blk.1.ffn_down_exps.weight"] == (128, 64, 4)
    assert "blk.1.ffn_up.weight" not in shapes


def test_qwen3moe_layout(models):
    meta = fields(models["tiny_qwen3moe"])
    assert meta["general.architecture"] == "qwen3moe"
    assert meta["qwen3moe.expert_count"] == 8
    assert meta["qwen3moe.expert_used_count"] == 2
    assert meta["qwen3moe.expert_feed_forward_length"] == 32
    assert meta["qwen3moe.attention.key_length"] == 16
    shapes = tensor_shapes(models["tiny_qwen3moe"])
    assert shapes["blk.0.attn_q_norm.weight"] == (16,)
    assert shapes["blk.0.attn_k_norm.weight"] == (16,)
    assert shapes["blk.0.ffn_down_exps.weight"] == (32, 64, 8)


def test_f16_weights(tmp_path):
    path = write_tiny_llama(tmp_path / "f16.gguf", dtype="f16")
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == "F16"
    assert types["blk.0.attn_norm.weight"] == "F32"
    llm = load(path)
    assert len(greedy(llm, llm.tokenize(b"hi"), 4)) == 4


@pytest.mark.parametrize(
    "call",
    [
        lambda p: write_tiny_llama(p, n_ff=64),  # square FFN
        lambda p: write_tiny_llama(p, n_head=3),  # 64 not divisible by 3
        lambda p: write_tiny_llama(p, n_head_kv=3),
        lambda p: write_tiny_llama(p, dtype="q4_0"),
        lambda p: write_tiny_llama_moe(p, n_expert=2, n_expert_used=3),
        lambda p: write_tiny_projector(p, n_ff=32),  # vision n_ff == n_embd
        lambda p: write_tiny_projector(p, image_size=60),  # not a multiple of the patch
        lambda p: write_tiny_projector(p, scale_factor=3),  # 8 patches per side, not /3
    ],
)
def test_invalid_shapes_are_refused_before_writing(tmp_path, call):
    path = tmp_path / "bad.gguf"
    with pytest.raises(ValueError):
        call(path)
    assert not path.exists()
    assert not list(tmp_path.iterdir())


def test_projector_metadata(models):
    meta = fields(models["tiny_projector"])
    assert meta["general.architecture"] == "clip"
    assert meta["clip.projector_type"] == "gemma3"
    assert meta["clip.vision.projection_dim"] == 64
    shapes = tensor_shapes(models["tiny_projector"])
    # ggml order: first dimension is the text width mtmd checks against the LLM
    assert shapes["mm.input_projection.weight"] == (64, 32)
    assert shapes["v.patch_embd.weight"] == (8, 8, 3, 32)
    assert fields(models["smollm2_projector"])["clip.vision.projection_dim"] == 576


def test_siglip_class_shape_is_valid_and_400m_weights():
    shape = siglip_vision_shape()
    shape.validate()
    assert shape.n_image_tokens == 256
    assert 380e6 < shape.param_count() < 450e6
    # the tiny shape goes through the same plan
    assert tiny_vision_shape().n_image_tokens == 16


# --- llama.cpp loads and runs them ------------------------------------------------------------


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_model_loads_tokenizes_and_generates(models, name):
    llm = load(models[name])
    assert llm.n_vocab() == byte_vocab().size
    tokens = llm.tokenize(b"hello there, the world")
    assert 0 < len(tokens) < len(b"hello there, the world")  # merges applied
    assert llm.detokenize(tokens) == b"hello there, the world"
    llm.eval(tokens)
    logits = last_logits(llm)
    assert np.isfinite(logits).all() and logits.std() > 0
    llm.reset()
    out = greedy(llm, tokens, N_GENERATE)
    assert len(out) == N_GENERATE
    assert all(0 <= t < llm.n_vocab() for t in out)


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_greedy_generation_is_reproducible(models, name):
    runs = []
    for _ in range(2):
        llm = load(models[name])
        runs.append(greedy(llm, llm.tokenize(b"abc"), N_GENERATE))
    assert runs[0] == runs[1]


def test_chat_template_accepts_strings_and_content_parts(models):
    llm = load(models["tiny_llama"])
    template = llm.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="<|endoftext|>")
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}]},
    ]
    prompt = formatter(messages=messages).prompt
    assert prompt == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # control tokens are single tokens when special parsing is on
    tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    assert tokens.count(llm.token_eos()) == 2
    # Every end-of-generation token banned, not only EOS: llama.cpp ends a reply at <|endoftext|>
    # too, and what a random model emits is anyone's guess.
    from support.no_early_stop import grpc_bias, vocab_eog_ids

    eog = vocab_eog_ids(llm._model.vocab)
    assert llm.token_eos() in eog
    result = llm.create_chat_completion(messages, max_tokens=4, logit_bias=grpc_bias(eog))
    assert result["choices"][0]["finish_reason"] == "length"


def test_all_tiny_text_models_load_and_generate_within_seconds(models):
    start = time.perf_counter()
    for name in TEXT_MODELS:
        llm = load(models[name])
        assert len(greedy(llm, llm.tokenize(b"timing"), 16)) == 16
        llm.close()
    elapsed = time.perf_counter() - start
    print(f"loading and generating took {elapsed:.2f} s")
    # About a second here; generous for the same reason as above (a model that loads slowly by
    # design would take minutes on any machine).
    assert elapsed < 120.0, f"loading and generating took {elapsed:.2f} s"


# --- vision projector through mtmd ------------------------------------------------------------


def test_tiny_projector_initializes_and_encodes_an_image(models):
    llm = load(models["tiny_llama"])
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.print_timings = False
    ctx = mtmd.mtmd_init_from_file(str(models["tiny_projector"]).encode(), llm.model, params)
    assert ctx, "mtmd_init_from_file returned NULL"
    bitmap = chunks = None
    try:
        assert mtmd.mtmd_support_vision(ctx)
        # A non-square size exercises the resize to the projector's 64x64 input.
        nx, ny = 40, 24
        rgb = (ctypes.c_uint8 * (nx * ny * 3)).from_buffer(bytearray(range(256)) * (nx * ny * 3 // 256 + 1))
        bitmap = mtmd.mtmd_bitmap_init(nx, ny, rgb)
        assert bitmap
        chunks = mtmd.mtmd_input_chunks_init()
        prompt = b"look: " + mtmd.mtmd_default_marker() + b" done"
        text = mtmd.mtmd_input_text(text=prompt, text_len=len(prompt), add_special=False, parse_special=True)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        chunk_types = [
            mtmd.mtmd_input_chunk_get_type(mtmd.mtmd_input_chunks_get(chunks, i))
            for i in range(mtmd.mtmd_input_chunks_size(chunks))
        ]
        assert mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE in chunk_types
        image = mtmd.mtmd_input_chunks_get(chunks, chunk_types.index(mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE))
        assert mtmd.mtmd_input_chunk_get_n_tokens(image) == 16  # (64/8 / 2)^2

        new_n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(ctx, llm.ctx, chunks, 0, 0, 64, True, ctypes.byref(new_n_past))
        assert rc == 0
        assert new_n_past.value == mtmd.mtmd_helper_get_n_pos(chunks)
        logits = last_logits(llm)
        assert np.isfinite(logits).all()
    finally:
        if chunks:
            mtmd.mtmd_input_chunks_free(chunks)
        if bitmap:
            mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_free(ctx)


def test_projector_width_must_match_the_text_model(models):
    llm = load(models["tiny_llama"])
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    ctx = mtmd.mtmd_init_from_file(str(models["smollm2_projector"]).encode(), llm.model, params)
    assert not ctx, "a 576-wide projector must not attach to a 64-wide model"


# --- CLI ----------------------------------------------------------------------------------------


def test_cli_writes_selected_models(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["testmodels", "--out", str(tmp_path), "--which", "tiny_llama",
                              "--which", "tiny_projector"])
    assert args.run(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_llama.gguf", "tiny_projector.gguf"]
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "MB" in lines[0] and str(tmp_path) in lines[0]


def test_cli_defaults_to_the_tiny_models(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["testmodels", "--out", str(tmp_path)])
    assert args.run(args) == 0
    assert {p.stem for p in tmp_path.iterdir()} == set(TINY_MODELS)


# --- SmolLM2 as a mixture of experts (real text) ------------------------------------------------


def quantize(source: Path, target: Path, ftype: int) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    assert rc == 0
    return target


def logits_after_prompt_and_two_tokens(path: Path) -> tuple[np.ndarray, np.ndarray]:
    llm = load(path)
    llm.eval(llm.tokenize(b"hello there, the world"))
    first = last_logits(llm)
    llm.eval([100, 101])
    return first, last_logits(llm)


def test_expert_conversion_of_a_dense_model_matches_it(tmp_path):
    """The SmolLM2 converter works on any dense llama gguf; tiny ones make this fast."""
    dense_f32 = write_tiny_llama(tmp_path / "dense.gguf")
    # Grouped routing weights each of two identical experts exactly 1/2, so the mixture computes
    # the dense FFN. Equal to rounding, not bit for bit: the dense matmul (MUL_MAT) and the expert
    # one (MUL_MAT_ID) are different ops, and on some CPUs (repacked AVX-512 kernels) different
    # kernels. A wrong conversion (an expert from another layer, a bad router) is off by far more.
    dense_q4_1 = quantize(dense_f32, tmp_path / "dense_q4_1.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1)
    moe_q4_1 = write_smollm2_moe(tmp_path / "moe_q4_1.gguf", source=dense_q4_1)
    dense_logits = logits_after_prompt_and_two_tokens(dense_q4_1)
    moe_logits = logits_after_prompt_and_two_tokens(moe_q4_1)
    for d, m in zip(dense_logits, moe_logits, strict=True):
        np.testing.assert_allclose(d, m, atol=1e-4)
    # In f32 likewise.
    moe_f32 = write_smollm2_moe(tmp_path / "moe_f32.gguf", source=dense_f32)
    dense_logits = logits_after_prompt_and_two_tokens(dense_f32)
    moe_logits = logits_after_prompt_and_two_tokens(moe_f32)
    for d, m in zip(dense_logits, moe_logits, strict=True):
        np.testing.assert_allclose(d, m, atol=1e-4)


def test_router_styles(tmp_path):
    dense_path = write_tiny_llama(tmp_path / "dense.gguf")

    def router_rows(**kwargs):
        path = write_smollm2_moe(tmp_path / "moe.gguf", source=dense_path, n_expert=4, **kwargs)
        tensors = {t.name: t for t in GGUFReader(path).tensors}
        return np.array(tensors["blk.0.ffn_gate_inp.weight"].data)

    grouped = router_rows(n_expert_used=2)
    assert np.array_equal(grouped[0], grouped[1]) and np.array_equal(grouped[2], grouped[3])
    assert not np.array_equal(grouped[0], grouped[2])
    independent = router_rows(n_expert_used=2, router="independent")
    assert len({row.tobytes() for row in independent}) == 4
    with pytest.raises(ValueError):
        write_smollm2_moe(tmp_path / "bad.gguf", source=dense_path, n_expert=3, n_expert_used=2)
    with pytest.raises(ValueError):
        write_smollm2_moe(tmp_path / "bad.gguf", source=dense_path, router="learned")


def test_expert_conversion_refuses_a_model_without_dense_ffns(tmp_path):
    moe_path = write_tiny_llama_moe(tmp_path / "moe.gguf")
    with pytest.raises(ValueError):
        write_smollm2_moe(tmp_path / "again.gguf", source=moe_path)
    assert not (tmp_path / "again.gguf").exists()


@pytest.fixture(scope="module")
def smollm2_moe(tmp_path_factory) -> Iterator[Path]:
    try:
        smollm2_source_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    path = write_smollm2_moe(tmp_path_factory.mktemp("smollm2_moe") / "smollm2_moe.gguf")
    yield path
    path.unlink()  # 250 MB; pytest keeps the last few temporary directories


def chat_prompt(llm: llama_cpp.Llama) -> list[int]:
    text = "<|im_start|>user\nTell me a short story about a cat.<|im_end|>\n<|im_start|>assistant\n"
    return llm.tokenize(text.encode(), special=True)


@pytest.mark.slow
def test_smollm2_moe_layout(smollm2_moe):
    # Opening a SmolLM2-sized reader parses 100k vocabulary strings (~2 s): once per file.
    moe, dense = GGUFReader(smollm2_moe), GGUFReader(smollm2_source_path())
    assert moe.fields["llama.expert_count"].contents() == 4
    assert moe.fields["llama.expert_used_count"].contents() == 2
    dense_keys = {k for k in dense.fields if not k.startswith("GGUF.")}
    assert dense_keys <= set(moe.fields)
    for key in ("tokenizer.chat_template", "tokenizer.ggml.merges", "llama.block_count"):
        assert moe.fields[key].contents() == dense.fields[key].contents()
    tensors = {t.name: t for t in moe.tensors}
    dense_tensors = {t.name: t for t in dense.tensors}
    for kind in ("gate", "up", "down"):
        experts, ffn = tensors[f"blk.7.ffn_{kind}_exps.weight"], dense_tensors[f"blk.7.ffn_{kind}.weight"]
        assert experts.tensor_type == ffn.tensor_type  # still Q4_1: raw bytes were stacked
        assert tuple(experts.shape) == (*ffn.shape, 4)
        assert all(np.array_equal(experts.data[i], ffn.data) for i in range(4))
    assert tensors["blk.7.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert not any(n.endswith(("ffn_up.weight", "ffn_gate.weight", "ffn_down.weight")) for n in tensors)
    assert np.array_equal(tensors["token_embd.weight"].data, dense_tensors["token_embd.weight"].data)


@pytest.mark.slow
def test_smollm2_moe_says_what_the_dense_model_says(smollm2_moe):
    dense = load(smollm2_source_path())
    moe = load(smollm2_moe)
    prompt = chat_prompt(dense)
    assert chat_prompt(moe) == prompt
    moe_tokens = greedy(moe, prompt, 20)
    dense.close()
    # Grouped routing gives each picked expert weight exactly 1/2, so the mixture of identical
    # experts computes the dense FFN: the MoE's greedy reply is what the dense model says, within
    # rounding (MUL_MAT_ID is another op than MUL_MAT, so not always the same tokens).
    from support.greedy_agreement import CpuReference, assert_greedy_agrees

    with CpuReference(smollm2_source_path()) as reference:
        assert_greedy_agrees(reference, prompt, moe_tokens, "the MoE's reply under the dense model")


@pytest.mark.slow
def test_smollm2_moe_is_deterministic(tmp_path, smollm2_moe):
    again = write_smollm2_moe(tmp_path / "again.gguf")
    try:
        assert sha256(again) == sha256(smollm2_moe)
    finally:
        again.unlink()


def test_smollm2_projector_attaches_to_smollm2(tmp_path):
    try:
        source = smollm2_source_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    llm = load(source)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    projector = write_smollm2_projector(tmp_path / "p.gguf")
    ctx = mtmd.mtmd_init_from_file(str(projector).encode(), llm.model, params)
    assert ctx
    mtmd.mtmd_free(ctx)
