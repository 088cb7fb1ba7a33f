"""`profile --show` tables: readable, and complete for GPU and busy entries."""

from __future__ import annotations

import re
from dataclasses import replace

from rich.console import Console

from sidecar.profiler.database import BandwidthEntry
from sidecar.profiler.show import render_profile
from test_profiler_database import make_db


def rendered(db) -> str:
    console = Console(record=True, width=220)
    render_profile(db, console)
    return console.export_text()


def test_show_lists_machine_bandwidths_and_kernels():
    text = rendered(make_db())
    assert "0123456789abcdef" in text and "NVIDIA GeForce RTX 4070" in text
    assert "dram_read" in text and "41.5" in text
    for column in ("b1", "b4", "b16", "b64", "b512", "GB/s@1"):
        assert column in text
    assert "attn_qkvo" in text and "large" in text
    assert not re.search(r"┃ cond +┃", text)  # only idle kernel entries: no condition column


def test_show_adds_condition_column_for_busy_figures():
    db = make_db()
    busy = replace(db.entries[0], condition="h2d_busy", device="cpu")
    gpu = replace(db.entries[1], device="cuda0")
    db = replace(
        db,
        entries=db.entries + (busy, gpu),
        bandwidths=db.bandwidths
        + (BandwidthEntry("h2d", "cuda0", "ggml_backend_tensor_set", "pinned", "cpu_busy", 2, 1 << 28, 12.5),),
    )
    text = rendered(db)
    assert re.search(r"┃ cond +┃", text) and "h2d_busy" in text and "cuda0" in text and "pinned" in text and "cpu_busy" in text
