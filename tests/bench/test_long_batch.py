"""bench/long_batch.py (issue 46's acceptance shape: long prompts and a short request behind
them, each against its solo run), on a tiny Llama with a clock that counts engine steps, so
the latencies are step counts worked by hand: a 48-token prompt in chunks of 16 is 3 prefill
steps (the third gives the first token) and 2 decodes for 3 tokens, 5 steps; the 5-token short
one is 1 + 2 = 3 steps. Oracles for the rest: the two readings recomputed from the recorded
latencies, and every request's tokens in the batch equal to its solo tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.long_batch import LongBatchSpec, measure, prompts, render
from engine import EngineConfig
from tests.checkpoints import VOCAB
from tests.engine.engine_fixtures import tiny_engine

SPEC = LongBatchSpec(num_long=2, long_len=48, short_len=5, output_len=3, vocab=VOCAB)


def test_solo_and_batched_latencies_and_both_readings(tmp_path) -> None:
    engine = tiny_engine(
        tmp_path / "llama", max_num_batched_tokens=16, max_num_seqs=4, enable_prefix_caching=False
    )
    steps = [0]
    step = engine.step

    def counted():
        steps[0] += 1
        return step()

    engine.step = counted
    result = measure(engine, SPEC, clock=lambda: float(steps[0]))
    names = [r.name for r in result.requests]
    assert names == ["long 0", "long 1", "short"]
    assert [r.prompt_len for r in result.requests] == [48, 48, 5]
    assert [r.solo_s for r in result.requests] == [5.0, 5.0, 3.0]
    assert result.same_tokens
    batched = [r.batched_s for r in result.requests]
    # 96 + 5 prompt tokens at 16 a step need >= 7 steps before the last first token.
    assert result.batch_s == max(batched) >= 7
    assert result.worst_ratio == max(b / s for b, s in zip(batched, [5, 5, 3], strict=True))
    assert result.batch_ratio == result.batch_s / 13
    text = render(result)
    assert f"worst {result.worst_ratio:.2f}x" in text and f"{result.batch_ratio:.2f}x" in text
    assert "equal the solo tokens" in text


def test_an_engine_with_prefix_caching_is_refused() -> None:
    engine = SimpleNamespace(config=EngineConfig())  # prefix caching on by default
    with pytest.raises(ValueError, match="prefix caching"):
        measure(engine, SPEC)


def test_prompts_are_seeded_and_the_short_one_comes_last() -> None:
    first, again = prompts(SPEC), prompts(SPEC)
    assert first == again
    assert [len(p) for _, p in first] == [48, 48, 5] and first[-1][0] == "short"
    assert first[0][1] != first[1][1]
    assert all(100 <= t < VOCAB for _, p in first for t in p)
