"""The grammar engine's view of the model's vocabulary: raw bytes per token id, and EOS.

Contract: `grammar_tokenizer(tokenizer, vocab_size, eos_token_ids)` returns an
`llguidance.LLTokenizer` with exactly `vocab_size` entries (the width of the logits rows the
sampler sees), built from `tokenizer.token_bytes(i)` (raw bytes, possibly part of a UTF-8
character; special tokens flagged as special, so text never matches them) for every id the
tokenizer knows, and an empty (never allowed) entry for padded ids past it. `eos_token_ids`
(the engine's: tokenizer and model EOS merged) are the tokens a finished grammar allows.
Building it walks the vocabulary once (~0.15 s for 49k tokens): the engine does it once.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance


class _VocabularyView:
    """The duck type `llguidance.TokenizerWrapper` reads; `__call__` tokenizes text (llguidance
    uses it to tokenize forced text, e.g. the fixed prefix of a JSON object)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        known = tokenizer.vocab_size
        self.tokens = [tokenizer.token_bytes(i) if i < known else b"" for i in range(vocab_size)]
        self.special_token_ids = sorted(i for i in tokenizer.special_token_ids if i < vocab_size)
        self.eos_token_id = eos_token_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        # forced text continues the answer: a SentencePiece tokenizer must not put its leading
        # space before it (models/tokenizer/sentencepiece.py); byte-level BPE has no such space
        encode = getattr(self._tokenizer, "encode_continuation", self._tokenizer.encode)
        return encode(text)


def grammar_tokenizer(
    tokenizer, vocab_size: int, eos_token_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    if not eos_token_ids:
        raise ValueError("structured outputs need an end-of-sequence token; the model has none")
    view = _VocabularyView(tokenizer, vocab_size, eos_token_ids)
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(view), n_vocab=vocab_size, eos_token=list(eos_token_ids)
    )
