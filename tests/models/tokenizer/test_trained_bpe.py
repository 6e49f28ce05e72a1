"""The tiktoken tokenizer gives transformers' ids on byte-level BPEs trained here with GPT-2,
Llama-3 and Qwen2 pre-tokenizers (conftest.py), read from tokenizer.json, from a tiktoken-format
tokenizer.model and from a GGUF vocabulary; decode matches. transformers is the oracle."""

from __future__ import annotations

import base64
import json

import gguf
import pytest
from hypothesis import given, settings
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from models.tokenizer import load_tokenizer
from tests.models.tokenizer.corpus import TEXTS, stdlib_paragraphs, text_strategy

ADDED_TEXTS = [
    "<|endoftext|> | <|im_start|>user\nhi<|im_end|>\n<|im_end|><|im_start|>",
    "<|begin_of_text|><|eot_id|> x<|end_of_text|>y <|eot_id",
    "<x>y <x> <x>yy <tool_call>( <tool_call><|endoftext|>",
]


def _texts() -> list[str]:
    return TEXTS + ADDED_TEXTS + stdlib_paragraphs()[:200]


@pytest.fixture(scope="module")
def trained_pairs(trained) -> dict[str, tuple[object, PreTrainedTokenizerFast]]:
    """Per style: (our tokenizer, transformers' tokenizer) loaded from the same folder."""
    return {
        style: (load_tokenizer(folder), PreTrainedTokenizerFast.from_pretrained(str(folder)))
        for style, folder in trained.items()
    }


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
def test_trained_bpe_ids_match_transformers(trained_pairs, style):
    ours, hf = trained_pairs[style]
    for text in _texts():
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == hf.encode(text), text
        ids = ours.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )
    assert ours.vocab_size == len(hf)
    assert ours.special_token_ids == {i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert ours.bos_token_id == hf.bos_token_id and ours.eos_token_ids == (hf.eos_token_id,)


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
@settings(max_examples=150, deadline=None)
@given(text=text_strategy())
def test_trained_bpe_ids_match_transformers_on_random_text(trained_pairs, style, text):
    ours, hf = trained_pairs[style]
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False)


def test_ranks_are_derived_from_merges_when_ids_are_not_in_merge_order(trained, tmp_path):
    data = json.loads((trained["gpt2"] / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    merged = sorted((i for i in vocab.values() if i >= 259), reverse=True)  # after bytes, specials
    renumber = dict(zip(sorted(merged), merged, strict=True))  # reverse the merge products' ids
    data["model"]["vocab"] = {t: renumber.get(i, i) for t, i in vocab.items()}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    ours = load_tokenizer(tmp_path)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in _texts():
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        ids = ours.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )


def test_tiktoken_format_tokenizer_model_matches_tokenizer_json(trained, tmp_path):
    """A Llama-3 style folder with only tokenizer.model (base64 token + rank lines, written here
    from the tokenizer.json vocabulary) gives the ids of its tokenizer.json twin."""
    data = json.loads((trained["llama3"] / "tokenizer.json").read_text())
    unspell = {ch: b for b, ch in bytes_to_unicode().items()}
    added = {t["id"]: t for t in data["added_tokens"]}
    lines = [
        f"{base64.b64encode(bytes(unspell[c] for c in tok)).decode()} {i}"
        for tok, i in data["model"]["vocab"].items()
        if i not in added
    ]
    (tmp_path / "tokenizer.model").write_text("\n".join(lines) + "\n")
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "add_bos_token": True,
        "added_tokens_decoder": {str(i): t for i, t in added.items()},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    ours = load_tokenizer(tmp_path)
    hf = PreTrainedTokenizerFast.from_pretrained(str(trained["llama3"]))
    for text in _texts():
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == hf.encode(text), text
    assert ours.eos_token_ids == (
        hf.convert_tokens_to_ids("<|eot_id|>"),
        1,
    )  # config, then generation


def test_gguf_vocab_with_llama3_pre_tokenizer_matches_transformers(trained, tmp_path):
    data = json.loads((trained["llama3"] / "tokenizer.json").read_text())
    tokens = {i: t for t, i in data["model"]["vocab"].items()}
    types = {i: 1 for i in tokens}
    for t in data["added_tokens"]:
        tokens[t["id"]], types[t["id"]] = t["content"], 3 if t["special"] else 4
    order = sorted(tokens)
    writer = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list([tokens[i] for i in order])
    writer.add_token_types([types[i] for i in order])
    writer.add_token_merges(
        [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    )
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    ours = load_tokenizer(tmp_path / "v.gguf")
    hf = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="v.gguf")
    # transformers' GGUF loader adds GPT-2's default "<|endoftext|>" as a new token (id 1201)
    # when the vocabulary lacks it; the model never saw such a token, so leave it out.
    for text in (t for t in _texts() if "<|endoftext|>" not in t):
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == hf.encode(text), text
