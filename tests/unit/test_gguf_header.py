"""The fast GGUF header reader gives exactly what gguf-py's reader gives, in a fraction of the time
(the daemon reads the header in front of its first reply)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGUFReader

from sidecar.model_info import gguf_reader
from sidecar.model_info.gguf_header import read_header


@pytest.fixture(scope="module")
def models(smollm2_path, tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, "-m", "sidecar", "testmodels", "--out", str(out), "--which", "tiny_llama",
                    "--which", "tiny_qwen3moe", "--which", "siglip_projector"], check=True, capture_output=True)
    return [smollm2_path, *sorted(out.glob("*.gguf"))]


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
