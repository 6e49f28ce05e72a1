"""SentencePiece tokenizer.json files trained here (with the `tokenizers` library): Llama 2's
shape (BPE with byte fallback, "▁" spaces, `<s>` from the post-processor, a first-space-stripping
decoder), Gemma's (the same without the first "▁" and without the stripping), Metaspace BPE and
Unigram, and a folder with a Llama-2-style chat template."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from tests.models.tokenizer.corpus import MULTILINGUAL, stdlib_paragraphs

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


def corpus() -> list[str]:
    return stdlib_paragraphs()[:80] + ["Bonjour le monde, ça va très bien. Привет мир."] * 5


def llama2_json(learnt_pieces: int = 241, gemma: bool = False) -> str:
    """Llama 2's shape with 3 specials + 256 byte pieces + `learnt_pieces` trained ones.
    `gemma`: Gemma's shape instead: no "▁" put before the text, a decoder that keeps the first
    space (Phi-3's vocabulary is Llama 2's)."""
    backend = HfBackend(models.BPE(unk_token="<unk>", fuse_unk=True))
    backend.normalizer = normalizers.Sequence(
        [normalizers.Replace(" ", "▁")]
        if gemma
        else [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=3 + learnt_pieces,
        special_tokens=SPECIALS,
        limit_alphabet=40,
        show_progress=False,
    )
    backend.train_from_iterator(corpus(), trainer)
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
    strip = [] if gemma else [decoders.Strip(" ", 1, 0)]
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return backend.to_str()


def metaspace_json() -> str:
    backend = HfBackend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False)
    backend.train_from_iterator(corpus() + MULTILINGUAL, trainer)
    return backend.to_str()


def unigram_json() -> str:
    backend = HfBackend(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False
    )
    backend.train_from_iterator(corpus() + MULTILINGUAL, trainer)
    return backend.to_str()


def spm_folder(root: Path, tokenizer_json: str) -> Path:
    root.mkdir()
    (root / "tokenizer.json").write_text(tokenizer_json)
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    config["chat_template"] = LLAMA2_TEMPLATE
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root
