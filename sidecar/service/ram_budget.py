"""A RAM budget set while the daemon runs (SetBudget.ram_size): the launch rule, again.

`--ram-budget` sizes the engine at launch (settings.sequences(), local/crowd.py): the weights, the
process, the prefix cache's and the evicted sessions' shares, and as many sequences as fit. A
budget the game sets later goes by the very same rule, so a daemon told "512M" at runtime holds
what one launched with `--ram-budget 512M` would; the engine takes the result between two passes
(reload.py, kv_demand.py) without reloading the model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sidecar.backend.engine_config import EngineConfig

if TYPE_CHECKING:
    from sidecar.settings import Settings


@dataclass(frozen=True)
class MemoryShares:
    """What a RAM budget gives each part (EngineConfig's MEMORY_FIELDS)."""

    ram_budget_bytes: int
    n_seq: int
    n_seq_start: int
    prefix_cache_bytes: int
    saved_sessions_bytes: int
    # Sequences the engine may ever hold under any RAM budget: the logits buffer is sized for it,
    # so a context made at any ceiling has a row for every sequence it decodes.
    most_sequences: int
    # The sequences the plan's VRAM was sized for (launch): with the KV in VRAM, a bigger RAM
    # budget must not grow the KV past what the VRAM budget was planned to hold.
    planned_sequences: int
    # The most memories NPC memory keeps under this budget (memory/footprint.py).
    memories_max: int = 20_000

    def apply(self, config: EngineConfig) -> EngineConfig:
        """`config` with these shares; everything else (placement, threads) as it is."""
        n = self.n_seq if kv_in_host_memory(config) else min(self.n_seq, self.planned_sequences)
        return replace(
            config,
            n_seq=n,
            n_seq_start=min(self.n_seq_start, n),
            prefix_cache_bytes=self.prefix_cache_bytes,
            saved_sessions_bytes=self.saved_sessions_bytes,
            # Under a budget the old context goes before a bigger one is made (kv_demand.py).
            grow_beside=not self.ram_budget_bytes,
            n_outputs_max=min(max(config.n_outputs_max, self.most_sequences), config.n_batch),
        )


def kv_in_host_memory(config: EngineConfig) -> bool:
    return not config.kv_on_gpu or (config.n_gpu_layers == 0 and not config.tensor_overrides)


class RamRule:
    """The launch settings, to size any RAM budget the way `--ram-budget` is sized."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._planned = settings.sequences()
        self._most = settings.model_copy(update={"ram_budget": None}).sequences()

    def shares(self, ram_budget_bytes: int) -> MemoryShares:
        """The shares of `ram_budget_bytes` (0: no budget); InvalidArgument, saying what the model
        needs, when it holds not even one conversation."""
        # A plain byte count ("123B") is what parse_size reads back exactly.
        s = self._settings.model_copy(update={"ram_budget": f"{ram_budget_bytes}B" if ram_budget_bytes else None})
        return MemoryShares(
            ram_budget_bytes=ram_budget_bytes,
            n_seq=s.sequences(budget_name="ram_size"),
            n_seq_start=s.start_sequences(),
            prefix_cache_bytes=s.prefix_cache_bytes,
            saved_sessions_bytes=s.saved_sessions_bytes,
            most_sequences=self._most,
            planned_sequences=self._planned,
            memories_max=s.memories_max,
        )
