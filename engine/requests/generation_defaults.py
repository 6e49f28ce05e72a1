"""GenerationDefaults: what a model folder's generation_config.json asks of the requests that
leave a field unset (pure Python; the file is read by models/generation_config.py).

Honoured (a request that sets the field always wins):
- sampling, as vLLM takes them: `temperature`, `top_p`, `top_k`, `min_p`,
  `repetition_penalty`; `do_sample: false` set in the file makes the default greedy
  (temperature 0), as transformers' `generate` is;
- beam search, as `generate` runs it: `length_penalty`, `early_stopping` (true / false;
  "never" is not honoured), and `num_beams` as the width of a request that asks for beam
  search (`use_beam_search`) without a width (`best_of`): beam search stays opt-in, as the
  APIs define their defaults;
- length: `max_new_tokens`, else `max_length` (transformers counts the decoder's prompt in it:
  the whole prompt of a decoder-only model, the start token(s) of an encoder-decoder) bound
  `max_tokens` of a request that leaves it to the engine (the room left in the context).
Token ids (`decoder_start_token_id`, `forced_bos_token_id`, eos) reach the model's config at
loading. `NOT_HONOURED` keys set in a file are named by `ignored` (the engine logs them).

Contract: `GenerationDefaults.from_file(generation)` from the file's dict; `fill(values)` is
SamplingParams keyword values (None: unset) with the unset ones taken from the file;
`max_tokens(decoder_prompt_len)` the file's bound on max_tokens, or None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Keys that change outputs which tgserve does not apply, with the value that means "off".
NOT_HONOURED: dict[str, Any] = {
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_eos_token_id": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "penalty_alpha": None,
    "exponential_decay_length_penalty": None,
}


@dataclass(frozen=True)
class GenerationDefaults:
    sampling: Mapping[str, Any] = field(default_factory=dict)  # SamplingParams field -> value
    num_beams: int | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None
    ignored: tuple[str, ...] = ()  # NOT_HONOURED keys the file sets

    @classmethod
    def from_file(cls, generation: Mapping[str, Any]) -> GenerationDefaults:
        g = generation
        sampling = {k: g[k] for k in _SAMPLING_KEYS if g.get(k) is not None}
        if g.get("do_sample") is False:
            sampling["temperature"] = 0.0
        if g.get("length_penalty") is not None:
            sampling["length_penalty"] = float(g["length_penalty"])
        if isinstance(g.get("early_stopping"), bool):
            sampling["early_stopping"] = g["early_stopping"]
        beams = g.get("num_beams")
        ignored = [k for k, off in NOT_HONOURED.items() if g.get(k, off) not in (off, None)]
        if g.get("early_stopping") == "never":
            ignored.append("early_stopping")
        return cls(
            sampling=sampling,
            num_beams=beams if isinstance(beams, int) and beams > 1 else None,
            max_new_tokens=_positive(g.get("max_new_tokens")),
            max_length=_positive(g.get("max_length")),
            ignored=tuple(ignored),
        )

    def fill(self, values: Mapping[str, Any]) -> dict[str, Any]:
        filled = dict(values)
        for key, value in self.sampling.items():
            if filled.get(key) is None:
                filled[key] = value
        if self.num_beams and filled.get("use_beam_search") and filled.get("best_of") is None:
            filled["best_of"] = max(self.num_beams, filled.get("n") or 1)
        return filled

    def max_tokens(self, decoder_prompt_len: int) -> int | None:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if self.max_length is not None:
            return max(1, self.max_length - decoder_prompt_len)
        return None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
