"""A tiny o200k_harmony-shaped tokenizer folder (gpt-oss's vocabulary, scaled down), built here.

tiktoken's own `o200k_harmony` definition is the oracle for the shape: its pre-tokenizer regex
and its special tokens (read with the BPE download stubbed out: no network). The folder's
byte-level BPE is trained on standard-library prose with that regex (`BPE_SIZE` tokens), and
the specials follow in tiktoken's order, each at the BPE size + (its o200k id - 199998): the
real layout shifted down (tokenizers numbers added tokens right after the vocabulary).
tokenizer_config.json names bos <|startoftext|>, eos <|return|> and pad <|endoftext|>, as
the released folders do; generation_config.json lists <|return|>, <|endoftext|>, <|call|>.
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HfBackend

from tests.models.tokenizer.corpus import stdlib_paragraphs

BPE_SIZE = 440
FIRST_SPECIAL = 199998  # <|startoftext|> in o200k_harmony
LAST_SPECIAL = 200018  # <|endofprompt|>: the tiny vocabulary stops here


def o200k_harmony_definition() -> dict:
    """tiktoken's o200k_harmony constructor's result, its BPE ranks stubbed to {}."""
    from tiktoken_ext import openai_public

    with mock.patch.object(openai_public, "load_tiktoken_bpe", lambda *a, **k: {}):
        return openai_public.o200k_harmony()


def harmony_special_ids() -> dict[str, int]:
    """Each special token of the tiny vocabulary -> its id there."""
    specials = o200k_harmony_definition()["special_tokens"]
    return {
        text: BPE_SIZE + i - FIRST_SPECIAL
        for text, i in specials.items()
        if FIRST_SPECIAL <= i <= LAST_SPECIAL
    }


def save_harmony_tokenizer(folder: Path) -> Path:
    definition = o200k_harmony_definition()
    backend = HfBackend(models.BPE(ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(definition["pat_str"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(stdlib_paragraphs(), trainer)
    assert backend.get_vocab_size() == BPE_SIZE  # the specials' ids below rely on it
    specials = sorted(harmony_special_ids().items(), key=lambda item: item[1])
    backend.add_special_tokens([text for text, _ in specials])
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ids = harmony_special_ids()
    eos = [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder
