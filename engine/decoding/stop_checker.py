"""Deciding, after each generated token, whether a sequence is finished and why.

Contract: `StopCriteria.from_params(params, eos_token_ids)` is built once per request.
After appending the k-th generated token (k = `num_output_tokens`, counting it), the engine
calls `finish_after_token(criteria, detokenizer, token_id, k)`, which feeds the detokenizer and
returns a `Finish` or None. Rules, in order of precedence:
- no stop of any kind while k <= min_tokens (the sampler masks stop tokens and EOS then, and
  the detokenizer does not arm stop strings before token min_tokens + 1);
- token in `stop_token_ids` -> ("stop", token_id);
- token is EOS and not `ignore_eos` -> ("stop", None), vLLM's convention for EOS;
- the detokenizer hit a stop string -> ("stop", that string);
- k == max_tokens -> ("length", None). A natural stop on the last allowed token is "stop".
A stop token's own text is not added to the output unless `include_stop_str_in_output`
(EOS usually adds none anyway, being special). On a finish, `finish_after_token` also calls
`detokenizer.finish()`, so `detokenizer.text` is then the final text (the bytes of a character
the finish cut are dropped, engine/decoding/detokenizer.py). Aborts and errors are the
engine's business, not this module's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.decoding.detokenizer import IncrementalDetokenizer
from engine.requests.sampling_params import SamplingParams
from engine.types import FINISH_REASONS


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" or "length" (see outputs.FINISH_REASONS)
    stop_reason: int | str | None = None  # stop token id or stop string; None for EOS / length

    def __post_init__(self) -> None:
        if self.reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {self.reason!r}")


@dataclass(frozen=True)
class StopCriteria:
    max_tokens: int
    min_tokens: int
    stop_token_ids: frozenset[int]
    eos_token_ids: frozenset[int]  # empty when the request ignores EOS
    include_stop_str_in_output: bool

    @classmethod
    def from_params(cls, params: SamplingParams, eos_token_ids: Sequence[int]) -> StopCriteria:
        return cls(
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            stop_token_ids=frozenset(params.stop_token_ids),
            eos_token_ids=frozenset() if params.ignore_eos else frozenset(eos_token_ids),
            include_stop_str_in_output=params.include_stop_str_in_output,
        )

    def is_stop_token(self, token_id: int, num_output_tokens: int) -> bool:
        """Whether this token, being the `num_output_tokens`-th, ends the sequence."""
        if num_output_tokens <= self.min_tokens:
            return False
        return token_id in self.stop_token_ids or token_id in self.eos_token_ids


def check_stop(
    criteria: StopCriteria, token_id: int, num_output_tokens: int, stop_string: str | None = None
) -> Finish | None:
    """The pure decision for the `num_output_tokens`-th token (see the module rules)."""
    if num_output_tokens < 1:
        raise ValueError(
            f"num_output_tokens counts the new token and must be >= 1, got {num_output_tokens}"
        )
    if num_output_tokens > criteria.min_tokens:
        if token_id in criteria.stop_token_ids:
            return Finish("stop", token_id)
        if token_id in criteria.eos_token_ids:
            return Finish("stop", None)
        if stop_string is not None:
            return Finish("stop", stop_string)
    if num_output_tokens >= criteria.max_tokens:
        return Finish("length", None)
    return None


def finish_after_token(
    criteria: StopCriteria,
    detokenizer: IncrementalDetokenizer | None,
    token_id: int,
    num_output_tokens: int,
) -> Finish | None:
    """Feeds the new token's text (unless it is a hidden stop token) and decides the finish.

    `detokenizer` may be None for sequences whose text nobody reads (stop strings then cannot
    fire). On a finish the detokenizer is finished too.
    """
    stop_string = None
    if detokenizer is not None:
        hidden = criteria.is_stop_token(token_id, num_output_tokens) and not (
            criteria.include_stop_str_in_output
        )
        if not hidden:
            detokenizer.add(token_id)
        stop_string = detokenizer.stop_string
    finish = check_stop(criteria, token_id, num_output_tokens, stop_string)
    if finish is not None and detokenizer is not None:
        detokenizer.finish()  # adds no character: a finish cannot complete a stop string
    return finish
