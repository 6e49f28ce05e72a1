"""One request's sampling trouble never reaches its batch-mates (issue 39, item 1).

Two halves. Parameters that pass validation compute in a form that cannot raise: the repros
of the issue (top_k 2**63, temperature 1e-38, top_p 1e-300) each run beside an innocent greedy
request, and both get what an independent oracle says (the innocent: its solo run; the draw:
the greedy run or the unfiltered run its parameters are equivalent to). Values that cannot be
computed safely are refused with the field named (repetition_penalty 1e-40, length_penalty 1000
/ -1e308 / NaN / inf). And when a row's work raises anyway (a sampler, append or beam step made
to raise here), that request alone ends with "error"; the others' tokens equal their solo runs,
seeded sampled ones included, and no KV block leaks.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from engine.decoding.beam_search import BeamSearch
from engine.errors import InvalidRequest
from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, run_staggered, tiny_engine

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=0.9, seed=5, ignore_eos=True)
PROMPTS = random_prompts(3, (5, 9), seed=11)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-llama-isolation")


def tokens(final) -> tuple[int, ...]:
    return final.outputs[0].token_ids


_SOLO: dict[tuple[int, str], object] = {}


def solo(folder, prompt, params):
    """The request's run alone (the oracle of a batch-mate), one engine per distinct run."""
    key = (PROMPTS.index(prompt), repr(params))
    if key not in _SOLO:
        [_SOLO[key]] = run_staggered(tiny_engine(folder), [prompt], [params]).values()
    return _SOLO[key]


# (the draw's parameters, the parameters whose run is its oracle): each made a step raise.
EDGE_CASES = {
    "top_k 2**63": (dict(temperature=1.0, seed=3, top_k=2**63), dict(temperature=1.0, seed=3)),
    "top_k 2**70": (dict(temperature=1.0, seed=3, top_k=2**70), dict(temperature=1.0, seed=3)),
    "temperature 1e-38": (dict(temperature=1e-38, seed=3), dict(temperature=0.0)),
    # 0 in float32: the tiny model's small logits survive 1e-38, this overflows them
    "temperature 1e-300": (dict(temperature=1e-300, seed=3), dict(temperature=0.0)),
    "top_p 1e-300": (dict(temperature=1.0, seed=3, top_p=1e-300), dict(temperature=0.0)),
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_parameters_sample_what_their_equivalent_does_beside_an_innocent(folder, case):
    draw, oracle = (
        dataclasses.replace(GREEDY, **kw) for kw in EDGE_CASES[case]
    )  # top_p 1e-300 keeps the top token alone: greedy; a huge top_k keeps every token
    engine = tiny_engine(folder)
    finals = run_staggered(engine, PROMPTS[:2], [draw, GREEDY], arrive_every=0)
    assert finals[0].error is None and finals[0].outputs[0].finish_reason == "length"
    assert tokens(finals[0]) == tokens(solo(folder, PROMPTS[0], oracle))
    assert finals[1].error is None and tokens(finals[1]) == tokens(solo(folder, PROMPTS[1], GREEDY))
    assert_no_leaks(engine)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repetition_penalty", 1e-40),
        ("repetition_penalty", 1e40),
        ("repetition_penalty", math.inf),
        ("repetition_penalty", math.nan),
        ("length_penalty", 1000.0),
        ("length_penalty", -1e308),
        ("length_penalty", math.inf),
        ("length_penalty", -math.inf),
        ("length_penalty", math.nan),
    ],
)
def test_values_that_cannot_be_computed_safely_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidRequest) as refused:
        SamplingParams(**{field: value})
    assert refused.value.field == field


@pytest.mark.parametrize("lp", [-10.0, 10.0])
def test_beam_search_at_the_length_penalty_bounds_runs_to_the_end(folder, lp):
    params = SamplingParams(
        temperature=0.0, n=2, best_of=3, use_beam_search=True, length_penalty=lp, max_tokens=12
    )
    engine = tiny_engine(folder)
    finals = run_staggered(engine, PROMPTS[:2], [params, GREEDY], arrive_every=0)
    assert finals[0].error is None and len(finals[0].outputs) == 2
    assert tokens(finals[1]) == tokens(solo(folder, PROMPTS[1], GREEDY))
    assert_no_leaks(engine)


