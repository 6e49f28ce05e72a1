"""The byte-level BPEs trained here (GPT-2, Llama-3 and Qwen2 pre-tokenizers), saved as Hugging
Face folders once per session for the tokenizer tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HfBackend

from tests.models.tokenizer.corpus import MULTILINGUAL, stdlib_paragraphs

# The pre-tokenizer regexes as published in Llama-3's and Qwen2's tokenizer.json.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _train(folder: Path, style: str) -> Path:
    """A small byte-level BPE like GPT-2's, Llama-3's or Qwen2's, saved as a HF folder."""
    specials = {
        "gpt2": ["<|endoftext|>", "<x>", "<x>y"],  # "<x>" prefixes "<x>y": longest match wins
        "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    }[style]
    backend = HfBackend(models.BPE(ignore_merges=style != "gpt2"))
    if style == "gpt2":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        split = LLAMA3_SPLIT if style == "llama3" else QWEN2_SPLIT
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if style == "qwen2":
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(stdlib_paragraphs() + MULTILINGUAL, trainer)
    if style == "llama3":
        backend.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.add_tokens(["<tool_call>"])  # an added token that is not special
    folder.mkdir(parents=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {"bos_token": specials[0], "eos_token": specials[-1 if style != "gpt2" else 0]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bpe")
    return {style: _train(root / style, style) for style in ("gpt2", "llama3", "qwen2")}
