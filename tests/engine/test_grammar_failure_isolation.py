"""A request whose grammar work raises fails alone (issue 39, item 1): whether its matcher
breaks on the engine's thread (catching up on its tokens) or in the worker computing the
step's masks, that request ends with "error" and the step's other requests, constrained or
not, get the tokens of their solo runs; no KV block leaks.
"""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
CONSTRAINED = SamplingParams(
    max_tokens=8, temperature=0.0, structured_output=StructuredOutput("regex", r"[a-z ]{2,30}")
)
PLAIN = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PARAMS = [CONSTRAINED, CONSTRAINED, PLAIN]  # request "0" is the one that breaks


def tiny(folder) -> Engine:
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4)
    return Engine.from_model(str(folder), config)


@pytest.fixture(scope="module")
def solos(tiny_model_folder):
    return [
        run_staggered(tiny(tiny_model_folder), [p], [params])[0]
        for p, params in zip(PROMPTS, PARAMS, strict=True)
    ]


def breaking_at_step_2(engine: Engine, where: str) -> None:
    """From the engine's 2nd step, request "0"'s grammar raises in `where`."""
    step, steps = engine.step, [0]

    def counted():
        steps[0] += 1
        if steps[0] == 2:
            matchers = engine._states["0"].grammar
            if where == "engine thread":
                matchers.matcher = lambda seq: (_ for _ in ()).throw(RuntimeError("broken"))
            else:
                bad = matchers.matcher(engine._states["0"].request.seqs[0])
                masker = engine.grammars._masker
                compute = masker.compute

                def failing(jobs):
                    if any(m is bad for _, m in jobs):
                        raise RuntimeError("llguidance failed")
                    return compute(jobs)

                masker.compute = failing
        return step()

    engine.step = counted


@pytest.mark.parametrize("where", ["engine thread", "mask worker"])
def test_a_request_whose_grammar_raises_fails_alone(tiny_model_folder, solos, where):
    engine = tiny(tiny_model_folder)
    breaking_at_step_2(engine, where)
    finals = run_staggered(engine, PROMPTS, PARAMS, arrive_every=0)
    for i in (1, 2):
        assert finals[i].error is None
        assert finals[i].outputs[0].token_ids == solos[i].outputs[0].token_ids
    assert finals[0].outputs[0].finish_reason == "error" and "grammar" in finals[0].error
    assert finals[0].outputs[0].token_ids == solos[0].outputs[0].token_ids[:1]
    assert_no_leaks(engine)
