"""What a profile measures: probe shapes, weight types, batch sizes, thread counts.

A plan is pure data. The runner walks it; tests hand in a tiny one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Sub-layer kinds the planner places separately (method.md, "Plan").
OP_ATTENTION = "attn_qkvo"
OP_FFN = "ffn"
OP_MOE = "moe_experts"
# Measured costs that are not a weight's matrix product, kept so estimates can add them back.
OP_LAYER_OVERHEAD = "layer_overhead"
OP_GRAPH_OVERHEAD = "graph_overhead"

# llama.cpp's llama_ftype values for the "mostly X" file types; with `pure` set every
# 2-D weight gets exactly that type, so a probe measures one type only.
FTYPE_BY_WEIGHT_TYPE: dict[str, int] = {
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q2_K": 10,
    "Q4_K": 14,  # Q4_K_S: pure Q4_K
    "Q5_K": 16,  # Q5_K_S: pure Q5_K
    "Q6_K": 18,
}

# Bits per weight of each type's block layout, for sizing probes and estimating bytes read.
BITS_PER_WEIGHT: dict[str, float] = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.5625,
    "Q5_K": 5.5,
    "Q5_1": 6.0,
    "Q5_0": 5.5,
    "Q4_1": 5.0,
    "Q4_K": 4.5,
    "Q4_0": 4.5,
    "Q3_K": 3.4375,
    "Q2_K": 2.625,
}


@dataclass(frozen=True)
class ProbeShape:
    """The dimensions of one model family's layer, as a probe model reproduces them.

    For a mixture-of-experts shape `n_ff` is each expert's width and `n_expert` /
    `n_expert_used` are non-zero.
    """

    name: str
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int = 0
    n_expert_used: int = 0

    @property
    def attention_params(self) -> int:
        """Parameters of the Q, K, V and output projections of one layer."""
        q_and_o = 2 * self.n_embd * self.n_head * self.head_dim
        k_and_v = 2 * self.n_embd * self.n_head_kv * self.head_dim
        return q_and_o + k_and_v

    @property
    def ffn_params(self) -> int:
        """Parameters of gate, up and down of one layer (all experts for MoE)."""
        return 3 * self.n_embd * self.n_ff * max(1, self.n_expert)

    def op_params(self, op: str) -> int:
        """Parameters of the weights that sub-layer `op` multiplies with."""
        if op == OP_ATTENTION:
            return self.attention_params
        if op in (OP_FFN, OP_MOE):
            return self.ffn_params
        raise ValueError(f"unknown op {op!r}")

    def op_rows_cols(self, op: str) -> tuple[int, int]:
        """Nominal (rows, cols) of the op's characteristic matrix: (out, in) as ggml multiplies."""
        if op == OP_ATTENTION:
            return (self.n_head * self.head_dim, self.n_embd)
        return (self.n_ff, self.n_embd)

    def active_params(self, op: str, batch: int) -> float:
        """Parameters actually read for `batch` tokens.

        Dense ops read everything. A routed MoE reads only the experts some token chose;
        with a uniform router that is n_expert * (1 - (1 - k/n)^batch) experts on average.
        """
        if op != OP_MOE:
            return float(self.op_params(op))
        n, k = self.n_expert, self.n_expert_used
        touched = n * (1.0 - (1.0 - k / n) ** batch)
        return 3.0 * self.n_embd * self.n_ff * touched

    def flops(self, op: str, batch: int) -> float:
        """Multiply-add FLOPs of the op's matrix products for `batch` tokens (2 per weight used)."""
        if op == OP_MOE:
            return 2.0 * batch * 3 * self.n_embd * self.n_ff * self.n_expert_used
        return 2.0 * batch * self.op_params(op)


# A 0.6B-class layer (Qwen3-0.6B widths with 64-wide heads) and a 3B-class one
# (Llama-3.2-3B). An 8B-class layer (4096 x 14336) would more than double a full profile's
# time on a small machine for little news: at these widths the kernels' throughput has
# stopped depending on the width. Widths are multiples of 256 so K-quants apply without
# fallbacks.
# A 100M-class layer (SmolLM2-135M: 576 x 1536, rounded to 512 for K-quants): at these
# sizes matrices are too small to spread over threads or stream at full rate, and the
# larger shapes over-predict such models by a third.
XSMALL = ProbeShape("xsmall", n_embd=512, n_ff=1536, n_head=8, n_head_kv=2, head_dim=64)
SMALL = ProbeShape("small", n_embd=1024, n_ff=3072, n_head=16, n_head_kv=8, head_dim=64)
LARGE = ProbeShape("large", n_embd=3072, n_ff=8192, n_head=24, n_head_kv=8, head_dim=128)
# A Qwen3-30B-A3B-like expert block (2048 wide, experts 768 wide) with 16 experts, 2 used,
# instead of 128 and 8: a quarter of the probe size, and each expert still sees a small
# share (1/8 instead of 1/16) of a batch's tokens.
MOE = ProbeShape(
    "moe", n_embd=2048, n_ff=768, n_head=32, n_head_kv=4, head_dim=128, n_expert=16, n_expert_used=2
)
# For tests: seconds to build and time.
TINY = ProbeShape("tiny", n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64)

