"""What the sampler needs to know about each row, and the per-step tensors built from it.

Contract: the engine hands the sampler one `SamplingRow` per logits row (the same order).
`SamplingBatch.build` turns those rows into the tensors of one step, building only what some
row actually uses (a batch of plain greedy rows builds nothing and is flagged `plain_greedy`).
Token-history tensors (the distinct tokens seen, for the repetition penalty; output counts,
for presence and frequency) cost O(prompt + output) per row that asks for them, built from the
Python lists each step; rows that do not ask contribute nothing, so batching never changes a
row's result.

Every tensor is built from host values (Python lists; the distinct pairs and their counts with
numpy: `torch.unique` on a device has a data-dependent shape, hence a sync) and moved with
`engine.host_transfer.to_device`, which never waits for the device; what the sampler must
decide on the host (which filters run, top-k's largest k) is computed here from the host
values (`FilterPlan`). `device_side=True` (the default off the CPU) also picks the filters'
variants that decide nothing on the host (a full sort for top-p).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from engine.grammar.token_mask import TokenMask
from engine.host_transfer import to_device
from engine.sampling.logits_processors import FilterPlan


class RowParams(Protocol):
    """What the runner floor reads of a request's parameters (engine.requests' SamplingParams
    is one; the floor sits below the requests and never imports them)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    logprobs: int | None
    logit_bias: Mapping[int, float]
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    stop_token_ids: Sequence[int]
    ignore_eos: bool
    seed: int | None

    @property
    def greedy(self) -> bool: ...


@dataclass(frozen=True)
class SamplingRow:
    """One row to sample. The sequences are read, never kept or modified.

    `generator` is the request's own `torch.Generator` (on the logits' device), created once per
    sequence by the engine (see `sampler.seeded_generator`) when `params.seed` is set and kept
    across steps and preemptions; a row with a generator draws only from it.
    """

    params: RowParams
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    generator: torch.Generator | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def banned_token_ids(self, eos_token_ids: Sequence[int]) -> tuple[int, ...]:
        """Tokens that may not be sampled yet: while fewer than `min_tokens` tokens are out,
        the stop tokens, plus EOS unless `ignore_eos` (with it, EOS does not stop anyway)."""
        p = self.params
        if self.num_output_tokens >= p.min_tokens:
            return ()
        eos = () if p.ignore_eos else tuple(eos_token_ids)
        return tuple(dict.fromkeys((*p.stop_token_ids, *eos)))


@dataclass(frozen=True)
class SamplingFilters:
    """Parameters of the rows that sample (temperature > 0), in batch order."""

    rows: list[int]  # [S] batch indices of the sampling rows
    row_index: torch.Tensor  # [S] int64 on the device: the same indices
    temperature: torch.Tensor  # [S] float32, > 0
    top_k: torch.Tensor  # [S] int64, <= 0 means off; at most the vocabulary size
    top_p: torch.Tensor  # [S] float32, 1 means off
    min_p: torch.Tensor  # [S] float32, 0 means off
    plan: FilterPlan  # host facts: which filters run (no read-back from the device)

    @classmethod
    def build(
        cls,
        params: Sequence[RowParams],
        device: torch.device,
        vocab_size: int,
        device_side: bool = False,
    ) -> SamplingFilters | None:
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return None
        chosen = [params[i] for i in rows]
        # Clamped on the host: any k >= vocab keeps every token, and 2**63 would not fit int64.
        top_k = [min(p.top_k, vocab_size) for p in chosen]
        top_p = [p.top_p for p in chosen]
        min_p = [p.min_p for p in chosen]
        return cls(
            rows=rows,
            row_index=to_device(rows, torch.int64, device),
            temperature=_floats([p.temperature for p in chosen], device),
            top_k=to_device(top_k, torch.int64, device),
            top_p=to_device(top_p, torch.float32, device),
            min_p=to_device(min_p, torch.float32, device),
            plan=FilterPlan.build(top_k, top_p, min_p, vocab_size, sort_top_p=device_side),
        )


