"""Pre-tokenizer regexes: the one regex tiktoken splits text with before BPE, per tokenizer.

Contract: `GPT2_PATTERN`, `DIGITS_GPT2_PATTERN`, `LLAMA3_PATTERN`, `QWEN2_PATTERN` and
`O200K_PATTERN` (o200k_base / o200k_harmony: GPT-4o, gpt-oss) are written
in the syntax tiktoken (fancy-regex) accepts; `GGUF_PRE_PATTERNS` maps llama.cpp's
`tokenizer.ggml.pre` names to them; `pattern_from_hf_pre_tokenizer(pre, source)` gives the regex
equal to a tokenizer.json pre_tokenizer, or raises ValueError naming the file for a shape that
has no single-regex equivalent.
"""

from __future__ import annotations

import json
from typing import Any

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
# o200k (gpt-oss's o200k_harmony, GPT-4o): cased words keep their case run, digits in threes,
# punctuation runs take trailing newlines and slashes.
O200K_PATTERN = "|".join(
    (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    )
)
# llama.cpp's `tokenizer.ggml.pre` names -> regex (llama-vocab.cpp groups them the same way).
GGUF_PRE_PATTERNS: dict[str, str] = {
    **dict.fromkeys(("gpt-2", "phi-2"), GPT2_PATTERN),
    **dict.fromkeys(("smollm", "starcoder", "refact"), DIGITS_GPT2_PATTERN),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe"), LLAMA3_PATTERN),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), QWEN2_PATTERN),
    "gpt-4o": O200K_PATTERN,  # what llama.cpp writes for gpt-oss
}


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
