"""SpeculativeConfig: which proposer speculates and how far (`EngineConfig.speculative`).

Contract: frozen, validated on construction (a `ValueError` naming the flag). No torch, no
imports from the rest of the engine: engine/config.py holds one of these.
- method "ngram": prompt lookup (engine/speculative/ngram.py), n-grams of `ngram_min` ..
  `ngram_max` tokens;
- method "draft": a smaller model sharing the target's tokenizer, from `model` (a folder or
  .gguf, as --model takes).
`num_tokens` (k): tokens proposed per sequence and step; a verifying step scores k + 1 rows.
`speculative_config(method, ...)` builds one from the flags (serve and bench), None without
`--speculative`, and refuses the other speculative flags then.
"""

from __future__ import annotations

from dataclasses import dataclass

SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    model: str | None = None  # the draft model (method "draft" only)

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}"
            )
        for name, value in (
            ("num_speculative_tokens", self.num_tokens),
            ("speculative_ngram_min", self.ngram_min),
            ("speculative_ngram_max", self.ngram_max),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_tokens > 16:
            raise ValueError(
                f"num_speculative_tokens must be at most 16, got {self.num_tokens}; "
                "2 to 6 is where proposals still get accepted"
            )
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"speculative_ngram_min ({self.ngram_min}) must be <= speculative_ngram_max "
                f"({self.ngram_max})"
            )
        if (self.method == "draft") != (self.model is not None):
            raise ValueError(
                "speculative_model (a draft checkpoint) is needed with speculative 'draft' "
                "and only there"
            )


def speculative_config(
    method: str | None,
    num_tokens: int | None = None,
    ngram_min: int | None = None,
    ngram_max: int | None = None,
    model: str | None = None,
) -> SpeculativeConfig | None:
    """From the flags (None: not given, the default); None when `method` is None."""
    given = {
        "num_speculative_tokens": num_tokens,
        "speculative_ngram_min": ngram_min,
        "speculative_ngram_max": ngram_max,
        "speculative_model": model,
    }
    if method is None:
        stray = [name for name, value in given.items() if value is not None]
        if stray:
            raise ValueError(f"{stray[0]} needs speculative (ngram or draft)")
        return None
    values = {
        "num_tokens": num_tokens,
        "ngram_min": ngram_min,
        "ngram_max": ngram_max,
        "model": model,
    }
    return SpeculativeConfig(method, **{k: v for k, v in values.items() if v is not None})
