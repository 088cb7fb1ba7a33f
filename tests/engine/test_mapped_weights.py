"""Pages of the model file that llama.cpp copied out (repacked, or on a GPU) leave the process's
memory; those of the weights it still computes from stay (sidecar/native/mapped_weights.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sidecar.backend.load_report import parse_load_log
from sidecar.model_info.gguf_header import tensor_spans
from sidecar.native.mapped_weights import FileMapping, _runs, copied_out, file_mappings, give_back
from sidecar.native.model import NativeModel

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")


def test_runs_join_neighbours_and_stop_at_a_weight_still_read() -> None:
    spans = {"a": (0, 100), "b": (128, 100), "keep": (256, 64), "c": (320, 10), "d": (512, 32)}
    assert _runs(spans, frozenset({"a", "b", "c", "d"})) == [(0, 228), (320, 544)]
    assert _runs(spans, frozenset({"keep"})) == [(256, 320)]
    assert _runs(spans, frozenset()) == []


def test_repacked_weights_and_weights_on_a_gpu_are_copied_out() -> None:
    log = [
        "load_tensors: layer   0 assigned to device CPU, is_swa = 0\n",
        "load_tensors: layer   1 assigned to device RPC0, is_swa = 0\n",
        "load_tensors: layer   2 assigned to device CPU, is_swa = 0\n",
        "tensor blk.1.ffn_up.weight (1 MiB q4_0) buffer type overridden to CPU\n",
        "repack: repack tensor blk.0.attn_q.weight with q4_0_8x8\n",
    ]
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.1.attn_q.weight",
             "blk.1.ffn_up.weight", "blk.2.attn_q.weight", "output.weight"]
    # Layer 2 is the output layer (n_layer 2), on the CPU: output.weight stays in the mapping.
    assert copied_out(log, names, n_layer=2) == {"blk.0.attn_q.weight", "blk.1.attn_q.weight"}


@linux_only
def test_a_loaded_model_keeps_in_ram_only_the_mapped_pages_it_reads(smollm2_path: Path) -> None:
    before = file_mappings(smollm2_path)
    model = NativeModel(smollm2_path)
    try:
        mine = file_mappings(smollm2_path) - before
        assert mine, "llama.cpp maps the model file (its default load mode)"
        repacked = parse_load_log(model.load_log).model_bytes.get("CPU_REPACK", 0)
        mapped = sum(m.end - m.start for m in mine)
        resident = _resident_bytes(mine)
        if not repacked:
            # This CPU (or build) repacks nothing: every mapped weight is read, none given back.
            assert model.released_mapped_bytes == 0
            return
        spans = tensor_spans(smollm2_path)
        names = copied_out(model.load_log, list(spans), int(model.facts().layers))
        # The runs of copied-out tensors where the mapping still shows them (llama.cpp unmaps the
        # file's ends that no mapped weight lies in).
        runs = [(max(first, m.offset), min(last, m.offset + m.end - m.start))
                for first, last in _runs(spans, names) for m in mine]
        runs = [(first, last) for first, last in runs if last > first]
        run_bytes = sum(last - first for first, last in runs)
        # What was given back is those runs, less at most a page at each end of one (whole pages
        # only; a 64 KiB page loses more than a 4 KiB one, not a share).
        page = os.sysconf("SC_PAGE_SIZE")
        assert run_bytes - 2 * page * len(runs) <= model.released_mapped_bytes <= run_bytes
        assert resident <= mapped - model.released_mapped_bytes
    finally:
        model.close()


def _resident_bytes(mappings: frozenset[FileMapping]) -> int:
    """Rss of these mappings in this process, as /proc/self/smaps counts it."""
    starts = {m.start for m in mappings}
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            inside = int(head.split("-")[0], 16) in starts
        elif inside and head == "Rss:":
            total += int(line.split()[1]) * 1024
    return total


@linux_only
def test_given_back_pages_leave_memory_and_read_back_the_same(tmp_path: Path) -> None:
    import mmap

    page = mmap.PAGESIZE
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * (16 * page // 256))  # 16 pages
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        assert sum(view[i * page] for i in range(16)) >= 0  # fault every page in
        mine = file_mappings(path)
        assert len(mine) == 1 and _resident_bytes(mine) == 16 * page
        # Pages 2..5 whole, and a range that starts and ends inside pages 8 and 11: 9 and 10 go.
        released = give_back(mine, [(2 * page, 6 * page), (8 * page + 5, 11 * page + 5)])
        assert released == 6 * page
        assert _resident_bytes(mine) == 10 * page
        assert view[:] == path.read_bytes()  # a page touched again is the file's, as before
