"""SentencePiece vocabularies (Llama 2 and Gemma style BPE with byte fallback, Metaspace BPE,
Unigram) load
from tokenizer.json on the `tokenizers` library and match transformers.

The vocabularies are trained here. The Llama 2 one has Llama 2's shape: "▁" for spaces through
its normalizer, the 256 byte pieces `<0x00>`..`<0xFF>` at ids 3..258 for characters its pieces
lack, `<s>` added by the post-processor, a decoder that strips the first space, and a Llama-2
style chat template. Oracles: transformers' `PreTrainedTokenizerFast(tokenizer_file=...)` (ids,
decoded text, the rendered and tokenized chat) on hand-written sentences in many scripts and on
hypothesis text; for `token_bytes`, the text itself: the pieces' bytes, joined, are the text
with the space SentencePiece puts before it.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from transformers import PreTrainedTokenizerFast

from models.tokenizer import SentencePieceTokenizer, load_tokenizer
from tests.models.tokenizer.corpus import TEXTS, text_strategy
from tests.models.tokenizer.spm_files import (
    LLAMA2_TEMPLATE,
    SPECIALS,
    llama2_json,
    metaspace_json,
    spm_folder,
    unigram_json,
)

CHATS = [
    [{"role": "user", "content": "Bonjour, ça va ?"}],
    [
        {"role": "system", "content": "Réponds en une phrase. Отвечай кратко."},
        {"role": "user", "content": "你好，世界！こんにちは"},
        {"role": "assistant", "content": "  안녕하세요 👋  "},
        {"role": "user", "content": "مرحبا بالعالم — नमस्ते दुनिया\n\tΓειά σου"},
    ],
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[SentencePieceTokenizer, PreTrainedTokenizerFast]]:
    """Per style: (ours from the folder, transformers' from the same tokenizer.json)."""
    root = tmp_path_factory.mktemp("spm")
    built = {
        "llama2": llama2_json(),
        "gemma": llama2_json(gemma=True),
        "metaspace": metaspace_json(),
        "unigram": unigram_json(),
    }
    out = {}
    for style, text in built.items():
        folder = spm_folder(root / style, text)
        hf = PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"),
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            chat_template=LLAMA2_TEMPLATE,
        )
        out[style] = (load_tokenizer(folder), hf)
    return out


def _same(ours: SentencePieceTokenizer, hf: PreTrainedTokenizerFast, text: str) -> None:
    ids = ours.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False), text
    assert ours.encode(text, add_special_tokens=True) == hf.encode(text), text
    with_specials = [ours.bos_token_id, *ids, *ours.eos_token_ids]
    for skip in (True, False):
        assert ours.decode(with_specials, skip_special_tokens=skip) == hf.decode(
            with_specials, skip_special_tokens=skip
        ), text


@pytest.mark.parametrize("style", ["llama2", "gemma", "metaspace", "unigram"])
def test_ids_and_text_match_transformers_on_many_scripts(pairs, style):
    ours, hf = pairs[style]
    assert isinstance(ours, SentencePieceTokenizer)
    for text in [*TEXTS, *(message["content"] for message in CHATS[1])]:
        _same(ours, hf, text)
    assert ours.vocab_size == len(hf)
    assert (ours.bos_token_id, ours.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))
    assert ours.special_token_ids == {i for i, t in hf.added_tokens_decoder.items() if t.special}


@pytest.mark.parametrize("style", ["llama2", "gemma", "metaspace", "unigram"])
@settings(max_examples=100, deadline=None)
@given(text=text_strategy())
def test_ids_and_text_match_transformers_on_random_text(pairs, style, text):
    _same(*pairs[style], text)


@settings(max_examples=150, deadline=None)
@given(text=text_strategy())
def test_llama2_pieces_spell_the_text_byte_for_byte(pairs, text):
    assume(not any(special in text for special in SPECIALS))  # those are matched whole
    # SentencePiece writes a space as "▁": a literal "▁" in the text reads back as a space (the
    # library's own decode says so too), so the text cannot hold one and be spelled back.
    assume("\u2581" not in text)
    ours, _ = pairs["llama2"]
    ids = ours.encode(text)
    spelled = b"".join(ours.token_bytes(i) for i in ids)
    assert spelled == ((" " + text) if text else "").encode("utf-8")


@settings(max_examples=100, deadline=None)
@given(text=text_strategy())
def test_gemma_pieces_spell_the_text_without_a_leading_space(pairs, text):
    assume(not any(special in text for special in SPECIALS) and "\u2581" not in text)
    ours, _ = pairs["gemma"]
    assert not ours.strips_first_space
    assert b"".join(ours.token_bytes(i) for i in ours.encode(text)) == text.encode("utf-8")


@settings(max_examples=100, deadline=None)
@given(text=text_strategy())
def test_text_continuing_an_answer_gets_no_leading_space(pairs, text):
    # what the grammar engine tokenizes forced text with (a JSON object's "{" mid-answer)
    assume(not any(special in text for special in SPECIALS))
    ours, _ = pairs["llama2"]
    ids = ours.encode_continuation(text)
    assert b"".join(ours.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_llama2_byte_fallback_covers_characters_the_pieces_lack(pairs):
    ours, hf = pairs["llama2"]
    ids = ours.encode("ab 😀 ꙮ")
    fallback = [i for i in ids if 3 <= i < 259]
    assert [ours.token_bytes(i) for i in fallback] == list(
        bytes([b]) for b in "😀ꙮ".encode()
    )  # every byte of the characters no piece holds, as <0xNN> pieces
    assert hf.decode(ids) == ours.decode(ids) == "ab 😀 ꙮ"


@pytest.mark.parametrize("messages", CHATS)
def test_a_llama2_chat_renders_and_tokenizes_as_transformers_does(pairs, messages):
    ours, hf = pairs["llama2"]
    text = ours.apply_chat_template(messages, add_generation_prompt=False)
    assert text == hf.apply_chat_template(messages, tokenize=False)
    expected = hf.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert ours.encode(text) == list(expected)
    assert text.count("[INST]") == sum(m["role"] == "user" for m in messages)
    with pytest.raises(ValueError, match="alternate"):
        ours.apply_chat_template([messages[-1], messages[-1]])


def test_invalid_ids_are_value_errors(pairs):
    ours, _ = pairs["llama2"]
    for bad in (-1, ours.vocab_size, "3"):
        with pytest.raises(ValueError):
            ours.decode([bad])
        with pytest.raises(ValueError):
            ours.token_bytes(bad)
    with pytest.raises(ValueError):
        ours.encode(b"bytes")
