"""gpt-oss's o200k_harmony vocabulary loads from a folder's tokenizer.json into tiktoken (no
download): on a tiny harmony-shaped folder (harmony_vocab.py) our ids, decoding and special
tokens equal transformers' tokenizer of the same folder, and our o200k regex is tiktoken's."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from models.tokenizer import load_tokenizer
from models.tokenizer.patterns import GGUF_PRE_PATTERNS, O200K_PATTERN
from tests.models.tokenizer.corpus import TEXTS
from tests.models.tokenizer.harmony_vocab import (
    harmony_special_ids,
    o200k_harmony_definition,
    save_harmony_tokenizer,
)

HARMONY_TEXTS = [
    "<|start|>system<|message|>You are ChatGPT.\nReasoning: high<|end|>",
    "<|start|>assistant<|channel|>analysis<|message|>Think: 12345 / 678.<|end|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>',
    "<|channel|>final<|message|>It's SUNNY in Paris/Lyon!<|return|><|endoftext|>",
    "x<|start|y <|reserved_200000|> <|endofprompt|> <|startoftext|>",
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = save_harmony_tokenizer(tmp_path_factory.mktemp("harmony"))
    return load_tokenizer(folder), PreTrainedTokenizerFast.from_pretrained(str(folder))


def test_o200k_pattern_is_tiktokens() -> None:
    assert o200k_harmony_definition()["pat_str"] == O200K_PATTERN
    assert GGUF_PRE_PATTERNS["gpt-4o"] == O200K_PATTERN


def test_ids_and_text_equal_transformers(pair) -> None:
    ours, hf = pair
    for text in TEXTS + HARMONY_TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )


def test_special_tokens_at_harmony_ids(pair) -> None:
    ours, hf = pair
    ids = harmony_special_ids()
    for text in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                 "<|return|>", "<|call|>", "<|endoftext|>", "<|startoftext|>"):  # fmt: skip
        assert ours.encode(text) == [ids[text]] == [hf.convert_tokens_to_ids(text)]
    assert ids["<|start|>"] - ids["<|startoftext|>"] == 200006 - 199998  # o200k's offsets
    assert ours.special_token_ids == {i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert ours.bos_token_id == ids["<|startoftext|>"]
    assert ours.eos_token_ids == (ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"])