DENSE_TYPES = ("F16", "Q8_0", "Q6_K", "Q4_K", "Q4_1", "Q4_0", "Q2_K")
MOE_TYPES = ("Q4_0", "Q4_K", "Q2_K")
BATCHES = (1, 4, 16, 64, 512)
GPU_BATCHES = (1, 64, 512)


@dataclass(frozen=True)
class ProbeFamily:
    """One shape measured for some ops, each in some weight types."""

    shape: ProbeShape
    ops: tuple[str, ...]
    weight_types: tuple[str, ...]


@dataclass(frozen=True)
class ProfilePlan:
    """Everything one profile run measures.

    `threads` empty means "derive from the machine" (see `thread_counts`). Batches up to
    `deep_max_batch` run on a probe deep enough that its weights do not fit the CPU caches,
    so small-batch figures are DRAM-bound like a real model's; larger batches run on a
    one-layer probe because they are compute-bound and a deep one would cost minutes.
    """

    mode: str
    families: tuple[ProbeFamily, ...]
    batches: tuple[int, ...] = BATCHES
    gpu_batches: tuple[int, ...] = GPU_BATCHES
    threads: tuple[int, ...] = ()
    deep_max_batch: int = 16
    deep_target_bytes: int = 64 << 20
    max_depth: int = 48
    # Seconds of repeated runs per (batch, threads) point; repeats stop at whichever of
    # these limits is hit first, and the median is kept.
    seconds_per_point: float = 0.25
    min_repeats: int = 3
    max_repeats: int = 15
    memcpy_bytes: int = 256 << 20
    measure_gpu: bool = True
    measure_busy: bool = True


def thread_counts(logical: int, physical: int | None, quick: bool) -> tuple[int, ...]:
    """Thread counts worth measuring on a machine: 1, powers of two, physical and logical cores.

    A quick profile keeps only 1, the physical count and the logical count.
    """
    logical = max(1, logical)
    counts = {1, logical}
    if physical:
        counts.add(min(physical, logical))
    if not quick:
        t = 2
        while t < logical:
            counts.add(t)
            t *= 2
    return tuple(sorted(counts))


FULL_PLAN = ProfilePlan(
    mode="full",
    families=(
        ProbeFamily(XSMALL, (OP_ATTENTION, OP_FFN), DENSE_TYPES),
        ProbeFamily(SMALL, (OP_ATTENTION, OP_FFN), DENSE_TYPES),
        ProbeFamily(LARGE, (OP_ATTENTION, OP_FFN), DENSE_TYPES),
        ProbeFamily(MOE, (OP_MOE,), MOE_TYPES),
    ),
)

# Under 30 s on a 2-core machine: both small shapes, fewer repeats, and on the 100M-class
# shape only the types such small models ship in.
QUICK_PLAN = ProfilePlan(
    mode="quick",
    families=(
        ProbeFamily(XSMALL, (OP_ATTENTION, OP_FFN), ("F16", "Q8_0", "Q4_1", "Q4_0", "Q4_K")),
        ProbeFamily(SMALL, (OP_ATTENTION, OP_FFN), DENSE_TYPES),
    ),
    seconds_per_point=0.05,
    min_repeats=2,
    max_repeats=7,
    memcpy_bytes=64 << 20,
    measure_busy=False,
)


def tiny_plan(**overrides) -> ProfilePlan:
    """A plan that finishes in seconds, for tests: one tiny shape, two types."""
    base = ProfilePlan(
        mode="quick",
        families=(ProbeFamily(TINY, (OP_ATTENTION, OP_FFN), ("F16", "Q4_0")),),
        batches=(1, 16, 64),
        deep_target_bytes=4 << 20,
        max_depth=8,
        seconds_per_point=0.02,
        min_repeats=2,
        max_repeats=5,
        memcpy_bytes=8 << 20,
        measure_busy=False,
    )
    return replace(base, **overrides)


__all__ = [
    "BATCHES",
    "BITS_PER_WEIGHT",
    "DENSE_TYPES",
    "FTYPE_BY_WEIGHT_TYPE",
    "FULL_PLAN",
    "LARGE",
    "MOE",
    "MOE_TYPES",
    "OP_ATTENTION",
    "OP_FFN",
    "OP_GRAPH_OVERHEAD",
    "OP_LAYER_OVERHEAD",
    "OP_MOE",
    "QUICK_PLAN",
    "SMALL",
    "TINY",
    "XSMALL",
    "ProbeFamily",
    "ProbeShape",
    "ProfilePlan",
    "thread_counts",
    "tiny_plan",
]
