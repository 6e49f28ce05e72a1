"""Readers that turn a tokenizer file into a `BpeVocab`: the byte-level BPE vocabulary, its merge
order, the added tokens and the pre-tokenizer regex a tiktoken Encoding is built from.

Contract: `read_tokenizer_json(data, source)`, `read_tiktoken_model(path, pattern)` and
`read_gguf_vocab(metadata, source)` return a frozen `BpeVocab` (token bytes -> id, merges in
priority order, added tokens, regex). Each raises `ValueError` naming the file for what tiktoken cannot express exactly: above
all SentencePiece vocabularies (Llama 2, Mistral v0.1), whose tokens are not byte-level BPE and so
cannot become tiktoken ranks (token-id prompts still work for those models), but also unknown
pre-tokenizers. A GGUF file's key/value header is read by models/gguf/header.py.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4

# Pre-tokenizer regexes. GPT-2's is what HF's ByteLevel(use_regex=True) applies.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# HF Digits(individual_digits=True) then GPT-2's regex (SmolLM2, StarCoder) as ONE regex: a digit is
# a piece of its own, and each piece between digits is split by GPT-2's regex, where a digit acts
# as the end of the text -- hence the whitespace lookahead also stops before a digit.
DIGITS_GPT2_PATTERN = (
    r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's `tokenizer.ggml.pre` names -> regex (llama-vocab.cpp groups them the same way).
GGUF_PRE_PATTERNS: dict[str, str] = {
    **dict.fromkeys(("gpt-2", "phi-2"), GPT2_PATTERN),
    **dict.fromkeys(("smollm", "starcoder", "refact"), DIGITS_GPT2_PATTERN),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe"), LLAMA3_PATTERN),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), QWEN2_PATTERN),
}


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
        "byte-level BPE, so it cannot be expressed as tiktoken ranks and tgserve has no text "
        "tokenizer for it. The model still works with token-id prompts."
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


def _vocab_bytes(spelled: dict[str, int], added_ids: set[int], source: str) -> dict[bytes, int]:
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


def _split_merges(merges: list[str | list[str]]) -> tuple[tuple[bytes, bytes], ...]:
    unspell = _unspelling()
    pairs = (m.split(" ") if isinstance(m, str) else m for m in merges)
    return tuple((_spelled_bytes(a, unspell), _spelled_bytes(b, unspell)) for a, b in pairs)


def read_tokenizer_json(data: dict[str, Any], source: str) -> BpeVocab:
    """A parsed HF `tokenizer.json` holding byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM2)."""
    model = data.get("model") or {}
    kind = model.get("type")
    pre = data.get("pre_tokenizer")
    decoder_types = _component_types(data.get("decoder"))
    if kind == "Unigram":
        raise sentencepiece_error(source, "the model is Unigram")
    if model.get("byte_fallback") or {"Metaspace", "ByteFallback"} & decoder_types:
        raise sentencepiece_error(source, "the BPE model uses byte fallback / Metaspace pieces")
    if "Metaspace" in _component_types(pre):
        raise sentencepiece_error(source, "the pre-tokenizer is Metaspace")
    if kind != "BPE":
        raise ValueError(f"{source}: a {kind!r} model is not byte-level BPE (all tgserve reads)")
    if "ByteLevel" not in _component_types(pre):
        raise ValueError(f"{source}: BPE without a ByteLevel pre-tokenizer is not byte-level BPE")

    added = tuple(
        AddedToken(int(t["id"]), t["content"], bool(t.get("special", False)))
        for t in data.get("added_tokens") or ()
    )
    return BpeVocab(
        source=source,
        tokens=_vocab_bytes(model["vocab"], {t.token_id for t in added}, source),
        merges=_split_merges(model.get("merges") or []),
        added=added,
        pattern=pattern_from_hf_pre_tokenizer(pre, source),
        nfc=_normalizer_is_nfc(data.get("normalizer"), source),
    )


def _component_types(component: dict[str, Any] | None) -> set[str]:
    """The `type` of a tokenizer.json component and of everything inside a Sequence of them."""
    if not component:
        return set()
    kinds = {component.get("type", "")}
    for inner in component.get("pretokenizers") or component.get("decoders") or ():
        kinds |= _component_types(inner)
    return kinds


def _normalizer_is_nfc(normalizer: dict[str, Any] | None, source: str) -> bool:
    kinds = _component_types(normalizer) - {"Sequence"}
    if not kinds:
        return False
    if kinds == {"NFC"}:
        return True
    if {"Prepend", "Replace"} & kinds:
        raise sentencepiece_error(source, "the normalizer rewrites spaces as SentencePiece '▁'")
    raise ValueError(f"{source}: normalizer {sorted(kinds)} is not supported (only NFC is)")


def pattern_from_hf_pre_tokenizer(pre: dict[str, Any] | None, source: str) -> str:
    """The one regex equal to a tokenizer.json pre_tokenizer, for the shapes byte-level BPE uses:
    ByteLevel(use_regex) alone; Split(Regex, isolated) then ByteLevel(no regex); Digits(individual)
    then ByteLevel(use_regex)."""
    steps = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else [pre]
    steps = [s for s in steps or () if s]
    last = steps[-1] if steps else {}
    if last.get("type") == "ByteLevel" and last.get("add_prefix_space"):
        raise ValueError(f"{source}: ByteLevel(add_prefix_space=true) is not supported")
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and last.get("use_regex", True):
        return GPT2_PATTERN
    digits = kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits")
    if digits and last.get("use_regex", True):
        return DIGITS_GPT2_PATTERN
    if kinds == ["Split", "ByteLevel"] and not last.get("use_regex", True):
        split = steps[0]
        regex = (split.get("pattern") or {}).get("Regex")
        if regex and split.get("behavior") == "Isolated" and not split.get("invert"):
            return regex
    raise ValueError(
        f"{source}: pre_tokenizer {json.dumps(pre)[:300]} has no single-regex equivalent that "
        "tgserve knows; supported: ByteLevel, Split(Regex, Isolated)+ByteLevel, Digits+ByteLevel"
    )


def read_tiktoken_model(path: Path, pattern: str) -> BpeVocab:
    """A tiktoken-format rank file (Llama-3's `tokenizer.model`): `base64(token) rank` per line.

    Added tokens are not in this file; the caller supplies them from the folder's config.
    """
    source = str(path)
    raw = path.read_bytes()
    tokens: dict[bytes, int] = {}
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (IndexError, ValueError) as exc:
            raise sentencepiece_error(
                source, f"line {number} is not 'base64-token rank' (not a tiktoken rank file)"
            ) from exc
        tokens[token] = rank
    if not tokens:
        raise ValueError(f"{source}: empty tiktoken rank file")
    return BpeVocab(source=source, tokens=tokens, merges=(), added=(), pattern=pattern)


def read_gguf_vocab(metadata: dict[str, Any], source: str) -> BpeVocab:
    """The vocabulary of a GGUF file whose `tokenizer.ggml.model` is "gpt2" (byte-level BPE)."""
    model = metadata.get("tokenizer.ggml.model")
    if model == "llama":
        raise sentencepiece_error(source, 'tokenizer.ggml.model is "llama"')
    if model != "gpt2":
        raise ValueError(f'{source}: tokenizer.ggml.model {model!r} is not supported (only "gpt2")')
    pre = metadata.get("tokenizer.ggml.pre")
    if pre not in GGUF_PRE_PATTERNS:
        known = ", ".join(sorted(GGUF_PRE_PATTERNS))
        raise ValueError(f"{source}: tokenizer.ggml.pre {pre!r} is not supported; known: {known}")
    names: list[str] = metadata.get("tokenizer.ggml.tokens") or []
    if not names:
        raise ValueError(f"{source}: no tokenizer.ggml.tokens (the file carries no vocabulary)")
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(names)
    added = tuple(
        AddedToken(i, name, special=kind == _GGUF_CONTROL)
        for i, (name, kind) in enumerate(zip(names, types, strict=True))
        if kind in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
    )
    spelled = {name: i for i, name in enumerate(names)}
    if len(spelled) != len(names):
        raise ValueError(f"{source}: tokenizer.ggml.tokens has duplicate entries")
    return BpeVocab(
        source=source,
        tokens=_vocab_bytes(spelled, {t.token_id for t in added}, source),
        merges=_split_merges(metadata.get("tokenizer.ggml.merges") or []),
        added=added,
        pattern=GGUF_PRE_PATTERNS[pre],
    )
