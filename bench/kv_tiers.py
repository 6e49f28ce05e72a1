"""`tgserve bench kv-tiers`: the time to first token of a long conversation re-sent after the KV
pool evicted it: served from the RAM tier, from the disk tier after a restart, and cold.

Contract: `run_kv_tier_bench(spec) -> KvTierResult`, in this process, through the engine's front
door. One engine with the tiers on (`ram_bytes`, a temporary disk directory) and a pool of
`pool_tokens`: after the warm-up, the conversation (`conversation_len` seeded random prompt
ids, max_tokens 1, greedy) is sent once (its cold prefill: the "cold" TTFT), then fillers of
`pool_tokens` tokens take the whole pool (so the conversation's blocks leave it for the tiers),
then it is re-sent ("ram": its blocks are copied back from the RAM tier). The engine is closed
(its disk writes land) and a new one is built on the same directory (a restart: empty pool and
RAM tier) and the conversation is sent again ("disk": its files are read and checked, staged in
RAM and copied in). Each of the `runs` repeats uses a fresh conversation and directory; the
medians are reported with the ratios to cold, the tier hits that prove which path served each
answer, and whether the first token was the cold run's (it must be). The issue's targets: ram
<= 0.25x cold, disk <= 0.4x cold.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class KvTierSpec:
    model: str | None = None  # None: the default model
    conversation_len: int = 3000
    pool_tokens: int = 4096
    ram_bytes: int = 1 << 30
    runs: int = 3
    seed: int = 0
    vocab: int = 1000  # prompt ids are drawn from [100, vocab)


@dataclass(frozen=True)
class KvTierResult:
    cold_s: float  # medians over the runs
    ram_s: float
    disk_s: float
    ram_ratio: float
    disk_ratio: float
    ram_hit_blocks: int  # of the last run: blocks the tiers served
    disk_hit_blocks: int
    same_first_token: bool  # every run: ram and disk answers equal the cold one
    runs: int


def add_kv_tier_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF folder or .gguf (default: the default model)")
    p.add_argument("--conversation-len", type=int, default=3000, help="prompt tokens re-sent")
    p.add_argument("--pool-tokens", type=int, default=4096, help="the KV pool's size in tokens")
    p.add_argument("--ram-bytes", type=int, default=1 << 30, help="the RAM tier's bound")
    p.add_argument("--runs", type=int, default=3, help="repeats (medians reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def _engine(spec: KvTierSpec, directory: str, kv_bytes: int | None):
    from engine import Engine, EngineConfig, KVTierConfig, warm_up

    tiers = KVTierConfig(ram_bytes=spec.ram_bytes, disk_dir=directory)
    config = EngineConfig(
        kv_cache_memory_bytes=kv_bytes, kv_tiers=tiers, max_model_len=spec.pool_tokens
    )
    engine = Engine.from_model(spec.model, config)
    warm_up(engine)
    return engine


def _ttft(engine, prompt: list[int]) -> tuple[float, int]:
    from engine import SamplingParams

    start = time.perf_counter()
    out = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))[0]
    return time.perf_counter() - start, out.outputs[0].token_ids[0]


def run_kv_tier_bench(spec: KvTierSpec) -> KvTierResult:
    from engine import SamplingParams

    rng = random.Random(spec.seed)
    cold, ram, disk, same = [], [], [], True
    per_token = None
    hits = (0, 0)
    for _ in range(spec.runs):
        vocab = spec.vocab
        conversation = [rng.randrange(100, vocab) for _ in range(spec.conversation_len)]
        fillers = [
            [rng.randrange(100, vocab) for _ in range(spec.pool_tokens // 2 - 8)] for _ in range(2)
        ]
        with tempfile.TemporaryDirectory(prefix="tgserve-kv-tiers-") as directory:
            if per_token is None:  # the pool's bytes per token, from a first engine
                probe = _engine(spec, directory, 64 << 20)
                per_token = probe.describe().kv_bytes_per_token
                probe.close()
                del probe
            kv_bytes = per_token * spec.pool_tokens
            engine = _engine(spec, directory, kv_bytes)
            t_cold, first = _ttft(engine, conversation)
            engine.generate(fillers, SamplingParams(max_tokens=1, temperature=0.0))
            before = engine.stats().kv_tiers.ram_hits
            t_ram, ram_first = _ttft(engine, conversation)
            ram_hits = engine.stats().kv_tiers.ram_hits - before
            engine.close()  # the disk writes land
            del engine
            restarted = _engine(spec, directory, kv_bytes)
            before = restarted.stats().kv_tiers.disk_hits  # the warm-up's own prompts
            t_disk, disk_first = _ttft(restarted, conversation)
            hits = (ram_hits, restarted.stats().kv_tiers.disk_hits - before)
            restarted.close()
            del restarted
        cold.append(t_cold)
        ram.append(t_ram)
        disk.append(t_disk)
        same = same and first == ram_first == disk_first
    c, r, d = (statistics.median(x) for x in (cold, ram, disk))
    return KvTierResult(c, r, d, r / c, d / c, hits[0], hits[1], same, spec.runs)


def run(args: argparse.Namespace) -> int:
    spec = KvTierSpec(
        args.model, args.conversation_len, args.pool_tokens, args.ram_bytes, args.runs, args.seed
    )
    result = run_kv_tier_bench(spec)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(f"TTFT of a {spec.conversation_len}-token prompt re-sent (median of {spec.runs}):")
        print(f"  cold prefill      {result.cold_s * 1000:9.1f} ms")
        print(
            f"  RAM tier          {result.ram_s * 1000:9.1f} ms  {result.ram_ratio:.3f}x  "
            f"({result.ram_hit_blocks} blocks hit)"
        )
        print(
            f"  disk tier (restart){result.disk_s * 1000:8.1f} ms  {result.disk_ratio:.3f}x  "
            f"({result.disk_hit_blocks} blocks read)"
        )
        print(f"  first token equal to the cold run's: {result.same_first_token}")
    return 0 if result.same_first_token else 1
