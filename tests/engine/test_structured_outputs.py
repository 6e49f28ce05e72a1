"""Structured outputs through the engine, on a tiny random Llama with a trained byte-level BPE.

Oracles: `jsonschema` validates every JSON output against its schema (random schemas from a
hypothesis strategy of our own: bounded strings, integers, enums, arrays, objects); Python's
`re.fullmatch` checks regex outputs; the choice list checks choice outputs; a solo run of the
same seeded request checks that batching changes nothing. A random model left alone would not
produce JSON: whatever it emits here is the grammar's doing.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered
from tests.property_budget import examples
from tests.server.tiny_model import make_tiny_model

PROMPT = "Hello world, how are you"
BUDGET = 200  # tokens (the context is 256); schemas whose longest JSON could pass it are skipped


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    folder = make_tiny_model(tmp_path_factory.mktemp("structured") / "tiny")
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=8_000_000, block_size=4, max_num_seqs=16
    )
    return Engine.from_model(str(folder), config)


def _leaf() -> st.SearchStrategy[dict]:
    short_text = st.text(max_size=4)
    return st.one_of(
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(
            lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
            st.integers(-50, 50),
            st.integers(0, 200),
        ),
        st.builds(
            lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
            st.integers(0, 3),
            st.integers(0, 4),
        ),
        st.lists(
            st.one_of(short_text, st.integers(-5, 5), st.booleans()),
            min_size=1,
            max_size=3,
            unique=True,
        ).map(lambda values: {"enum": values}),
    )


def _object(props: dict[str, dict]) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }


SCHEMAS = st.recursive(
    _leaf(),
    lambda children: st.one_of(
        st.builds(
            lambda item, n: {"type": "array", "items": item, "maxItems": n},
            children,
            st.integers(0, 3),
        ),
        st.dictionaries(
            st.from_regex(r"[a-z_]{1,6}", fullmatch=True), children, min_size=1, max_size=3
        ).map(_object),
    ),
    max_leaves=6,
)


def _max_bytes(schema: dict) -> int:
    """An upper bound on the UTF-8 bytes of any JSON value `schema` allows, written as the
    grammar writes it (", " and ": " between items): a string's character at most 12 bytes (an
    escaped surrogate pair; raw UTF-8 is at most 4), an enum value at most its ASCII-escaped
    form. A byte-level BPE token holds at least one byte, so this bounds the tokens too."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema["type"]
    if kind in ("boolean", "null"):
        return 5
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "string":
        return 2 + 12 * schema["maxLength"]
    if kind == "array":
        n = schema["maxItems"]
        return 2 + n * _max_bytes(schema["items"]) + 2 * max(n - 1, 0)
    props = schema["properties"]
    fields = sum(len(json.dumps(k)) + 2 + _max_bytes(v) for k, v in props.items())
    return 2 + fields + 2 * max(len(props) - 1, 0)


def _prompt(engine: Engine) -> list[int]:
    return engine.tokenizer.encode(PROMPT)


def _constrained(so: StructuredOutput, **overrides) -> SamplingParams:
    return SamplingParams(
        **{"max_tokens": BUDGET, "temperature": 1.0, "structured_output": so, **overrides}
    )


@settings(
    max_examples=examples(30, ci=10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**32))
def test_random_schemas_always_give_valid_json(engine, schema, seed):
    # ~3% of the strategy's schemas could need more than the budget (e.g. 3 objects of 3 fields
    # with a nested object: a draw once ended at the budget, finish_reason "length")
    assume(_max_bytes(schema) < BUDGET)  # and the end-of-sequence token after it
    so = StructuredOutput.from_schema(schema)
    [out] = engine.generate([_prompt(engine)], _constrained(so, seed=seed))
    completion = out.outputs[0]
    assert completion.finish_reason == "stop", completion.text
    jsonschema.validate(json.loads(completion.text), schema)


# ASCII classes only: Python's and the grammar engine's Unicode tables for \w differ at the edges.
@pytest.mark.parametrize(
    "pattern", [r"[a-c]{2,4}-[0-9]{1,3}", r"(yes|no)!?", r"[A-Z][a-z]{0,5} [a-z0-9_]{1,8}"]
)
def test_regex_outputs_match_the_whole_pattern(engine, pattern):
    for seed in range(4):
        params = _constrained(StructuredOutput("regex", pattern), seed=seed)
        [out] = engine.generate([_prompt(engine)], params)
        assert out.outputs[0].finish_reason == "stop"
        assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text


