"""llama.cpp threads for the engines and daemons a test starts, when it does not name its own.

scripts/pytest-parts runs the shared part a worker per core and sets XLM_TEST_THREADS to the
cores each worker has (cores / workers). Without it every worker's engine ran a thread per core:
on 2 cores, four threads where two fit, and ggml's threads spin at their barriers while the
thread they wait for is off its core. Measured on the 2-core EPYC, `pytest -n 2 --dist loadfile
tests/engine`: 147 s wall and 289 s of CPU with two threads each, 108 s and 211 s with one.

Unset (a run in one process, the tests that need the machine alone), tests keep a thread per
core, as before: THREADS is None and each caller keeps its own default.
"""

from __future__ import annotations

import os

THREADS: int | None = int(os.environ["XLM_TEST_THREADS"]) if os.environ.get("XLM_TEST_THREADS") else None
# What an engine a test pins to a thread count runs (engines.py's defaults).
PINNED: int = THREADS or 2
