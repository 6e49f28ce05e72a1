"""SentencePieceTokenizer: vocabularies tiktoken cannot express, on the `tokenizers` library.

Contract: `SentencePieceTokenizer(tokenizer_json, specials, chat_template, source)` has the
interface of `Tokenizer` (models/tokenizer/tokenizer.py) for a `tokenizer.json` whose pieces are
SentencePiece's (Llama 2, Mistral v0.1, TinyLlama, Gemma: BPE with byte fallback, Metaspace
pre-tokenizers, Unigram; see `sentencepiece_reason` in models/tokenizer/bpe_sources.py).
`encode` and `decode` are the `tokenizers` library's own, so ids and text equal the model's
tokenizer (transformers wraps the same library): `encode(..., add_special_tokens=True)` adds what
the post-processor says, `decode` applies the file's decoder (which may strip the first
space). `token_bytes` gives a piece's raw bytes as a stream shows them: "▁" is a space, a
byte-fallback piece `<0xNN>` is that byte, an added token is its text; so the bytes of a
sequence's tokens, joined, are its text with the space SentencePiece puts before it
(`strips_first_space` says whether `decode` drops that space);
`encode_continuation` tokenizes text that continues other text (no such space). Invalid
ids and non-text input raise ValueError. Immutable and thread-safe (the library's encode and
decode are).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from tokenizers import Tokenizer as Backend

from models.tokenizer.tokenizer import SpecialTokens, TokenizerBase

__all__ = ["SentencePieceTokenizer"]

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE = "\u2581"  # SentencePiece's "▁"
_MARKER = "\x02"  # a control character: a byte piece of its own, merged with nothing


class SentencePieceTokenizer(TokenizerBase):
    """A `Tokenizer` on the `tokenizers` library; see the module docstring for the contract."""

    def __init__(
        self, tokenizer_json: str, specials: SpecialTokens, chat_template: str | None, source: str
    ) -> None:
        try:
            self._backend = Backend.from_str(tokenizer_json)
        except Exception as exc:  # the library raises its own Exception type
            raise ValueError(f"{source}: the tokenizers library cannot load it: {exc}") from exc
        added = self._backend.get_added_tokens_decoder()  # id -> AddedToken
        byte_fallback = bool(json.loads(tokenizer_json).get("model", {}).get("byte_fallback"))
        self.vocab_size: int = self._backend.get_vocab_size(with_added_tokens=True)
        self._bytes = [
            _piece_bytes(self._backend.id_to_token(i) or "", i in added, byte_fallback)
            for i in range(self.vocab_size)
        ]
        special = frozenset(i for i, token in added.items() if token.special)
        super().__init__(specials, special, chat_template)
        self.strips_first_space = self._decoder_strips_first_space(added)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_continuation(self, text: str) -> list[int]:
        """The ids of `text` where it continues other text: without the space SentencePiece puts
        before a text (the grammar engine tokenizes forced text, e.g. a JSON object's "{", so).
        A marker byte no piece merges with goes first; its own ids are cut off."""
        marked = self.encode(_MARKER + text)
        prefix = len(self.encode(_MARKER))
        if marked[:prefix] != self.encode(_MARKER):  # the marker merged with the text
            return self.encode(text)
        return marked[prefix:]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise ValueError(f"{i!r} is not a token id of this vocabulary")
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def _decoder_strips_first_space(self, added: dict) -> bool:
        """Asks the file's decoder: does a lone piece that opens with a space decode without it?
        (Metaspace with a prepend scheme and `Strip` decoders do; a piece's bytes keep it.)"""
        for i, raw in enumerate(self._bytes):
            if i not in added and len(raw) > 1 and raw.startswith(b" ") and raw[1:2] != b" ":
                return self._backend.decode([i], skip_special_tokens=False) == raw[1:].decode(
                    "utf-8", errors="replace"
                )
        return False

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a byte-fallback piece may be part of a character)."""
        if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
            raise ValueError(f"{token_id!r} is not a token id of this vocabulary")
        return self._bytes[token_id]


def _piece_bytes(piece: str, is_added: bool, byte_fallback: bool) -> bytes:
    if is_added:
        return piece.encode("utf-8")
    byte = _BYTE_PIECE.fullmatch(piece) if byte_fallback else None
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    return piece.replace(_SPACE, " ").encode("utf-8")
