"""The tokenizers of the encoder-decoder families load from their Hugging Face folders and give
the ids and text transformers gives on the same folder: T5's SentencePiece Unigram (whitespace
split + Metaspace, `</s>` appended by the post-processor; on the `tokenizers` library) and
BART's byte-level BPE (`<s> ... </s>` from a RobertaProcessing post-processor; on tiktoken).

The vocabularies are trained here (tests/encdec_checkpoints.py), shaped as t5-small's and
bart-base's tokenizer.json are, and saved with transformers' own T5Tokenizer / BartTokenizerFast. Oracle: `AutoTokenizer` on the
saved folder (ids with and without special tokens, decoded text, eos) on sentences in many
scripts and on hypothesis text.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from models.tokenizer import load_tokenizer
from tests.encdec_checkpoints import save_encdec_tokenizer
from tests.models.tokenizer.corpus import TEXTS, text_strategy


@pytest.fixture(scope="module", params=["t5", "bart"])
def pair(request, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = save_encdec_tokenizer(request.param, tmp_path_factory.mktemp(request.param))
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


def _same(ours, hf, text: str) -> None:
    for special in (True, False):
        want = hf(text, add_special_tokens=special)["input_ids"]
        assert ours.encode(text, add_special_tokens=special) == want, (text, special)
    ids = hf(text)["input_ids"]
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_ids_and_text_match_transformers(pair):
    ours, hf = pair
    for text in [*TEXTS, "translate English to German: The house is wonderful."]:
        _same(ours, hf, text)


@settings(max_examples=60)
@given(text=text_strategy())
def test_ids_and_text_match_transformers_on_random_text(pair, text):
    _same(*pair, text)


def test_eos_is_the_models(pair):
    ours, hf = pair
    assert ours.eos_token_ids[0] == hf.eos_token_id
    assert hf.eos_token_id in ours.special_token_ids
