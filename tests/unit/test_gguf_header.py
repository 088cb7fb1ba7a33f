"""The fast GGUF header reader gives exactly what gguf-py's reader gives, in a fraction of the time
(the daemon reads the header in front of its first reply)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gguf import GGUFReader

from sidecar.model_info import gguf_reader
from sidecar.model_info.gguf_header import read_header


@pytest.fixture(scope="module")
def models(smollm2_path, model_files, tmp_path_factory) -> list[Path]:
    from sidecar.testmodels.projector import write_siglip_projector

    tiny = model_files("tiny_llama", "tiny_qwen3moe")
    # A SigLIP-class projector's header at 2 layers: the full one (27) is the same keys and tensor
    # kinds in 850 MB, 10 s of the suite's time to write.
    siglip = write_siglip_projector(tmp_path_factory.mktemp("siglip") / "siglip2.gguf", n_layer=2, image_size=224)
    return [smollm2_path, *tiny.values(), siglip]


def test_the_fast_reader_matches_gguf_py(models) -> None:
    for path in models:
        reader = GGUFReader(path, "r")
        meta, tensors = read_header(path)
        assert meta == gguf_reader._fields(reader), path.name
        assert tensors == gguf_reader._tensors(reader), path.name


def test_the_fast_reader_is_fast_and_refuses_what_it_cannot_read(smollm2_path, tmp_path: Path) -> None:
    started = time.perf_counter()
    read_header(smollm2_path)
    assert time.perf_counter() - started < 0.5  # gguf-py takes seconds on SmolLM2's 49k-token vocabulary
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x01\x00\x00\x00" + b"\x00" * 32)  # version 1: left to gguf-py
    with pytest.raises(ValueError):
        read_header(bad)
