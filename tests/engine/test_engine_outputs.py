"""End-to-end engine guarantees on tiny random checkpoints, with transformers as the oracle:
greedy equals transformers' generate; batched equals alone; preemption and prefix caching
change nothing in the outputs; nothing leaks."""

from __future__ import annotations

import pytest
import torch

from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import make_hf_model
from tests.devices import skip_cpu_kernels_off_cpu
from tests.engine.engine_fixtures import (
    assert_no_leaks,
    random_prompts,
    run_staggered,
    tiny_engine,
)


@pytest.mark.parametrize(
    "arch,kernel",
    [
        ("llama", False),
        ("qwen2", False),
        ("mistral", False),
        ("gpt2", False),
        ("llama", True),
        ("mistral", True),
    ],
)
def test_greedy_equals_transformers_generate(arch: str, kernel: bool, tmp_path) -> None:
    """Through the C++ decode step and attention kernel (kernel=True) and PyTorch ops only."""
    skip_cpu_kernels_off_cpu(kernel)
    engine = tiny_engine(tmp_path, arch, max_num_batched_tokens=32, cpu_kernels=kernel)
    assert engine.describe().cpu_kernels == kernel
    hf = make_hf_model(arch)
    prompts = random_prompts(4, (3, 40), seed=1)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=24,
                min_new_tokens=24,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert list(out.outputs[0].token_ids) == ref
        assert out.outputs[0].finish_reason == "length"
    assert_no_leaks(engine)


def mixed_params(n: int, sampled: bool) -> list[SamplingParams]:
    return [
        SamplingParams(
            max_tokens=4 + (i * 7) % 23,
            temperature=0.8 if sampled else 0.0,
            top_p=0.9 if sampled else 1.0,
            seed=1000 + i if sampled else None,
            ignore_eos=True,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_batched_equals_alone(sampled: bool, tmp_path) -> None:
    prompts = random_prompts(16, (2, 60), seed=2)
    params = mixed_params(16, sampled)
    engine = tiny_engine(tmp_path, max_num_batched_tokens=48)
    batched = run_staggered(engine, prompts, params, arrive_every=2)
    assert engine.stats().num_steps < sum(p.max_tokens for p in params)  # it really batched
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        alone = engine.generate([prompt], p)[0]
        assert batched[i].outputs[0].token_ids == alone.outputs[0].token_ids, f"request {i}"
    assert_no_leaks(engine)


def test_preemption_loses_nothing(tmp_path) -> None:
    prompts = random_prompts(12, (10, 30), seed=3)
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * 12
    # 3 sequences of <= 49 tokens fit in 39 blocks of 4; 12 requests need far more.
    small = tiny_engine(tmp_path / "small", kv_cache_memory_bytes=_bytes_for_blocks(39))
    outs = run_staggered(small, prompts, params, arrive_every=0)
    assert small.stats().num_preemptions >= 1
    big = tiny_engine(tmp_path / "small")
    for i, prompt in enumerate(prompts):
        alone = big.generate([prompt], params[i])[0]
        assert outs[i].outputs[0].token_ids == alone.outputs[0].token_ids
        assert outs[i].outputs[0].finish_reason == "length"
    assert_no_leaks(small)


def _bytes_for_blocks(n: int) -> int:
    # tiny llama: 2 layers, 2 KV heads, head_dim 16, fp32, block 4: K and V
    return n * 2 * 2 * 4 * 2 * 16 * 4


def test_prefix_cache_skips_shared_prefix_and_keeps_output(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    prefix = random_prompts(1, (40, 40), seed=4)[0]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    cold_engine = tiny_engine(tmp_path, enable_prefix_caching=False)
    first = engine.generate([prefix + [7, 8]], params)[0]
    hits_before = engine.stats().prefix_cache_hits
    second = engine.generate([prefix + [9, 10, 11]], params)[0]
    hits = engine.stats().prefix_cache_hits - hits_before
    assert hits >= 36  # 9 full blocks of the shared 40-token prefix
    assert second.metrics.num_cached_prompt_tokens == hits
    cold = cold_engine.generate([prefix + [9, 10, 11]], params)[0]
    assert second.outputs[0].token_ids == cold.outputs[0].token_ids
    assert (
        first.outputs[0].token_ids
        == cold_engine.generate([prefix + [7, 8]], params)[0].outputs[0].token_ids
    )
    assert_no_leaks(engine)


def test_aborts_of_running_and_waiting_requests_free_everything(tmp_path) -> None:
    engine = tiny_engine(tmp_path, max_num_seqs=2, max_num_batched_tokens=16)
    prompts = random_prompts(6, (5, 30), seed=5)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    finals = {}
    for step in range(200):
        if step == 3:
            engine.abort_request("0")  # running
            engine.abort_request("5")  # still waiting
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if not engine.has_unfinished_requests():
            break
    assert sorted(finals) == [str(i) for i in range(6)]
    assert finals["0"].outputs[0].finish_reason == "abort"
    assert finals["5"].outputs[0].finish_reason == "abort"
    assert all(finals[str(i)].outputs[0].finish_reason == "length" for i in range(1, 5))
    assert_no_leaks(engine)


def test_impossible_requests_are_rejected_at_admission(tmp_path) -> None:
    engine = tiny_engine(tmp_path, max_model_len=64)
    with pytest.raises(ValueError, match="maximum context length"):
        engine.add_request("long", list(range(3, 60)), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request("bad", [5, 10_000], SamplingParams())
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request("empty", [], SamplingParams())
    assert not engine.has_unfinished_requests()
    engine.add_request("ok", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("ok", [7], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leaks(engine)
    engine.add_request("ok", [5, 6], SamplingParams(max_tokens=2))  # a finished id is free again


def test_a_prompt_longer_than_the_step_budget_is_chunked_alone(tmp_path) -> None:
    """Steps where no sequence samples yet (a lone prompt's early chunks) must work."""
    engine = tiny_engine(tmp_path, max_num_batched_tokens=16)
    prompt = random_prompts(1, (40, 40), seed=6)[0]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    out = engine.generate([prompt], params)[0]
    assert out.outputs[0].finish_reason == "length"
    whole = tiny_engine(tmp_path, max_num_batched_tokens=64).generate([prompt], params)[0]
    assert out.outputs[0].token_ids == whole.outputs[0].token_ids
    assert_no_leaks(engine)


def test_prompt_logprobs_cover_every_prompt_token_even_after_a_prefix_cache_hit(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    hf = make_hf_model("llama")
    prompt = random_prompts(1, (30, 30), seed=7)[0]
    engine.generate(
        [prompt + [5]], SamplingParams(max_tokens=2, temperature=0.0)
    )  # fills the cache
    out = engine.generate(
        [prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2)
    )[0]
    assert out.prompt_logprobs[0] is None and all(e is not None for e in out.prompt_logprobs[1:])
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for pos in range(1, len(prompt)):
        entry = out.prompt_logprobs[pos]
        assert entry.token_id == prompt[pos]
        assert abs(entry.logprob - ref[pos - 1, prompt[pos]].item()) < 1e-4
        assert [t for t, _ in entry.top] == ref[pos - 1].topk(2).indices.tolist()
    assert_no_leaks(engine)