@dataclass(frozen=True)
class SamplingBatch:
    """Per-step tensors; `None` means no row of this step needs that stage."""

    num_rows: int
    plain_greedy: bool  # every row greedy with nothing to apply: argmax of the raw logits
    filters: SamplingFilters | None  # None: every row is greedy
    max_logprobs: int | None  # largest top-N asked by any row; None: no row wants logprobs
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # rows, token ids, values [E]
    banned: tuple[torch.Tensor, torch.Tensor] | None  # rows, token ids [B]
    # Penalties as distinct (row, token) pairs, [E] each: rows, token ids, then per pair the
    # repetition penalty; or the output count, presence and frequency penalties.
    repetition: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    presence_frequency: tuple[torch.Tensor, ...] | None
    grammar: TokenMask | None = None  # the allowed tokens of the rows under a grammar

    @classmethod
    def build(
        cls,
        rows: Sequence[SamplingRow],
        vocab_size: int,
        device: torch.device,
        eos_token_ids: Sequence[int] = (),
        grammar: TokenMask | None = None,
        device_side: bool | None = None,
    ) -> SamplingBatch:
        """`device_side`: decide nothing on the host while filtering (None: off the CPU)."""
        params = [r.params for r in rows]
        if device_side is None:
            device_side = device.type != "cpu"
        filters = SamplingFilters.build(params, device, vocab_size, device_side)
        asked = [p.logprobs for p in params if p.logprobs is not None]
        bias = _pairs(
            [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias.items()],
            vocab_size,
            device,
        )
        banned = _pairs(
            [(i, t, 0.0) for i, r in enumerate(rows) for t in r.banned_token_ids(eos_token_ids)],
            vocab_size,
            device,
        )
        repetition = None
        if any(p.repetition_penalty != 1.0 for p in params):
            histories = [
                [*r.prompt_token_ids, *r.output_token_ids]
                if r.params.repetition_penalty != 1.0
                else []
                for r in rows
            ]
            seen_rows, seen_ids, _ = _unique_pairs(histories, vocab_size, device)
            penalty = _floats([p.repetition_penalty for p in params], device)
            repetition = (seen_rows, seen_ids, penalty[seen_rows])
        presence_frequency = None
        if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
            outputs = [
                r.output_token_ids
                if r.params.presence_penalty or r.params.frequency_penalty
                else []
                for r in rows
            ]
            out_rows, out_ids, counts = _unique_pairs(outputs, vocab_size, device)
            presence = _floats([p.presence_penalty for p in params], device)
            frequency = _floats([p.frequency_penalty for p in params], device)
            presence_frequency = (
                out_rows,
                out_ids,
                counts,
                presence[out_rows],
                frequency[out_rows],
            )
        plain = filters is None and not asked and bias is None and banned is None
        plain = plain and repetition is None and presence_frequency is None and grammar is None
        return cls(
            num_rows=len(rows),
            plain_greedy=plain,
            filters=filters,
            max_logprobs=max(asked) if asked else None,
            bias=bias,
            banned=None if banned is None else banned[:2],
            repetition=repetition,
            presence_frequency=presence_frequency,
            grammar=grammar,
        )


def _floats(values: list[float], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.float32, device)


def _pairs(
    triples: list[tuple[int, int, float]], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    if not triples:
        return None
    for _, token_id, _ in triples:
        if not 0 <= token_id < vocab_size:
            raise ValueError(
                f"token id {token_id} (logit_bias, stop_token_ids or EOS) is outside the "
                f"vocabulary (size {vocab_size}); check the request with validate_for_vocab"
            )
    rows, ids, values = zip(*triples, strict=True)
    return (
        to_device(rows, torch.int64, device),
        to_device(ids, torch.int64, device),
        _floats(list(values), device),
    )


def _unique_pairs(
    histories: list[Sequence[int]], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct (row, token) pairs of the histories and how often each occurs: [E] each.
    Counted on the host (the histories are host lists), then moved."""
    lengths = [len(h) for h in histories]
    flat = np.fromiter((t for h in histories for t in h), dtype=np.int64, count=sum(lengths))
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(f"a token id in the history is outside the vocabulary (size {vocab_size})")
    row_of = np.repeat(np.arange(len(histories), dtype=np.int64), lengths)
    keys, counts = np.unique(row_of * vocab_size + flat, return_counts=True)  # sorted keys
    return (
        to_device(keys // vocab_size, torch.int64, device),
        to_device(keys % vocab_size, torch.int64, device),
        to_device(counts, torch.int64, device),
    )
