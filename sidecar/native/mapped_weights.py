"""Give back the pages of the model file that llama.cpp copied out at load and never reads again.

llama.cpp maps the GGUF file and computes with most weights where they lie in the mapping. Those
it copies out at load keep their pages resident in the mapping all the same (llama.cpp issue
16761, "memory usage increased when using repacking"): weights repacked into the CPU's interleaved
kernels (the CPU_REPACK buffer: Q4_0, Q4_K, IQ4_NL on AVX2 and AVX-512, more on Arm) and weights
uploaded to a GPU-type device. Measured on the 2-core Xeon, SmolLM2-135M in Q4_0: 160 MiB resident
once loaded (87 of the mapping, 73 anonymous, 57 of which the repacked copy), against 104 MiB loaded
without a mapping and 110 MiB for the Q4_1 file, which nothing repacks. A RAM budget counts the
weights once, so a repacked model ran over it by the repacked copy.

We madvise(MADV_DONTNEED) the whole pages inside the runs of copied-out tensors, the way llama.cpp's
own open fix does (pull request 24156): the mapping stays valid and a page touched again is read
back from the file, so a tensor taken for copied out by mistake costs a page fault, never a wrong
weight. Only Linux has /proc/self/maps to find the mapping by; elsewhere nothing is given back and
the repacked weights are held twice, as in llama.cpp.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sidecar.backend.load_report import parse_load_log
from sidecar.model_info.gguf_header import tensor_spans

MADV_DONTNEED = 4  # Linux's value (asm-generic/mman-common.h)
# A debug line of ggml's CPU backend, one per weight it repacks at load.
_REPACKED = re.compile(r"repack: repack tensor (?P<tensor>\S+) with")


@dataclass(frozen=True)
class FileMapping:
    """One mapped range of a file in this process: addresses [start, end) show the file from
    `offset` on."""

    start: int
    end: int
    offset: int


def file_mappings(path: Path) -> frozenset[FileMapping]:
    """The ranges of this process's memory that map `path` (none outside Linux)."""
    if not sys.platform.startswith("linux"):
        return frozenset()
    try:
        stat = os.stat(path)
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:
        return frozenset()
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}"
    found = set()
    for line in lines:
        # "7f3a...-7f3b... r--s 00000000 fd:01 1234567    /path/to/model.gguf": the file by its
        # device and inode, whatever path it was opened by.
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] == str(stat.st_ino) and (fields[3] == device or _names(fields[5], path)):
            low, high = fields[0].split("-")
            found.add(FileMapping(int(low, 16), int(high, 16), int(fields[2], 16)))
    return frozenset(found)


def _names(shown: str, path: Path) -> bool:
    """True when /proc/self/maps's path is `path` (an overlay filesystem shows another device)."""
    try:
        return os.path.samefile(shown.rstrip("\n"), path)
    except OSError:
        return False


def copied_out(load_log: list[str], names: list[str], n_layer: int) -> frozenset[str]:
    """The weights llama.cpp no longer reads from its mapping once loaded: those it repacked and
    those it placed on another device than the CPU."""
    repacked = {m["tensor"] for line in load_log if (m := _REPACKED.search(line))}
    report = parse_load_log(load_log)
    elsewhere = {name for name in names if report.tensor_device(name, n_layer) != "CPU"}
    return frozenset(repacked | elsewhere)


def release_copied_out(path: Path, before: frozenset[FileMapping], load_log: list[str], n_layer: int) -> int:
    """Drop from this process's memory the pages of `path` that hold only weights llama.cpp copied
    out (copied_out), in the mappings its load added (those not in `before`). Returns the bytes
    given back."""
    mappings = file_mappings(path) - before
    if not mappings:
        return 0
    spans = tensor_spans(path)
    gone = copied_out(load_log, list(spans), n_layer)
    if not gone:
        return 0
    return give_back(mappings, _runs(spans, gone))


def give_back(mappings: frozenset[FileMapping], runs: list[tuple[int, int]]) -> int:
    """madvise(MADV_DONTNEED) the whole pages of each file range in `runs` wherever `mappings`
    show it. Returns the bytes given back."""
    page = os.sysconf("SC_PAGE_SIZE")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    released = 0
    for first, last in runs:
        for m in mappings:
            low = max(first, m.offset)
            high = min(last, m.offset + (m.end - m.start))
            # Whole pages only: a page shared with a weight still read from the mapping stays.
            start = -(-(m.start + low - m.offset) // page) * page
            end = (m.start + high - m.offset) // page * page
            if end > start and libc.madvise(start, end - start, MADV_DONTNEED) == 0:
                released += end - start
    return released


def _runs(spans: dict[str, tuple[int, int]], gone: frozenset[str]) -> list[tuple[int, int]]:
    """File ranges [first, last) covering consecutive copied-out tensors, in file order; a run ends
    where a tensor still read from the mapping begins, so the padding between two copied-out
    tensors is given back with them."""
    runs: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for name, (offset, size) in sorted(spans.items(), key=lambda item: item[1][0]):
        if name in gone:
            current = (current[0], offset + size) if current else (offset, offset + size)
        elif current:
            runs.append(current)
            current = None
    if current:
        runs.append(current)
    return runs
