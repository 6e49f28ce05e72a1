"""Speculative decoding in the engine, against the oracle of the same requests decoded without
speculation: greedy requests token for token, seeded sampled ones token for token too (the
n-gram rule's draws are coupled to ordinary decoding's, acceptance.py), logprobs bit for bit,
in float32 and bfloat16, through the C++ kernels and through PyTorch ops; beside other traffic,
with prefix caching, preemption, stop tokens, max_tokens, n > 1 and beam search (which does not
speculate). Prompts repeat short motifs so the n-gram proposer finds matches and proposals are
both kept and rejected (the counters show both)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.requests.outputs import OutputAccumulator
from engine.requests.sampling_params import SamplingParams
from engine.speculative.config import SpeculativeConfig
from tests.checkpoints import VOCAB
from tests.devices import skip_cpu_kernels_off_cpu
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, tiny_engine
from tests.property_budget import examples


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-llama-spec")


def repetitive_prompt(motif: list[int], repeats: int, tail: list[int]) -> list[int]:
    return motif * repeats + tail


def answers(engine, prompts, params, arrive_every: int = 0) -> list[tuple]:
    """Each request's (token ids, logprobs, finish reason) per returned sequence, run together
    (all added at once, or one every `arrive_every` steps); blocks checked after every step."""
    partial: dict[str, OutputAccumulator] = {}
    finals: dict[int, tuple] = {}
    step, next_i = 0, 0
    while next_i < len(prompts) or engine.has_unfinished_requests():
        while next_i < len(prompts) and step >= next_i * arrive_every:
            engine.add_request(str(next_i), prompts[next_i], params[next_i])
            next_i += 1
        for out in engine.step():
            acc = partial.setdefault(out.request_id, OutputAccumulator())
            acc.add(out)
            if out.finished:
                whole = acc.result()
                finals[int(out.request_id)] = tuple(
                    (c.token_ids, c.logprobs, c.finish_reason) for c in whole.outputs
                )
        engine.scheduler.block_manager.check_invariants()
        step += 1
    return [finals[i] for i in range(len(prompts))]


def engines(folder, dtype: str, kernels: bool, k: int, **config):
    # batch_invariant: a verify step scores k + 1 rows where plain decoding scores one; on CUDA
    # only the fixed-tile GEMMs give a row the same bits either way (a no-op on the CPU, whose
    # steps are invariant already)
    common = dict(dtype=dtype, cpu_kernels=kernels, batch_invariant=True, **config)
    plain = tiny_engine(folder, **common)
    spec = tiny_engine(folder, speculative=SpeculativeConfig(num_tokens=k), **common)
    return plain, spec


motif = st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=5)
request = st.fixed_dictionaries(
    {
        "motif": motif,
        "repeats": st.integers(1, 6),
        "tail": st.lists(st.integers(3, VOCAB - 1), max_size=4),
        "max_tokens": st.integers(1, 24),
        "seed": st.one_of(st.none(), st.integers(0, 2**16)),  # None: greedy
        "logprobs": st.sampled_from([None, 0, 2]),
    }
)


def _params(r: dict) -> SamplingParams:
    sampled = r["seed"] is not None
    return SamplingParams(
        max_tokens=r["max_tokens"],
        temperature=0.8 if sampled else 0.0,
        top_k=20 if sampled else -1,
        seed=r["seed"],
        logprobs=r["logprobs"],
        ignore_eos=True,
    )


@pytest.mark.parametrize("kernels", [False, True], ids=["pytorch", "cpp"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@settings(
    max_examples=examples(6, ci=2),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    reqs=st.lists(request, min_size=1, max_size=4),
    k=st.integers(1, 6),
    block_size=st.sampled_from([1, 4, 16]),
    arrive_every=st.integers(0, 3),
)
def test_speculation_returns_the_tokens_of_ordinary_decoding(
    folder, dtype, kernels, reqs, k, block_size, arrive_every
):
    skip_cpu_kernels_off_cpu(kernels)
    prompts = [repetitive_prompt(r["motif"], r["repeats"], r["tail"]) for r in reqs]
    params = [_params(r) for r in reqs]
    plain, spec = engines(folder, dtype, kernels, k, block_size=block_size)
    assert spec.runner.forward_path.attention_kernel == kernels
    assert answers(spec, prompts, params, arrive_every) == answers(
        plain, prompts, params, arrive_every
    )
    assert_no_leaks(spec)


def test_proposals_are_both_kept_and_rejected(folder):
    """The property above is not vacuous: on these prompts the target keeps some proposed
    tokens and refuses others (a tiny random model repeats itself, as real ones copy)."""
    prompts = [repetitive_prompt([5, 9, 11], 5, [5]), random_prompts(1, (20, 20), seed=3)[0]]
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)] * 2
    plain, spec = engines(folder, "float32", True, 4)
    assert answers(spec, prompts, params) == answers(plain, prompts, params)
    stats = spec.speculator.counters.snapshot()
    assert 0 < stats.num_accepted_tokens < stats.num_proposed_tokens
    assert stats.accepted_per_position[0] > 0
    assert_no_leaks(spec)
    # proposals reached the scheduler as data: it holds nothing it could call back up with
    assert [name for name, v in vars(spec.scheduler).items() if callable(v)] == []


def test_beside_other_traffic_each_request_equals_its_solo_run(folder):
    prompts = [repetitive_prompt([7, 8], 6, []), *random_prompts(4, (3, 30), seed=5)]
    params = [
        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=4, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.0, logprobs=3, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.0, stop_token_ids=[40, 41]),
        SamplingParams(max_tokens=16, temperature=0.7, n=3, seed=11, ignore_eos=True),
    ]
    _, spec = engines(folder, "float32", True, 3, max_num_batched_tokens=16)
    together = answers(spec, prompts, params, arrive_every=2)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        _, solo_engine = engines(folder, "float32", True, 3, enable_prefix_caching=False)
        assert together[i] == answers(solo_engine, [prompt], [p])[0], f"request {i}"
    assert_no_leaks(spec)


def test_preempted_speculating_requests_resume_exactly(folder):
    """A KV cache too small for all of them: requests are preempted (by recompute) while they
    speculate; their tokens stay those of ordinary decoding and no block leaks."""
    prompts = [repetitive_prompt([3 + i, 4 + i, 5], 4, []) for i in range(4)]
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)] * 4
    # tiny llama fp32, block 4: 2 KiB per block; 30 blocks cannot hold 4 x (12 + 30) tokens
    plain, spec = engines(folder, "float32", True, 4, kv_cache_memory_bytes=30 * 2048)
    assert answers(spec, prompts, params) == answers(plain, prompts, params)
    assert spec.stats().num_preemptions > 0 and spec.stats().speculation.num_proposals > 0
    assert_no_leaks(spec)


def test_beam_search_does_not_speculate(folder):
    prompt = repetitive_prompt([5, 6], 6, [])
    params = SamplingParams(max_tokens=10, n=2, use_beam_search=True, temperature=0.0)
    plain, spec = engines(folder, "float32", True, 4)
    assert answers(spec, [prompt], [params]) == answers(plain, [prompt], [params])
    assert spec.speculator.counters.snapshot().num_proposals == 0
