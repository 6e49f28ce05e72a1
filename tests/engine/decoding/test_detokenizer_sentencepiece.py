"""An answer that continues no text (an encoder-decoder's) reads as `tokenizer.decode` of its ids.

SentencePiece decoders (Metaspace with a prepend scheme, Llama 2's `Strip`) drop the space the
first piece opens with; a continuation's pieces keep it (it separates them from the prompt).
Oracle: transformers' fast tokenizer over the same tokenizer.json, decoding the whole output at
once; and, for a decoder that strips nothing (Metaspace "never"), the pieces' bytes joined.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from transformers import PreTrainedTokenizerFast

from engine.decoding.detokenizer import IncrementalDetokenizer
from engine.requests.sampling_params import SamplingParams
from models.tokenizer import load_tokenizer
from tests.devices import default_model_here
from tests.models.tokenizer.corpus import TEXTS, text_strategy
from tests.models.tokenizer.spm_files import llama2_json, metaspace_json, spm_folder, unigram_json


def _never_strips(tokenizer_json: str) -> str:
    data = json.loads(tokenizer_json)
    data["decoder"]["prepend_scheme"] = "never"
    return json.dumps(data)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm-detok")
    metaspace = metaspace_json()
    built = {
        "llama2": llama2_json(),
        "metaspace": metaspace,
        "unigram": unigram_json(),
        "metaspace-never": _never_strips(metaspace),
    }
    out = {}
    for style, text in built.items():
        folder = spm_folder(root / style, text)
        hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        out[style] = (load_tokenizer(folder), hf)
    return out


def _detokenize(tokenizer, ids: list[int], without_context: bool) -> tuple[str, str]:
    """(the text streamed piece by piece, the final text)."""
    detok = IncrementalDetokenizer.from_params(
        tokenizer, SamplingParams(max_tokens=1), without_context=without_context
    )
    streamed = ""
    for token in ids:
        detok.add(token)
        streamed += detok.take_new_text()
    final = detok.finish()
    return streamed + detok.take_new_text(), final


@pytest.mark.parametrize("style", ["llama2", "metaspace", "unigram", "metaspace-never"])
def test_strips_first_space_as_the_tokenizer_decodes(pairs, style):
    ours, hf = pairs[style]
    assert ours.strips_first_space == (style != "metaspace-never")
    opened_with_space = 0
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False)
        streamed, final = _detokenize(ours, ids, without_context=True)
        assert final == streamed == hf.decode(ids, skip_special_tokens=True), text
        joined = b"".join(ours.token_bytes(i) for i in ids).decode("utf-8", errors="replace")
        opened_with_space += joined.startswith(" ") and ours.strips_first_space
        # A continuation keeps every piece's bytes, the first space included.
        assert _detokenize(ours, ids, without_context=False)[1] == joined.rstrip("\ufffd")
    if style != "metaspace-never":
        assert opened_with_space > 0  # the case the strip is for did occur


@settings(max_examples=60, deadline=None)
@given(text=text_strategy())
def test_any_text_reads_as_decode_without_context(pairs, text):
    for ours, hf in pairs.values():
        ids = hf.encode(text, add_special_tokens=False)
        assert _detokenize(ours, ids, without_context=True)[1] == hf.decode(
            ids, skip_special_tokens=True
        ), text


def test_byte_level_bpe_strips_nothing():
    """GPT-2-style byte-level BPE keeps every byte: its answer keeps its first space."""
    tokenizer = load_tokenizer(default_model_here())
    ids = tokenizer.encode(" Hello world")
    assert tokenizer.strips_first_space is False
    assert _detokenize(tokenizer, ids, without_context=True)[1] == tokenizer.decode(ids)
    assert tokenizer.decode(ids) == " Hello world"
