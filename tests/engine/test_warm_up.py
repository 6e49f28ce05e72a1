"""The warm-up an engine runs before its first request (engine/warm_up.py): after it, a long
first prompt is prefilled in one step, as every later one is (a one-token warm-up left the
step-cost model's trust region at one row, and the first long prompt was cut into chunks of
4, 8, 16, ... tokens, until a lone prompt got the whole budget); and the warm-up changes no
request's answer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.api import EngineInfo
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.warm_up import (
    CPU_WARM_UP_PROMPT_TOKENS,
    WARM_UP_PROMPT_TOKENS,
    warm_up,
    warm_up_requests,
)
from tests.checkpoints import VOCAB, save_checkpoint
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered, tiny_engine


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("warm-up-llama")
    return save_checkpoint("llama", path, max_position_embeddings=2048)


def _engine(folder: Path) -> Engine:
    engine = tiny_engine(folder, max_model_len=1200, kv_cache_memory_bytes=8_000_000)
    steps: list[tuple[int, ...]] = []  # the chunk sizes of every step
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        steps.append(tuple(c.num_new_tokens for c in out.chunks))
        return out

    engine.scheduler.schedule = recording_schedule
    engine.recorded_steps = steps
    return engine


def _prefill_chunks(engine: Engine, prompt: list[int]) -> list[int]:
    """The chunk sizes a lone streamed greedy request's prompt was computed in, after a short
    chat-like request decoded enough steps for the cost model to be fitted (`ready`)."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, streamed=True)
    run_staggered(engine, [[3, 4, 5, 6]], [params])
    assert engine.scheduler.cost_model.ready
    engine.recorded_steps.clear()
    run_staggered(engine, [prompt], [params])
    return [sizes[0] for sizes in engine.recorded_steps if sizes and sizes[0] > 1]


def _long_prompt(engine: Engine, seed: int) -> list[int]:
    """More tokens than the warm-up's prompts, fewer than twice them (its trust region)."""
    warm = len(warm_up_requests(engine.info)[0][1])
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(2 * warm - 8)]


def test_after_the_warm_up_a_long_first_prompt_is_one_step(folder):
    engine = _engine(folder)
    warm_up(engine)
    assert not engine.has_unfinished_requests()
    prompt = _long_prompt(engine, 1)
    assert _prefill_chunks(engine, prompt) == [len(prompt)]
    assert_no_leaks(engine)


def test_after_a_one_token_warm_up_a_lone_long_prompt_is_one_step_too(folder):
    """A one-token warm-up leaves the cost model's trust region at one row, which once cut the
    first long prompt into chunks of 4, 8, 16, ... tokens; a prompt with nothing else to serve
    now gets the whole token budget whatever the model says (prefill_allotment.py). The warm-up's
    long prompts still fit the model for a prompt that arrives beside decoding streams."""
    engine = _engine(folder)
    run_staggered(engine, [[1]], [SamplingParams(max_tokens=1, temperature=0.0)])
    prompt = _long_prompt(engine, 1)
    assert _prefill_chunks(engine, prompt) == [len(prompt)]
    assert_no_leaks(engine)


def test_the_warm_up_changes_no_answer(folder):
    """Greedy tokens and logprobs after the warm-up equal a fresh engine's, for a prompt that
    starts with the warm-up's own (its K/V come from the prefix cache) and for others."""
    first_warm_up_prompt = warm_up_requests(_engine(folder).info)[0][1]
    prompts = [first_warm_up_prompt[:40] + [5, 6, 7], _long_prompt(_engine(folder), 2), [9, 10]]
    params = [SamplingParams(max_tokens=6, temperature=0.0, logprobs=2)] * len(prompts)
    fresh = run_staggered(_engine(folder), prompts, params)
    warmed = _engine(folder)
    warm_up(warmed)
    after = run_staggered(warmed, prompts, params)
    for i in range(len(prompts)):
        assert after[i].outputs[0].token_ids == fresh[i].outputs[0].token_ids
        assert after[i].outputs[0].logprobs == fresh[i].outputs[0].logprobs
    assert_no_leaks(warmed)


def _info(
    max_model_len: int, encoder_decoder: bool = False, vocab: int = 1000, device: str = "cuda"
) -> EngineInfo:
    return EngineInfo(
        model_name="m",
        tokenizer=None,
        max_model_len=max_model_len,
        kv_blocks_total=10_000,
        kv_block_size=16,
        vocab_size=vocab,
        encoder_decoder=encoder_decoder,
        device=device,
    )


def test_the_warm_up_prompts_fit_the_context_and_share_no_prefix():
    requests = warm_up_requests(_info(4096))
    assert [len(prompt) for _, prompt, _ in requests] == [WARM_UP_PROMPT_TOKENS] * 2
    on_cpu = warm_up_requests(_info(4096, device="cpu"))  # shorter: a CPU's start-up time
    assert [len(prompt) for _, prompt, _ in on_cpu] == [CPU_WARM_UP_PROMPT_TOKENS] * 2
    (_, first, params), (_, second, _) = requests
    assert first[0] != second[0]  # no prefix-cache hit: the second computes its whole prompt
    assert all(0 <= t < 1000 for t in first + second)
    assert params.max_tokens == 2 and params.ignore_eos and params.temperature == 0.0
    # a short context: the prompt leaves room for the two tokens
    assert [len(p) for _, p, _ in warm_up_requests(_info(100))] == [98, 98]


def test_an_encoder_decoder_engine_keeps_the_one_token_warm_up():
    assert [(p, s.max_tokens) for _, p, s in warm_up_requests(_info(512, True), 7)] == [([7], 1)]
    assert [p for _, p, _ in warm_up_requests(_info(2))] == [[0]]  # no room for a long prompt
