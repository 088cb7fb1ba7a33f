"""Sizes as people write them ("512M", "3G", "3GiB", "2.5G", "0") and the game's budget.

A game developer types a VRAM budget on a command line or in a config file; they write it the way
GPU tools print it. We read K/M/G/T with or without "iB" as binary units, because VRAM is sold and
reported in binary units (an "8 GB" card has 8 GiB); "KB/MB/GB/TB" are read as decimal, because that
is what the SI prefixes mean and someone who writes them on purpose means them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sidecar.errors import InvalidArgument

_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")

ACCEPTED_SIZES = (
    "a size such as 512M, 3G, 3GiB, 2.5G, 1500MB or 0 (CPU only); "
    "K/M/G/T and KiB/MiB/GiB/TiB are binary (1G = 1024^3 bytes), KB/MB/GB/TB are decimal"
)

# Larger than any GPU for years to come: a typo like "3000T" should fail, not plan for it.
MAX_SIZE_BYTES = 2**50


def parse_size(text: str) -> int:
    """Return the number of bytes `text` names, or raise InvalidArgument saying what is accepted.

    A bare number is only accepted for 0: "3" is far more likely a missing unit than 3 bytes.
    """
    if not isinstance(text, str):
        raise InvalidArgument(f"budget must be text, got {type(text).__name__}; use {ACCEPTED_SIZES}")
    match = _SIZE.match(text)
    if not match:
        raise InvalidArgument(f"{text!r} is not a size; use {ACCEPTED_SIZES}")
    number = float(match["number"])
    unit = match["unit"].lower()
    if unit == "":
        if number == 0:
            return 0
        raise InvalidArgument(f"{text!r} has no unit; did you mean {match['number']}G? Use {ACCEPTED_SIZES}")
    if unit == "b":
        scale = 1
    elif unit in _DECIMAL:
        scale = _DECIMAL[unit]
    else:
        key = unit.removesuffix("ib") if unit.endswith("ib") else unit
        if key not in _BINARY:
            raise InvalidArgument(f"{text!r}: unknown unit {match['unit']!r}; use {ACCEPTED_SIZES}")
        scale = _BINARY[key]
    size = number * scale
    if not math.isfinite(size) or size > MAX_SIZE_BYTES:
        raise InvalidArgument(f"{text!r} is larger than any GPU ({format_size(MAX_SIZE_BYTES)} at most)")
    return int(round(size))


def format_size(n_bytes: int) -> str:
    """Render a byte count the way parse_size reads it back (binary units, short)."""
    if n_bytes == 0:
        return "0"
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.2f}{unit}".rstrip("0")
    return f"{n_bytes}B"


@dataclass(frozen=True)
class Budget:
    """What the game grants the daemon right now.

    vram_bytes: VRAM the model may occupy; 0 means CPU only.
    max_cpu_threads: most CPU threads one forward pass may use; 0 means no cap.
    """

    vram_bytes: int = 0
    max_cpu_threads: int = 0

    def __post_init__(self) -> None:
        if self.vram_bytes < 0 or self.vram_bytes > MAX_SIZE_BYTES:
            raise InvalidArgument(f"VRAM budget {self.vram_bytes} bytes is out of range")
        if self.max_cpu_threads < 0 or self.max_cpu_threads > 4096:
            raise InvalidArgument(f"CPU thread cap {self.max_cpu_threads} is out of range")

    def describe(self) -> str:
        threads = "no cap" if self.max_cpu_threads == 0 else str(self.max_cpu_threads)
        return f"VRAM {format_size(self.vram_bytes)}, CPU threads {threads}"
