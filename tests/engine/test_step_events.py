"""Step events, the engine's data for traces (no tracing library below the server): a chunked
prompt's `prefill_chunk` events tile the prompt (the chunk sizes the token budget allows, in
order, in time between arrival and the first token), and every preemption the engine counts
shows up once as `recompute_after_preemption`, followed by a prefill from position 0 (no
prefix cache: with one, the recompute starts where the cache's hit ends).
Oracles: the prompt's length, the budget given, the engine's own preemption counter."""

from __future__ import annotations

from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import random_prompts, run_staggered, tiny_engine


def _bytes_for_blocks(n: int) -> int:
    return n * 2 * 2 * 4 * 2 * 16 * 4  # tiny llama: 2 layers, 2 KV heads, head_dim 16, fp32


def test_a_chunked_prompts_prefill_events_tile_it_in_order(tmp_path):
    engine = tiny_engine(
        tmp_path, max_num_batched_tokens=32, target_itl_ms=None, enable_prefix_caching=False
    )
    (prompt,) = random_prompts(1, (100, 100), seed=1)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    (final,) = engine.generate([prompt], params)
    metrics = final.metrics
    chunks = [e for e in metrics.events if e.name == "prefill_chunk"]
    assert [e.start for e in chunks] == [0, 32, 64, 96]
    assert [e.tokens for e in chunks] == [32, 32, 32, 4]
    times = [e.time for e in chunks]
    assert metrics.arrival_time <= times[0] == metrics.first_scheduled_time
    assert times == sorted(times) and times[-1] <= metrics.first_token_time
    assert not [e for e in metrics.events if e.name != "prefill_chunk"]


def test_every_preemption_is_an_event_followed_by_a_prefill_from_the_start(tmp_path):
    prompts = random_prompts(12, (10, 30), seed=3)
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * 12
    small = tiny_engine(  # no prefix cache: a recompute starts at position 0
        tmp_path, kv_cache_memory_bytes=_bytes_for_blocks(39), enable_prefix_caching=False
    )
    outs = run_staggered(small, prompts, params, arrive_every=0)
    preemptions = 0
    for out in outs.values():
        events = out.metrics.events
        for i, event in enumerate(events):
            if event.name == "recompute_after_preemption":
                preemptions += 1
                assert events[i + 1].name == "prefill_chunk" and events[i + 1].start == 0
    assert preemptions == small.stats().num_preemptions >= 1
