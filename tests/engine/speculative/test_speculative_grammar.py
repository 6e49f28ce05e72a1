"""Speculation under structured outputs: the grammar cuts each proposal at the first token it
refuses and masks every scored position as ordinary decoding would, so constrained greedy and
seeded requests return the tokens they return without speculation (oracle: the same requests
on an engine that does not speculate; tiny random Llama with a trained byte-level BPE)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from engine.speculative.config import SpeculativeConfig
from engine.speculative.speculator import grammar_jobs
from tests.engine.engine_fixtures import assert_no_leaks
from tests.server.tiny_model import make_tiny_model

REPEATED = "hello world " * 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("spec-grammar") / "tiny")


def _engine(folder, speculative: SpeculativeConfig | None) -> Engine:
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=8_000_000,
        block_size=4,
        max_num_seqs=16,
        speculative=speculative,
    )
    return Engine.from_model(str(folder), config)


def _answers(engine: Engine, params: list[SamplingParams]) -> list[tuple]:
    prompt = engine.tokenizer.encode(REPEATED)
    outs = engine.generate([prompt] * len(params), params)
    return [tuple((c.token_ids, c.text, c.finish_reason) for c in o.outputs) for o in outs]


CASES = [
    # one path through the grammar: proposals copied from the prompt are kept
    (StructuredOutput("regex", "(hello world ){2,5}"), None),
    (StructuredOutput("regex", "(hello world ){2,5}"), 5),
    # the prompt's n-grams are refused at once: every proposal is cut to nothing
    (StructuredOutput("regex", "[0-9]{4,12}"), None),
    (StructuredOutput("json_object"), 7),
    (StructuredOutput.from_choices(["hello world hello", "hello there", "bye"]), 3),
]


def test_constrained_requests_return_what_they_return_without_speculation(folder):
    params = [
        SamplingParams(
            max_tokens=40,
            temperature=0.0 if seed is None else 0.8,
            seed=seed,
            structured_output=so,
            logprobs=1,
        )
        for so, seed in CASES
    ]
    # a stop string inside kept proposals: the sequence ends there, the rest is dropped
    params.append(dataclasses.replace(params[0], stop=("world hello",)))
    plain = _answers(_engine(folder, None), params)
    spec_engine = _engine(folder, SpeculativeConfig(num_tokens=4))
    assert _answers(spec_engine, params) == plain
    assert plain[-1][0][2] == "stop" and plain[-1][0][1] == "hello "  # the stop string ended it
    stats = spec_engine.stats().speculation
    assert stats.num_accepted_tokens > 0  # the first regex's copies were proposed and kept
    assert_no_leaks(spec_engine)


def test_grammar_refusal_cuts_the_proposal(folder):
    engine = _engine(folder, SpeculativeConfig(num_tokens=4))
    tokenizer = engine.tokenizer
    compiled = engine.grammars.compile(
        SamplingParams(structured_output=StructuredOutput("regex", "hello [0-9]+"))
    )
    matcher = compiled.new_matcher()
    hello, digits, word = (tokenizer.encode(t) for t in ("hello ", "12", "world"))
    proposal = tuple(hello + digits + word)
    assert matcher.validate_tokens(list(proposal)) == len(hello) + len(digits)
    jobs = grammar_jobs(matcher, proposal[: len(hello) + len(digits)], first_row=3)
    assert [row for row, _ in jobs] == list(range(3, 4 + len(hello) + len(digits)))
    # each position's matcher has consumed the proposal before it; the original is untouched
    assert jobs[0][1] is matcher and not matcher.is_stopped()
