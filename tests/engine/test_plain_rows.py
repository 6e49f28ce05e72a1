"""The steady state's one-pass update (engine/plain_rows.py) and the outputs of requests nobody
reads as a stream (engine.py `_emit`), issue 38.

A batch mixing rows that take that pass and rows that do not: a streamed greedy request, a
whole-output one (`streamed` false), one ended by a stop string, a seeded sampled one with
logprobs, and two that end in the same step (one by max_tokens, one by a stop token id), in a
KV cache too small for all of them (someone is preempted). Each request's answer (token ids,
logprobs, text, finish and stop reasons) equals its solo run's, in the synchronous and in the
overlapped loop; a streamed request gets one output per token, a whole-output one at most two
that carry tokens (its first token's and its last).
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.outputs import OutputAccumulator
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.decode_columns import DecodeColumns

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = [f"Hello world {i}, how are you" for i in range(6)]


def _engine(folder, async_scheduling: bool = False, blocks: int = 400) -> Engine:
    # tiny llama: 2 layers, 2 KV heads, head_dim 16, fp32, block 4 -> 2 KiB a block
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=blocks * 2048,
        block_size=4,
        max_num_seqs=16,
        async_scheduling=async_scheduling,
    )
    return Engine.from_model(str(folder), config)


def _run(engine: Engine, prompts, params) -> tuple[dict, dict]:
    """All requests added at once, stepped to the end: {index: whole final output} and
    {index: the outputs as they came}."""
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    seen: dict[int, list] = {i: [] for i in range(len(prompts))}
    finals, partial = {}, {i: OutputAccumulator() for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            i = int(out.request_id)
            seen[i].append(out)
            partial[i].add(out)
            if out.finished:
                finals[i] = partial[i].result()
    return finals, seen


def _answer(final) -> tuple:
    c = final.outputs[0]
    return (c.token_ids, c.logprobs, c.text, c.finish_reason, c.stop_reason)


@pytest.fixture(scope="module")
def mix(tiny_model_folder):
    """The batch's parameters, its prompts' ids, and each request's solo answer."""
    solo_engine = _engine(tiny_model_folder)
    ids = [solo_engine.tokenizer.encode(p) for p in PROMPTS]

    def solo(i: int, p: SamplingParams):
        finals, _ = _run(solo_engine, [ids[i]], [p])
        return finals[0]

    # Request 2 stops at a string from the middle of its free run's text; request 5 at its
    # free run's first token that did not come before, as request 4 reaches max_tokens.
    text = solo(2, GREEDY).outputs[0].text
    free = solo(5, GREEDY).outputs[0].token_ids
    j = next(k for k in range(2, len(free)) if free[k] not in free[:k])
    params = [
        GREEDY,
        dataclasses.replace(GREEDY, streamed=False),
        dataclasses.replace(GREEDY, stop=[text[len(text) // 2 : len(text) // 2 + 2]]),
        SamplingParams(max_tokens=10, temperature=0.9, seed=4, logprobs=2, ignore_eos=True),
        dataclasses.replace(GREEDY, max_tokens=j + 1),
        dataclasses.replace(GREEDY, stop_token_ids=[free[j]]),
    ]
    answers = [_answer(solo(i, p)) for i, p in enumerate(params)]
    return params, ids, answers


@pytest.mark.parametrize("overlapped", [False, True], ids=["synchronous", "overlapped"])
def test_a_mixed_batch_gives_each_request_its_solo_answer(tiny_model_folder, mix, overlapped):
    params, ids, answers = mix
    # 16 blocks: a request needs up to 7 (a 16-token prompt and 10 tokens), 4 to start; the
    # decodes of those admitted outgrow the cache and the last admitted are preempted.
    engine = _engine(tiny_model_folder, overlapped, blocks=16)
    finals, seen = _run(engine, ids, params)
    assert engine.stats().num_preemptions >= 1
    assert [_answer(finals[i]) for i in range(len(params))] == answers
    assert answers[2][3] == "stop" and isinstance(answers[2][4], str)  # its stop string
    assert answers[4][3] == "length" and answers[5][3:] == ("stop", params[5].stop_token_ids[0])
    assert len(answers[4][0]) == len(answers[5][0])  # they ended in the same step
    carrying = {i: [o for o in outs if o.outputs[0].token_ids] for i, outs in seen.items()}
    assert [len(o.outputs[0].token_ids) for o in carrying[0]] == [1] * len(answers[0][0])
    assert 1 <= len(carrying[1]) <= 2 and carrying[1][-1].finished
    stats = engine.stats()
    assert stats.num_running == stats.num_waiting == stats.kv_blocks_used == 0


@pytest.mark.parametrize("overlapped", [False, True], ids=["synchronous", "overlapped"])
def test_steps_with_the_same_rows_reuse_their_plan_and_keep_solo_answers(
    tiny_model_folder, mix, overlapped, monkeypatch
):
    """The columnar steady state: while the running set does not change, a decode step takes
    the last step's draws again (`plan_steady`), its rows are columns (the runner builds its
    inputs from them) and the overlapped loop carries every row's token without a pass over
    the rows. A request that ends early and one that arrives late
    change the running set; every request's answer is still its solo run's."""
    import engine.step_update as step_update
    from engine.sampling_plan import plan_steady

    _, ids, _ = mix
    params = [
        dataclasses.replace(GREEDY, max_tokens=24),
        SamplingParams(max_tokens=24, temperature=0.9, seed=7, logprobs=2, ignore_eos=True),
        dataclasses.replace(GREEDY, max_tokens=6),
        SamplingParams(max_tokens=16, temperature=0.8, seed=3, ignore_eos=True),
    ]
    solo_engine = _engine(tiny_model_folder)
    answers = [_answer(_run(solo_engine, [ids[i]], [p])[0][0]) for i, p in enumerate(params)]
    reused = []

    def counted(*args):
        reused.append(1)
        return plan_steady(*args)

    monkeypatch.setattr(step_update, "plan_steady", counted)
    engine = _engine(tiny_model_folder, overlapped)
    schedule, columns = engine.scheduler.schedule, []

    def spied():  # steps whose decodes the runner got as columns (decode_columns.py)
        out = schedule()
        columns.append(type(out.chunks) is DecodeColumns)
        return out

    engine.scheduler.schedule = spied
    for i in range(3):
        engine.add_request(str(i), ids[i], params[i])
    finals, partial, steps = {}, {i: OutputAccumulator() for i in range(4)}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            i = int(out.request_id)
            partial[i].add(out)
            if out.finished:
                finals[i] = partial[i].result()
        steps += 1
        if steps == 10:  # late: the running set changes in the steady state
            engine.add_request("3", ids[3], params[3])
    assert [_answer(finals[i]) for i in range(4)] == answers
    assert len(reused) >= 10  # most decode steps took the last step's plan
    assert sum(columns) >= 8  # and their rows as columns
