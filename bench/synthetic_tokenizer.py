"""A stand-in tokenizer for `random:` shapes, so a server on random weights streams text.

Contract: `synthetic_tokenizer(vocab_size, bos_id, eos_id)` returns a tgserve `Tokenizer` (tiktoken
ranks given directly, no merges) whose every id below `vocab_size` decodes to bytes: ids 0-255 the
single bytes, every later id a distinct ASCII word of a space and 2 or 3 letters or digits, so
nearly every sampled token is its own whole-character stream chunk and `tgserve bench serve`
times every token (ITL), as with a real model. Text means nothing; prompts are token ids.
"""

from __future__ import annotations

from itertools import product

from models.tokenizer import SpecialTokens, Tokenizer
from models.tokenizer.bpe_vocab import BpeVocab

ALPHABET = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
PATTERN = r" ?[A-Za-z0-9]+|\s+|[^\sA-Za-z0-9]+"


def synthetic_tokenizer(vocab_size: int, bos_id: int | None, eos_id: int | None) -> Tokenizer:
    if vocab_size > 256 + len(ALPHABET) ** 2 + len(ALPHABET) ** 3:
        raise ValueError(f"a synthetic vocabulary of {vocab_size} tokens is too large")
    tokens = {bytes([b]): b for b in range(min(256, vocab_size))}
    words = (b" " + bytes(w) for n in (2, 3) for w in product(ALPHABET, repeat=n))
    for token_id, word in zip(range(256, vocab_size), words, strict=False):
        tokens[word] = token_id
    vocab = BpeVocab("synthetic", tokens, (), (), PATTERN)
    eos = (eos_id,) if eos_id is not None else ()
    return Tokenizer(vocab, SpecialTokens(bos_id, eos), None)
