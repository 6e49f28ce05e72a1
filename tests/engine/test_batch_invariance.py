"""Same request, same answer, bit for bit (issue #14): every request of a random set, run
with random arrivals, step budgets, block sizes, a KV cache small enough to preempt, and
prompts sharing prefixes (prefix-cache hits), returns the token ids and logprobs of its solo
run, in float32 and bfloat16, through the C++ CPU kernels and through PyTorch ops only (on
CUDA: the Triton path with --batch-invariant).

The solo runs come from an engine with another block size and no prefix cache, so the test
also holds the K/V of a token independent of the cache layout and of the chunk it was
computed in. The checkpoint is the tiny GQA llama of tests/checkpoints.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.requests.outputs import OutputAccumulator
from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import VOCAB
from tests.devices import skip_cpu_kernels_off_cpu
from tests.engine.engine_fixtures import assert_no_leaks, tiny_engine
from tests.property_budget import examples

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
SOLO_BLOCK_SIZE = 16


def block_bytes(dtype: str, block_size: int) -> int:
    # tiny llama: 2 layers x (K and V) x 2 KV heads x head_dim 16
    return 2 * 2 * block_size * 2 * 16 * DTYPE_BYTES[dtype]


tokens = st.integers(3, VOCAB - 1)
request = st.fixed_dictionaries(
    {
        "shared": st.booleans(),  # starts with the scenario's common prefix
        "prompt": st.lists(tokens, min_size=1, max_size=30),
        "max_tokens": st.integers(1, 12),
        "seed": st.one_of(st.none(), st.integers(0, 2**16)),  # None: greedy
        "logprobs": st.sampled_from([None, 0, 3]),
        "arrive": st.integers(0, 4),  # step at which it is added
    }
)
scenario = st.fixed_dictionaries(
    {
        "prefix": st.lists(tokens, min_size=0, max_size=40),
        "requests": st.lists(request, min_size=2, max_size=6),
        "block_size": st.sampled_from([1, 4, 8, 32]),
        "budget": st.sampled_from([8, 13, 32, 96]),
        "spare_blocks": st.integers(0, 40),  # KV blocks beyond what the largest request needs
    }
)


def _params(r: dict) -> SamplingParams:
    sampled = r["seed"] is not None
    return SamplingParams(
        max_tokens=r["max_tokens"],
        temperature=0.9 if sampled else 0.0,
        top_p=0.95 if sampled else 1.0,
        seed=r["seed"],
        logprobs=r["logprobs"],
        ignore_eos=True,
    )


def _answer(out) -> tuple:
    c = out.outputs[0]
    return c.token_ids, c.logprobs, c.finish_reason


_solo_engines: dict = {}
_solo_answers: dict = {}


def _solo(folder, dtype: str, kernels: bool, prompt: list[int], params: SamplingParams) -> tuple:
    key = (dtype, kernels, tuple(prompt), repr(params))
    if key not in _solo_answers:
        engine = _solo_engines.get((dtype, kernels))
        if engine is None:
            engine = _solo_engines[(dtype, kernels)] = tiny_engine(
                folder,
                dtype=dtype,
                cpu_kernels=kernels,
                block_size=SOLO_BLOCK_SIZE,
                enable_prefix_caching=False,
                max_num_seqs=8,
                max_num_batched_tokens=512,
                batch_invariant=True,
            )
        _solo_answers[key] = _answer(engine.generate([prompt], params)[0])
    return _solo_answers[key]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-llama")


@pytest.mark.parametrize("kernels", [False, True], ids=["pytorch", "cpp"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@settings(
    max_examples=examples(8, ci=3),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=scenario)
def test_every_request_equals_its_solo_run(folder, dtype: str, kernels: bool, case: dict) -> None:
    skip_cpu_kernels_off_cpu(kernels)
    reqs = case["requests"]
    prompts = [(case["prefix"] if r["shared"] else []) + r["prompt"] for r in reqs]
    params = [_params(r) for r in reqs]
    bs = case["block_size"]
    need = max(-(-(len(p) + r["max_tokens"]) // bs) for p, r in zip(prompts, reqs, strict=True))
    engine = tiny_engine(
        folder,
        dtype=dtype,
        cpu_kernels=kernels,
        block_size=bs,
        max_num_seqs=8,
        max_num_batched_tokens=case["budget"],
        kv_cache_memory_bytes=(need + 1 + case["spare_blocks"]) * block_bytes(dtype, bs),
        batch_invariant=True,  # CUDA: the fixed-tile GEMMs; CPU steps are invariant anyway
    )
    assert engine.describe().cpu_kernels == kernels
    got, partial, step = {}, {}, 0
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["arrive"])
    while order or engine.has_unfinished_requests():
        while order and reqs[order[0]]["arrive"] <= step:
            i = order.pop(0)
            engine.add_request(str(i), prompts[i], params[i])
        for out in engine.step():
            acc = partial.setdefault(out.request_id, OutputAccumulator())
            acc.add(out)
            if out.finished:
                got[int(out.request_id)] = _answer(acc.result())
        step += 1
    for i in range(len(reqs)):
        assert got[i] == _solo(folder, dtype, kernels, prompts[i], params[i]), f"request {i}"
    assert_no_leaks(engine)
