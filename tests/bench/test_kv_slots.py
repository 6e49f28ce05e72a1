"""`bench.kv_usage.kv_slots`: each live sequence's allocated and cached KV slots, read from its block
table (what `tgserve bench` reports as allocation waste), and nothing for unknown or finished
requests."""

from __future__ import annotations

from bench.kv_usage import kv_slots
from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import tiny_engine


def test_kv_slots_are_whole_blocks_allocated_and_computed_tokens_cached(tmp_path) -> None:
    engine = tiny_engine(tmp_path / "tiny")  # block_size 4
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("a", list(range(3, 13)), params)  # 10 prompt tokens
    engine.add_request("b", list(range(3, 7)), SamplingParams(n=2, max_tokens=3, seed=1))
    assert kv_slots(engine, "a") == []  # queued: no blocks yet
    engine.step()  # both prefilled
    assert kv_slots(engine, "a") == [(12, 10)]  # 3 blocks hold 10 cached tokens
    engine.step()  # one decode each: "b" has forked into 2 sequences
    assert kv_slots(engine, "a") == [(12, 11)]
    assert kv_slots(engine, "b") == [(8, 5), (8, 5)]  # full prompt block shared, a block each
    while engine.has_unfinished_requests():
        engine.step()
    assert kv_slots(engine, "a") == [] and kv_slots(engine, "b") == []
    assert kv_slots(engine, "unknown") == []
