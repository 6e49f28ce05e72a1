"""EngineStats.prompt_tokens_total counts the prompts the engine scheduled, once each (prefix-cache
hits included, as vLLM counts them); a request aborted while still queued counts nothing."""

from __future__ import annotations

from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import tiny_engine


def run_all(engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def test_a_request_aborted_while_queued_adds_no_prompt_tokens(tmp_path):
    engine = tiny_engine(tmp_path, max_num_seqs=1)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.add_request("running", [5, 6, 7, 8, 9], params)
    engine.add_request("queued", list(range(10, 21)), params)
    engine.step()  # one sequence at a time: "queued" waits
    assert engine.stats().num_waiting == 1
    engine.abort_request("queued")
    run_all(engine)
    assert engine.stats().prompt_tokens_total == 5


def test_scheduled_prompts_count_once_each_cache_hits_included(tmp_path):
    engine = tiny_engine(
        tmp_path, max_num_seqs=4, max_num_batched_tokens=8
    )  # a 13-token prompt takes 2 chunks
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompt = list(range(3, 16))
    engine.add_request("a", prompt, params)
    run_all(engine)
    engine.add_request("b", prompt, params)  # the same prompt: its full blocks hit the cache
    run_all(engine)
    stats = engine.stats()
    assert stats.prompt_tokens_total == 2 * len(prompt)
    assert stats.generation_tokens_total == 6
