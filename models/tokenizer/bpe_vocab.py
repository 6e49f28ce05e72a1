"""BpeVocab: a byte-level BPE vocabulary as the files spell it, turned into bytes.

Contract: `BpeVocab` holds token bytes -> id (added tokens excluded), the merges in priority
order, the `AddedToken`s (matched whole before BPE), the pre-tokenizer regex and whether text is
NFC-normalised; a tiktoken Encoding is built from it (models/tokenizer/tokenizer.py).
`byte_decoder()` is GPT-2's byte alphabet (printable stand-in character -> byte);
`vocab_bytes(spelled, added_ids, source)` and `split_merges(merges)` turn tokens and merges
spelled in that alphabet into raw bytes (tokens outside it are taken as UTF-8 text), raising
ValueError naming the file when two tokens are the same bytes. `sentencepiece_error` is the one
message for vocabularies that are not byte-level BPE.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AddedToken:
    """A token matched whole in input text before BPE (HF `added_tokens`, GGUF control tokens)."""

    token_id: int
    content: str
    special: bool  # special tokens are dropped by decode(skip_special_tokens=True)


@dataclass(frozen=True)
class BpeVocab:
    source: str  # the file it came from, for error messages
    tokens: dict[bytes, int]  # every mergeable token's bytes -> its id (added tokens excluded)
    # The merges in priority order; () when the file gives ranks itself (tiktoken format).
    merges: tuple[tuple[bytes, bytes], ...]
    added: tuple[AddedToken, ...]
    pattern: str  # the pre-tokenizer regex, in the syntax tiktoken (fancy-regex) accepts
    nfc: bool = False  # the text is NFC-normalised before tokenizing (Qwen2)


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted: char -> byte value.

    Byte-level BPE files spell every byte as a visible character (space is 'Ġ', newline 'Ċ'):
    printable Latin-1 bytes stand for themselves, the other 68 bytes map to chr(256 + n) in order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def sentencepiece_error(source: str, why: str) -> ValueError:
    return ValueError(
        f"{source}: {why}. This is a SentencePiece vocabulary (as in Llama 2 or Mistral v0.1), not "
        "byte-level BPE, so it cannot be expressed as tiktoken ranks; tgserve reads such "
        "vocabularies from a tokenizer.json only (the model folder's, through the tokenizers "
        "library). The model still works with token-id prompts."
    )


def _unspelling() -> dict[int, int]:
    """A str.translate table turning each alphabet character into the code point of its byte, and
    every other code point below 256 into one that latin-1 cannot encode (so it is detected)."""
    table = {ord(ch): b for ch, b in byte_decoder().items()}
    return {c: table.get(c, 0x100) for c in range(256)} | table


def _spelled_bytes(token: str, unspell: dict[int, int]) -> bytes:
    """The bytes a byte-level token stands for; tokens outside the alphabet are raw UTF-8 text."""
    try:
        return token.translate(unspell).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")


def vocab_bytes(spelled: dict[str, int], added_ids: set[int], source: str) -> dict[bytes, int]:
    unspell = _unspelling()
    tokens: dict[bytes, int] = {}
    for token, token_id in spelled.items():
        if token_id in added_ids:
            continue
        raw = _spelled_bytes(token, unspell)
        if raw in tokens:
            raise ValueError(f"{source}: tokens {tokens[raw]} and {token_id} are the same bytes")
        tokens[raw] = token_id
    return tokens


def split_merges(merges: list[str | list[str]]) -> tuple[tuple[bytes, bytes], ...]:
    unspell = _unspelling()
    pairs = (m.split(" ") if isinstance(m, str) else m for m in merges)
    return tuple((_spelled_bytes(a, unspell), _spelled_bytes(b, unspell)) for a, b in pairs)
