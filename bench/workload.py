"""Seeded request sets for the benchmarks: every backend gets exactly the same requests.

Contract: `make_workload(spec, vocab_size, tokenizer)` returns `num_requests` `BenchRequest`s and
is a pure function of its arguments (the same spec and seed give the same token ids, lengths and
order on every machine: it draws from `random.Random(seed)`, never from global state).
- `fixed`: every prompt has `input_len` tokens and every request decodes `output_len` tokens.
- `uniform`: lengths drawn uniformly from `[len * (1 - range_ratio), len * (1 + range_ratio)]`
  (at least 1), independently for input and output, as `vllm bench`'s random data set does.
- `text`: prompts are real text, one per non-empty line of `dataset` (a UTF-8 file), tokenized
  with the model's tokenizer and cut to at most `input_len` tokens; lines are sampled without
  replacement (with replacement once the file runs out); outputs decode `output_len` tokens.
Random prompt token ids are drawn uniformly from `[0, vocab_size)`.
Every `long_prompt_every`-th request (1-based: requests K, 2K, ...) gets a `long_prompt_len`
prompt instead: the steady arrival of long prompts that chunked prefill must absorb.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DISTRIBUTIONS = ("fixed", "uniform", "text")


class _Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: tuple[int, ...]
    output_len: int  # tokens every backend decodes (EOS ignored)
    prompt_text: str | None = None  # the text behind the ids, for text data sets
    temperature: float = 0.0  # 0: greedy; > 0 sampled, seeded (`bench latency --temperature`)
    seed: int | None = None  # the request's own seed when sampled


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    input_len: int
    output_len: int
    dist: str = "fixed"
    seed: int = 0
    range_ratio: float = 0.5
    dataset: Path | None = None
    long_prompt_every: int = 0  # 0: no long prompts
    long_prompt_len: int = 0

    def __post_init__(self) -> None:
        for name in ("num_requests", "input_len", "output_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be a positive integer, got {value!r}"
                )
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"--dist must be one of {', '.join(DISTRIBUTIONS)}, got {self.dist!r}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"--range-ratio must be in [0, 1), got {self.range_ratio}")
        if self.dist == "text" and self.dataset is None:
            raise ValueError(
                "--dist text needs --dataset FILE (a UTF-8 text file, one prompt per line)"
            )
        if self.long_prompt_every < 0 or (self.long_prompt_every and self.long_prompt_len < 1):
            raise ValueError(
                "--long-prompt-every K needs K >= 1 and a positive --long-prompt-len L "
                f"(got K={self.long_prompt_every}, L={self.long_prompt_len})"
            )

    def max_request_len(self) -> int:
        """An upper bound on prompt + output tokens of any request this spec makes."""
        scale = 1 + self.range_ratio if self.dist == "uniform" else 1
        prompt = max(
            int(self.input_len * scale), self.long_prompt_len if self.long_prompt_every else 0
        )
        return prompt + int(self.output_len * scale)


def make_workload(
    spec: WorkloadSpec, vocab_size: int, tokenizer: _Encoder | None = None
) -> list[BenchRequest]:
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    rng = random.Random(spec.seed)
    if spec.dist == "text":
        requests = _text_requests(spec, rng, tokenizer)
    else:
        requests = [
            BenchRequest(
                _random_ids(rng, _length(rng, spec, spec.input_len), vocab_size),
                _length(rng, spec, spec.output_len),
            )
            for _ in range(spec.num_requests)
        ]
    if spec.long_prompt_every:
        long_rng = random.Random(spec.seed + 1)  # long prompts leave the ordinary ones unchanged
        requests = [
            BenchRequest(_random_ids(long_rng, spec.long_prompt_len, vocab_size), r.output_len)
            if (i + 1) % spec.long_prompt_every == 0
            else r
            for i, r in enumerate(requests)
        ]
    return requests


def _length(rng: random.Random, spec: WorkloadSpec, mean: int) -> int:
    if spec.dist != "uniform":
        return mean
    low = max(1, int(mean * (1 - spec.range_ratio)))
    high = max(low, int(mean * (1 + spec.range_ratio)))
    return rng.randint(low, high)


def _random_ids(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab_size) for _ in range(length))


def _text_requests(
    spec: WorkloadSpec, rng: random.Random, tokenizer: _Encoder | None
) -> list[BenchRequest]:
    if tokenizer is None:
        raise ValueError("--dist text needs the model's tokenizer, and this model has none")
    path = Path(spec.dataset or "")
    if not path.is_file():
        raise FileNotFoundError(f"--dataset {path}: no such file")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"--dataset {path} holds no non-empty line to use as a prompt")
    order: list[str] = []
    while len(order) < spec.num_requests:  # without replacement, then again from a new shuffle
        batch = list(lines)
        rng.shuffle(batch)
        order.extend(batch)
    requests = []
    for text in order[: spec.num_requests]:
        ids = tokenizer.encode(text)[: spec.input_len]  # a stripped non-empty line has tokens
        requests.append(BenchRequest(tuple(ids), spec.output_len, tokenizer.decode(ids)))
    return requests
