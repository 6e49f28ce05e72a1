"""Every check the engine makes on a request names its field (`InvalidRequest.field`), so the
server can answer a 400 naming the API field without reading the message. A table walks each
check on a real engine (tiny llama: vocabulary 320, context 256; no tokenizer, so the checks
that need one are met too): the field is the one the request got wrong, by construction of
each case (hand-worked against the limits below)."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequest
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from tests.checkpoints import VOCAB
from tests.engine.engine_fixtures import tiny_engine

MAX_NUM_SEQS = 4
NUM_BLOCKS = 40  # 4-token blocks of 2 KiB (see engine_fixtures): 160 tokens of KV cache
CONTEXT = 256  # the tiny checkpoint's max_position_embeddings


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("errors") / "llama"
    built = tiny_engine(folder, kv_cache_memory_bytes=NUM_BLOCKS * 2048, max_num_seqs=MAX_NUM_SEQS)
    assert built.scheduler.block_manager.num_blocks == NUM_BLOCKS
    assert built.info.max_model_len == CONTEXT and built.info.vocab_size == VOCAB
    assert built.tokenizer is None
    return built


def ids(n: int) -> list[int]:
    return [3 + i % 300 for i in range(n)]


SAMPLED = {"temperature": 1.0, "seed": 1}

# (case, prompt, SamplingParams kwargs, the field at fault)
ENGINE_CASES = [
    ("empty prompt", [], {}, "prompt"),
    ("negative prompt id", [5, -1], {}, "prompt"),
    ("prompt id past the vocabulary", [5, VOCAB], {}, "prompt"),
    ("prompt fills the context", ids(CONTEXT), {"max_tokens": 1}, "prompt"),
    ("max_tokens past the context", ids(100), {"max_tokens": 200}, "max_tokens"),
    ("logit_bias id past the vocabulary", ids(4), {"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
    ("stop token past the vocabulary", ids(4), {"stop_token_ids": (VOCAB + 3,)}, "stop_token_ids"),
    ("stop strings without a tokenizer", ids(4), {"stop": ("x",)}, "stop"),
    (
        "structured output without a tokenizer",
        ids(4),
        {"structured_output": StructuredOutput("regex", "a+")},
        "structured_output",
    ),
    (
        "beam early_stopping",
        ids(4),
        {"use_beam_search": True, "n": 2, "temperature": 0.0, "early_stopping": "sometimes"},
        "early_stopping",
    ),
    ("n wider than the batch", ids(4), {"n": MAX_NUM_SEQS + 1, **SAMPLED}, "n"),
    ("best_of wider than the batch", ids(4), {"best_of": MAX_NUM_SEQS + 1, **SAMPLED}, "best_of"),
    # 170 tokens need 43 blocks: the prompt alone does not fit in 40.
    ("prompt larger than the KV cache", ids(170), {"max_tokens": 1}, "prompt"),
    # 100 + 100 - 1 tokens need 50 blocks; the prompt alone needs 25.
    ("max_tokens past the KV cache", ids(100), {"max_tokens": 100}, "max_tokens"),
    # One sequence needs 13 blocks (20 + 30 - 1 tokens), four need 52.
    ("n past the KV cache", ids(20), {"max_tokens": 30, "n": 4, **SAMPLED}, "n"),
    (
        "best_of past the KV cache",
        ids(20),
        {"max_tokens": 30, "n": 1, "best_of": 4, **SAMPLED},
        "best_of",
    ),
]


@pytest.mark.parametrize(
    ("prompt", "kwargs", "field"),
    [case[1:] for case in ENGINE_CASES],
    ids=[case[0] for case in ENGINE_CASES],
)
def test_each_engine_check_names_its_field(engine, prompt, kwargs, field):
    params = SamplingParams(**kwargs)
    with pytest.raises(InvalidRequest) as refused:
        engine.new_request("r", prompt, params)
    assert refused.value.field == field, refused.value.message


# (SamplingParams kwargs, the field at fault): the construction-time ranges.
PARAMS_CASES = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_k": -2}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"logit_bias": {5: 101.0}}, "logit_bias"),
    ({"logit_bias": {i: 1.0 for i in range(301)}}, "logit_bias"),
    ({"stop": ("",)}, "stop"),
    ({"stop": tuple("abcdefghijklmnopq")}, "stop"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"n": 0}, "n"),
    ({"n": 3, "best_of": 2, **SAMPLED}, "best_of"),
    ({"n": 2, "temperature": 0.0}, "n"),
    ({"best_of": 2, "temperature": 0.0}, "best_of"),
    ({"seed": -1}, "seed"),
    ({"priority": 2**31}, "priority"),
]


@pytest.mark.parametrize(("kwargs", "field"), PARAMS_CASES)
def test_each_sampling_params_range_names_its_field(kwargs, field):
    with pytest.raises(InvalidRequest) as refused:
        SamplingParams(**kwargs)
    assert refused.value.field == field, refused.value.message
