"""SentencePiece vocabularies (Llama 2 style BPE with byte fallback, Metaspace BPE, Unigram) load
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

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from models.tokenizer import SentencePieceTokenizer, load_tokenizer
from tests.models.tokenizer.corpus import MULTILINGUAL, TEXTS, stdlib_paragraphs, text_strategy

SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_PIECES = [f"<0x{b:02X}>" for b in range(256)]
# A Llama-2 style template, written for this test: system prompt folded into the first turn.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}"
    "{% endif %}{% for message in turns %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user / assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' }}"
    "{% if loop.first %}{{ system }}{% endif %}{{ message['content'].strip() + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
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


def _corpus() -> list[str]:
    return stdlib_paragraphs()[:80] + ["Bonjour le monde, ça va très bien. Привет мир."] * 5


def _llama2_json() -> str:
    backend = HfBackend(models.BPE(unk_token="<unk>", fuse_unk=True))
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=SPECIALS, limit_alphabet=80, show_progress=False
    )
    backend.train_from_iterator(_corpus(), trainer)
    data = json.loads(backend.to_str())
    # Llama 2's layout: specials, then the byte pieces, then the learnt pieces
    learnt = sorted((i, piece) for piece, i in data["model"]["vocab"].items() if i >= 3)
    pieces = SPECIALS + BYTE_PIECES + [piece for _, piece in learnt]
    data["model"]["vocab"] = {piece: i for i, piece in enumerate(pieces)}
    data["model"]["byte_fallback"] = True
    data["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate(SPECIALS)
    ]  # fmt: skip
    backend = HfBackend.from_str(json.dumps(data))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return backend.to_str()


def _metaspace_json() -> str:
    backend = HfBackend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False)
    backend.train_from_iterator(_corpus() + MULTILINGUAL, trainer)
    return backend.to_str()


def _unigram_json() -> str:
    backend = HfBackend(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False
    )
    backend.train_from_iterator(_corpus() + MULTILINGUAL, trainer)
    return backend.to_str()


def _folder(root: Path, tokenizer_json: str) -> Path:
    root.mkdir()
    (root / "tokenizer.json").write_text(tokenizer_json)
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    config["chat_template"] = LLAMA2_TEMPLATE
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[SentencePieceTokenizer, PreTrainedTokenizerFast]]:
    """Per style: (ours from the folder, transformers' from the same tokenizer.json)."""
    root = tmp_path_factory.mktemp("spm")
    built = {"llama2": _llama2_json(), "metaspace": _metaspace_json(), "unigram": _unigram_json()}
    out = {}
    for style, text in built.items():
        folder = _folder(root / style, text)
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


@pytest.mark.parametrize("style", ["llama2", "metaspace", "unigram"])
def test_ids_and_text_match_transformers_on_many_scripts(pairs, style):
    ours, hf = pairs[style]
    assert isinstance(ours, SentencePieceTokenizer)
    for text in [*TEXTS, *(message["content"] for message in CHATS[1])]:
        _same(ours, hf, text)
    assert ours.vocab_size == len(hf)
    assert (ours.bos_token_id, ours.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))
    assert ours.special_token_ids == {i for i, t in hf.added_tokens_decoder.items() if t.special}


@pytest.mark.parametrize("style", ["llama2", "metaspace", "unigram"])
@settings(max_examples=100, deadline=None)
@given(text=text_strategy())
def test_ids_and_text_match_transformers_on_random_text(pairs, style, text):
    _same(*pairs[style], text)


@settings(max_examples=150, deadline=None)
@given(text=text_strategy())
def test_llama2_pieces_spell_the_text_byte_for_byte(pairs, text):
    assume(not any(special in text for special in SPECIALS))  # those are matched whole
    ours, _ = pairs["llama2"]
    ids = ours.encode(text)
    spelled = b"".join(ours.token_bytes(i) for i in ids)
    assert spelled == ((" " + text) if text else "").encode("utf-8")


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
