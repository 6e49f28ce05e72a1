"""Readers that turn a tokenizer file into a `BpeVocab` (models/tokenizer/bpe_vocab.py): the
byte-level BPE vocabulary, its merge order, the added tokens and the pre-tokenizer regex
(models/tokenizer/patterns.py) a tiktoken Encoding is built from.

Contract: `read_tokenizer_json(data, source)`, `read_tiktoken_model(path, pattern)` and
`read_gguf_vocab(metadata, source)` return a frozen `BpeVocab`. Each raises `ValueError` naming
the file for what tiktoken cannot express exactly: above all SentencePiece vocabularies (Llama 2,
Mistral v0.1), whose tokens are not byte-level BPE and so cannot become tiktoken ranks, but also
unknown pre-tokenizers. `sentencepiece_reason(data)` tells a SentencePiece `tokenizer.json`
apart, which the loader gives to models/tokenizer/sentencepiece.py instead (a SentencePiece
protobuf `tokenizer.model` or a GGUF "llama" vocabulary stays refused: token-id prompts work). A GGUF file's key/value
header is read by models/gguf/header.py.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from models.tokenizer.bpe_vocab import (
    AddedToken,
    BpeVocab,
    sentencepiece_error,
    split_merges,
    vocab_bytes,
)
from models.tokenizer.patterns import GGUF_PRE_PATTERNS, pattern_from_hf_pre_tokenizer

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4


def sentencepiece_reason(data: dict[str, Any]) -> str | None:
    """Why a parsed `tokenizer.json` holds SentencePiece pieces rather than byte-level BPE (so
    models/tokenizer/sentencepiece.py loads it), or None."""
    model = data.get("model") or {}
    if model.get("type") == "Unigram":
        return "the model is Unigram"
    if model.get("byte_fallback") or {"Metaspace", "ByteFallback"} & _component_types(
        data.get("decoder")
    ):
        return "the BPE model uses byte fallback / Metaspace pieces"
    if "Metaspace" in _component_types(data.get("pre_tokenizer")):
        return "the pre-tokenizer is Metaspace"
    if {"Prepend", "Replace"} & _component_types(data.get("normalizer")):
        return "the normalizer rewrites spaces as SentencePiece '▁'"
    return None


def read_tokenizer_json(data: dict[str, Any], source: str) -> BpeVocab:
    """A parsed HF `tokenizer.json` holding byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM2)."""
    model = data.get("model") or {}
    kind = model.get("type")
    pre = data.get("pre_tokenizer")
    why = sentencepiece_reason(data)
    if why is not None:
        raise sentencepiece_error(source, why)
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
        tokens=vocab_bytes(model["vocab"], {t.token_id for t in added}, source),
        merges=split_merges(model.get("merges") or []),
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
    raise ValueError(f"{source}: normalizer {sorted(kinds)} is not supported (only NFC is)")


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
        tokens=vocab_bytes(spelled, {t.token_id for t in added}, source),
        merges=split_merges(metadata.get("tokenizer.ggml.merges") or []),
        added=added,
        pattern=GGUF_PRE_PATTERNS[pre],
    )