def raising_for(marker_seed: int, sampler):
    """The runner floor's draw (engine/sampling/step_sampler.py), raising (after drawing, so
    seeded generators did advance) when a row of the call belongs to the request with
    `marker_seed`."""

    def call(logits, rows, grammar=None):
        result = sampler(logits, rows, grammar)
        if any(row.params.seed == marker_seed for row in rows):
            raise RuntimeError("this row cannot be sampled")
        return result

    return call


def test_a_raising_sampler_row_fails_its_request_alone(folder):
    bad = dataclasses.replace(SEEDED, seed=13)
    engine = tiny_engine(folder)
    sampler = engine.runner.step_sampler.sampler
    sampler.draw = raising_for(13, sampler.draw)
    finals = run_staggered(engine, PROMPTS, [bad, GREEDY, SEEDED], arrive_every=0)
    assert finals[0].outputs[0].finish_reason == "error"
    assert "RuntimeError" in finals[0].error and tokens(finals[0]) == ()
    # The innocent rows were drawn in the failed batched call and again alone: same tokens.
    assert tokens(finals[1]) == tokens(solo(folder, PROMPTS[1], GREEDY))
    assert tokens(finals[2]) == tokens(solo(folder, PROMPTS[2], SEEDED))
    assert finals[1].error is None and finals[2].error is None
    assert_no_leaks(engine)


class _FlakyIds(list):
    """A sequence's token ids whose append raises once they hold `fail_at` ids."""

    def __init__(self, ids: list[int], fail_at: int) -> None:
        super().__init__(ids)
        self.fail_at = fail_at

    def append(self, token: int) -> None:
        if len(self) == self.fail_at:
            raise ValueError("the append choked")
        super().append(token)


def test_a_raising_append_fails_its_request_alone_after_its_good_tokens(folder):
    engine = tiny_engine(folder)
    add = engine.add

    def add_flaky(request):  # request 0's third token does not go in
        if request.request_id == "0":
            seq = request.seqs[0]
            seq.token_ids = _FlakyIds(seq.token_ids, seq.num_prompt_tokens + 2)
        add(request)

    engine.add = add_flaky
    finals = run_staggered(engine, PROMPTS, [GREEDY, SEEDED, GREEDY], arrive_every=0)
    assert finals[0].outputs[0].finish_reason == "error" and "ValueError" in finals[0].error
    assert tokens(finals[0]) == tokens(solo(folder, PROMPTS[0], GREEDY))[:2]
    assert tokens(finals[1]) == tokens(solo(folder, PROMPTS[1], SEEDED))
    assert tokens(finals[2]) == tokens(solo(folder, PROMPTS[2], GREEDY))
    assert_no_leaks(engine)


def test_a_raising_beam_step_fails_its_request_alone(folder, monkeypatch):
    step = BeamSearch.step

    def failing(self, scheduler, request, *args, **kwargs):
        if request.request_id == "0":
            raise IndexError("beam bookkeeping broke")
        return step(self, scheduler, request, *args, **kwargs)

    monkeypatch.setattr(BeamSearch, "step", failing)
    beams = SamplingParams(temperature=0.0, n=2, best_of=2, use_beam_search=True, max_tokens=6)
    engine = tiny_engine(folder)
    finals = run_staggered(engine, PROMPTS[:2], [beams, GREEDY], arrive_every=0)
    assert finals[0].error is not None and "IndexError" in finals[0].error
    assert all(c.finish_reason == "error" for c in finals[0].outputs)
    assert finals[1].error is None and tokens(finals[1]) == tokens(solo(folder, PROMPTS[1], GREEDY))
    assert_no_leaks(engine)
