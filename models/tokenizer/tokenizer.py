"""Tokenizer: a model's byte-level BPE tokenizer on a tiktoken Encoding, plus its special tokens
and chat template.

Contract: `Tokenizer(vocab, specials, chat_template)` gives ids equal to the model's own
tokenizer: added/special token text in the input is matched whole (as HF does, the longest first
when one prefixes another), `encode(..., add_special_tokens=True)` adds `specials.prefix_ids` /
`suffix_ids`, `decode` drops special tokens unless asked not to, `token_bytes` gives one token's
raw bytes, `apply_chat_template` renders the model's template. Invalid ids, non-text input and
a missing template raise ValueError. Built by `load_tokenizer` (models/tokenizer/loading.py);
immutable and thread-safe.

tiktoken ranks are the token ids when the file's merge order agrees with id order (true for every
real byte-level BPE we know); otherwise ranks are derived from the merges and mapped back to ids.
Known gaps to HF: a byte with no token (SmolLM2 lacks b"\\x16") is left out of the ids as HF
does, but HF removes it before BPE, so its neighbours may merge (" \\x16{" -> "Ġ{"), and we after;
added tokens' lstrip/rstrip/single_word flags are ignored.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import tiktoken

from models.tokenizer.bpe_vocab import AddedToken, BpeVocab
from models.tokenizer.chat_template import ChatTemplate

__all__ = ["SpecialTokens", "Tokenizer", "TokenizerBase"]


@dataclass(frozen=True)
class SpecialTokens:
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...] = ()  # added by encode(add_special_tokens=True) before the text
    suffix_ids: tuple[int, ...] = ()  # ... and after it
    names: tuple[tuple[str, str], ...] = ()  # ("bos_token", "<|im_start|>"), ... for templates


class TokenizerBase:
    """What every tokenizer shares: special token ids and roles, and the chat template."""

    def __init__(
        self, specials: SpecialTokens, special_ids: frozenset[int], chat_template: str | None
    ) -> None:
        self.bos_token_id: int | None = specials.bos_token_id
        self.eos_token_ids: tuple[int, ...] = specials.eos_token_ids
        self.special_token_ids: frozenset[int] = special_ids
        # True when `decode` drops the space the first token's bytes open with (SentencePiece's
        # Metaspace / Strip decoders): text that starts without context, an encoder-decoder's
        # answer, then opens without it. Byte-level BPE keeps every byte.
        self.strips_first_space: bool = False
        names = dict(specials.names)
        self._chat_template = ChatTemplate(chat_template, names) if chat_template else None

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_token_ids

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The model's chat template (its `source`, `uses(variable)`), None when it has none."""
        return self._chat_template

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        return self._chat_template.render(messages, add_generation_prompt, **kwargs)


