"""EngineStats: the figures the server's metrics read after each step (a frozen snapshot), and
StepTimings, the engine's record of its own steps (it also feeds the step cost model).

Counters are cumulative since start; gauges are the values at the snapshot. Histograms are
`Histogram` snapshots: per-bucket counts (the last bucket is +Inf) and the sum, which the
server turns into Prometheus histograms without importing anything here into prometheus.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from engine.kv_tiers.tier_stats import TierStats
from engine.scheduling.step_cost import StepCostModel
from engine.scheduling.step_plan import SchedulerOutput
from engine.speculative.counters import SpeculationStats

STEP_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFILL_TOKENS_BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Histogram:
    bounds: tuple[float, ...]  # upper bounds (inclusive); one more count for +Inf
    counts: tuple[int, ...]  # per bucket, not cumulative
    total: float  # sum of the observed values

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass
class _Counts:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.total)


class StepTimings:
    """Wall time of each engine step that ran a forward (schedule -> outputs), its prefill rows,
    and the cost model they teach. The first such step pays one-time costs (lazy kernel and
    allocator set-up), so it is recorded in the histograms but not taught to the model."""

    def __init__(self, cost_model: StepCostModel) -> None:
        self.cost_model = cost_model
        self._seconds = _Counts(STEP_SECONDS_BUCKETS)
        self._prefill = _Counts(PREFILL_TOKENS_BUCKETS)
        self._num_timed = 0

    def record(self, out: SchedulerOutput, seconds: float) -> None:
        self._seconds.observe(seconds)
        self._prefill.observe(out.num_prefill_tokens)
        if self._num_timed:
            self.cost_model.observe(out.num_batched_tokens, out.num_pairs, seconds)
        self._num_timed += 1

    def step_seconds(self) -> Histogram:
        return self._seconds.snapshot()

    def prefill_tokens(self) -> Histogram:
        return self._prefill.snapshot()


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # requests running
    num_waiting: int  # requests queued (incl. preempted)
    kv_blocks_used: int
    kv_blocks_total: int
    kv_block_size: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # prompt tokens found there
    num_preemptions: int
    # Whole prompts of requests the engine scheduled, counted once at their first step (prefix-
    # cache hits included, recompute after preemption not again; as vLLM). A request aborted
    # while still queued counts nothing.
    prompt_tokens_total: int
    generation_tokens_total: int  # tokens sampled
    num_steps: int
    # The scheduler's view (issue #12): step wall times, prefill rows per step, and the
    # prefill chunk the step-time target allows now (tokens from position 0 after the decodes).
    step_seconds: Histogram | None = None
    prefill_tokens_per_step: Histogram | None = None
    prefill_chunk_tokens: int = 0
    # How the steps run now (models/forward_path descriptions), and whether tgserve's C++ CPU
    # kernels serve them (False on PyTorch ops, e.g. while they build: engine/kernel_switch.py).
    forward_path: str = ""
    cpu_kernels_active: bool = False
    # Speculative decoding: proposals, proposed / accepted tokens, per position (None: off).
    speculation: SpeculationStats | None = None
    # Estimated bytes of the compiled grammars kept for reuse (engine/grammar/grammar_cache.py).
    grammar_cache_bytes: int = 0
    # The K/V tiers behind the pool: hits and bytes per tier (engine/kv_tiers; None: off).
    kv_tiers: TierStats | None = None

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