def test_choice_outputs_are_one_of_the_choices(engine):
    choices = ['say "hi"', "back\\slash", "new\nline", "ünïcödé", "x"]
    seen = set()
    for seed in range(12):
        params = _constrained(StructuredOutput.from_choices(choices), seed=seed)
        [out] = engine.generate([_prompt(engine)], params)
        assert out.outputs[0].text in choices
        seen.add(out.outputs[0].text)
    assert len(seen) > 1  # sampling reaches different choices: the mask is not one token wide


SCHEMA = _object(
    {
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    }
)


def test_n_samples_each_follow_the_schema(engine):
    params = _constrained(StructuredOutput.from_schema(SCHEMA), n=4, seed=5)
    [out] = engine.generate([_prompt(engine)], params)
    assert len(out.outputs) == 4
    texts = [c.text for c in out.outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1  # each sample had its own matcher state and draws


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_beam_search_hypotheses_each_follow_the_schema(engine, temperature):
    params = _constrained(
        StructuredOutput.from_schema(SCHEMA),
        n=3,
        use_beam_search=True,
        temperature=temperature,
        seed=2,
    )
    [out] = engine.generate([_prompt(engine)], params)
    assert len(out.outputs) == 3
    for completion in out.outputs:
        assert completion.finish_reason == "stop"
        jsonschema.validate(json.loads(completion.text), SCHEMA)
    assert_no_leaks(engine)


def test_a_seeded_constrained_request_equals_its_solo_run_when_batched(engine):
    prompt = _prompt(engine)
    mine = _constrained(StructuredOutput.from_schema(SCHEMA), seed=1234)
    [solo] = engine.generate([prompt], mine)
    others = [
        SamplingParams(max_tokens=20, temperature=1.0),
        _constrained(StructuredOutput("regex", r"[a-z]{3,9}"), max_tokens=40),
        SamplingParams(max_tokens=30, temperature=0.0),
        _constrained(StructuredOutput("json_object"), n=2, seed=9, max_tokens=40),
        _constrained(StructuredOutput.from_schema(SCHEMA), use_beam_search=True, n=2),
    ]
    prompts = [prompt, engine.tokenizer.encode("The quick brown fox")] * 3
    batch = [others[0], others[1], mine, others[2], others[3], others[4]]
    finals = run_staggered(engine, prompts, batch, arrive_every=1)
    assert finals[2].outputs[0].token_ids == solo.outputs[0].token_ids
    assert_no_leaks(engine)


def test_a_finished_grammar_ends_the_sequence_even_with_ignore_eos(engine):
    so = StructuredOutput.from_choices(["done"])
    [out] = engine.generate([_prompt(engine)], _constrained(so, ignore_eos=True, temperature=0.0))
    completion = out.outputs[0]
    assert (completion.text, completion.finish_reason) == ("done", "stop")
    assert len(completion.token_ids) < BUDGET


def test_json_object_gives_an_object(engine):
    for seed in range(3):
        [out] = engine.generate(
            [_prompt(engine)],
            _constrained(StructuredOutput("json_object"), seed=seed, max_tokens=40),
        )
        if out.outputs[0].finish_reason == "stop":  # a free-form object may run past the budget
            assert isinstance(json.loads(out.outputs[0].text), dict)
        else:
            assert out.outputs[0].text.startswith("{")


@pytest.mark.parametrize(
    ("so", "problem"),
    [
        (StructuredOutput("json_schema", '{"type": "strin"}'), "invalid JSON schema"),
        (StructuredOutput("json_schema", "{not json"), "not JSON"),
        (StructuredOutput("json_schema", "false"), "accepts nothing"),
        (StructuredOutput("json_schema", '{"type": "string", "format": "nope"}'), "format"),
        (StructuredOutput("regex", "a(b"), "invalid regex"),
        (StructuredOutput("grammar", "start: missing_rule"), "invalid grammar"),
    ],
)
def test_a_grammar_that_does_not_compile_is_refused_at_validation(engine, so, problem):
    with pytest.raises(ValueError, match=problem) as info:
        engine.new_request("bad", _prompt(engine), _constrained(so))
    assert str(info.value).startswith("structured_output: ")
    assert not engine.has_unfinished_requests()


def test_an_engine_without_a_tokenizer_refuses_structured_outputs(tmp_path):
    from tests.engine.engine_fixtures import tiny_engine

    engine = tiny_engine(tmp_path)  # token ids only: no tokenizer in the folder
    with pytest.raises(ValueError, match="structured_output: .*tokenizer"):
        engine.new_request("x", [5, 6, 7], _constrained(StructuredOutput("json_object")))