class Tokenizer(TokenizerBase):
    """Thread-safe and immutable after construction; see the module docstring for the contract."""

    def __init__(self, vocab: BpeVocab, specials: SpecialTokens, chat_template: str | None) -> None:
        ranks, rank_to_id = _mergeable_ranks(vocab)
        added = {t.content: t.token_id for t in vocab.added}
        if rank_to_id is not None:  # give added tokens ranks after the mergeable ones
            for content in added:
                rank_to_id.append(added[content])
                added[content] = len(rank_to_id) - 1
        try:
            self._encoding = tiktoken.Encoding(
                name=f"tgserve:{vocab.source}",
                pat_str=vocab.pattern,
                mergeable_ranks=ranks,
                special_tokens=added,
            )
        except ValueError as exc:  # e.g. a pre-tokenizer regex fancy-regex cannot parse
            raise ValueError(f"{vocab.source}: tiktoken rejected the vocabulary: {exc}") from exc
        self._rank_to_id = rank_to_id
        self._nfc = vocab.nfc
        self._specials = specials
        self._split_added = _overlap_splitter(vocab.added)
        self._bytes = {i: b for b, i in vocab.tokens.items()}
        self._bytes.update({t.token_id: t.content.encode("utf-8") for t in vocab.added})
        self.vocab_size: int = max(self._bytes) + 1
        special = frozenset(t.token_id for t in vocab.added if t.special)
        super().__init__(specials, special, chat_template)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        if self._nfc:
            text = unicodedata.normalize("NFC", text)
        if self._split_added is None:
            ranks = self._encoding.encode(text, allowed_special="all", disallowed_special=())
        else:  # added tokens that prefix one another: match the longest first, as HF does
            ranks = []
            for i, piece in enumerate(self._split_added.split(text)):
                if i % 2:
                    ranks.append(self._encoding.encode_single_token(piece))
                elif piece:
                    ranks.extend(self._encoding.encode_ordinary(piece))
        ids = ranks if self._rank_to_id is None else [self._rank_to_id[r] for r in ranks]
        if ids and max(ids) >= self.vocab_size:  # bytes the vocabulary lacks: HF drops them
            ids = [i for i in ids if i < self.vocab_size]
        if add_special_tokens:
            ids = [*self._specials.prefix_ids, *ids, *self._specials.suffix_ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        skip = self.special_token_ids if skip_special_tokens else frozenset()
        try:
            data = b"".join(self._bytes[i] for i in ids if i not in skip)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{exc.args[0]!r} is not a token id of this vocabulary") from exc
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character); special tokens give
        their text as UTF-8."""
        try:
            return self._bytes[token_id]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{token_id!r} is not a token id of this vocabulary") from exc


def _mergeable_ranks(vocab: BpeVocab) -> tuple[dict[bytes, int], list[int] | None]:
    """tiktoken ranks: the ids themselves when the merges produce tokens in increasing id order,
    else ranks in merge order plus the rank -> id table. tiktoken merges the adjacent pair whose
    concatenation has the lowest rank, so rank order must be the merges' priority order."""
    limit = 1 + max(max(vocab.tokens.values()), max((t.token_id for t in vocab.added), default=0))
    products = []
    for left, right in vocab.merges:
        for part in (left, right, left + right):
            if part not in vocab.tokens:
                raise ValueError(f"{vocab.source}: a merge uses the unknown token {part!r}")
        products.append(vocab.tokens[left + right])
    if all(a < b for a, b in zip(products, products[1:], strict=False)):
        return _with_all_bytes(dict(vocab.tokens), limit), None
    order = [bytes([b]) for b in range(256) if bytes([b]) in vocab.tokens]
    order += [left + right for left, right in vocab.merges]
    order += sorted(vocab.tokens, key=vocab.tokens.__getitem__)  # tokens no merge makes, last
    ranks: dict[bytes, int] = {}
    for token in order:
        ranks.setdefault(token, len(ranks))
    rank_to_id = [vocab.tokens[token] for token in ranks]
    ranks = _with_all_bytes(ranks, len(ranks))
    rank_to_id += range(limit, limit + len(ranks) - len(rank_to_id))
    return ranks, rank_to_id


def _with_all_bytes(ranks: dict[bytes, int], first_free: int) -> dict[bytes, int]:
    """tiktoken needs a rank for every byte; a vocabulary may lack some (SmolLM2 has no token for
    b"\\x04"). HF drops such bytes from the output, so they get phantom ids >= the vocabulary
    size, which encode() filters out."""
    for b in range(256):
        if bytes([b]) not in ranks:
            ranks[bytes([b])] = first_free
            first_free += 1
    return ranks


def _overlap_splitter(added: tuple[AddedToken, ...]) -> re.Pattern[str] | None:
    """A longest-first regex over the added tokens when one is a prefix of another (tiktoken's
    own matching would then pick either); None when tiktoken's matching is already exact."""
    ordered = sorted({t.content for t in added if t.content})
    # In sorted order a token and any token it prefixes are adjacent-or-chained, so pairs suffice.
    if not any(b.startswith(a) for a, b in zip(ordered, ordered[1:], strict=False)):
        return None
    longest_first = sorted(ordered, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(c) for c in longest_first) + ")")
