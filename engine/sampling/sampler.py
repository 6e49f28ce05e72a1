"""The sampler: one batched pass from a step's logits to one next token per row.

Contract: `Sampler(eos_token_ids, seed, device)(logits [R, V] float32, rows) -> SamplerOutput`,
with `rows[i]` (a `SamplingRow`) describing logits row i. It never modifies `logits`.
Per row, in order:
  1. logit_bias is added;
  2. while fewer than `min_tokens` tokens are out, stop_token_ids (and EOS unless ignore_eos)
     are masked;
  3. repetition penalty (prompt + output), then presence / frequency penalties (output);
  4. rows under a grammar (structured outputs) get -inf on every token it does not allow (the
     `TokenMask` the engine passes, computed while the forward ran);
  5. greedy rows (temperature 0) take the argmax; the others are divided by their temperature,
     filtered by top-k, top-p, min-p (see `logits_processors`) and sampled.
Sampling inverts each row's CDF at one uniform number (O(V) additions, no per-token random
numbers; an exponential race `argmax(probs / E)` was ~10x slower on CPU). A row with its own
generator (a seeded request) draws its uniform from that generator alone, so its tokens do not
depend on what else is in the batch; the other rows share the sampler's generator. Greedy rows
never consume randomness: a seeded request's k-th draw happens at its k-th sampled token.

Logprobs are those of the model's raw distribution, `log_softmax(logits)`, before any bias,
penalty, temperature or filter (vLLM's default): the chosen token's, plus the top N best first
when the row asked for `logprobs=N`. The all-greedy batch with nothing to apply is the hot path:
one argmax, nothing else.

Host syncs: `draw` returns the step's results as device tensors (`Drawn`: the sampled ids,
and the logprobs asked for), read nothing back, so the runner floor (step_sampler.py) reads
them together with the step's other results in its one `engine.host_transfer.fetch`;
`__call__` is `draw` then one fetch of its own. Per-step tensors come from `SamplingBatch` (built on the host, moved without
waiting); nothing in between reads device data (tests/engine/test_host_syncs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.grammar.token_mask import TokenMask, row_argmax
from engine.host_transfer import fetch, to_device
from engine.sampling.inverse_cdf import sample_inverse_cdf
from engine.sampling.logits_processors import (
    apply_logit_bias,
    apply_presence_frequency,
    apply_repetition_penalty,
    filtered_probs,
    mask_tokens,
    softmax_rows,
)
from engine.sampling.sampling_batch import SamplingBatch, SamplingFilters, SamplingRow
from engine.types import TokenLogprob

_SEED_STRIDE = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, index) over seeds


def seeded_generator(
    seed: int, index: int = 0, device: torch.device | str = "cpu"
) -> torch.Generator:
    """The generator of sequence `index` of a request with `seed`; index 0 uses `seed` itself.
    The engine makes one per sequence at admission and keeps it with the request."""
    if not 0 <= seed < 2**64 or index < 0:
        raise ValueError(
            f"seed must be in [0, 2**64) and index >= 0, got seed={seed}, index={index}"
        )
    generator = torch.Generator(device=device)
    generator.manual_seed((seed + index * _SEED_STRIDE) % 2**64)
    return generator


@dataclass(frozen=True)
class Drawn:
    """A batch's draw, still on the device: `tensors()` are what `Drawn.read` takes back as
    host lists (token ids, then the logprobs' chosen / top ids / top values when asked)."""

    tokens: torch.Tensor  # [R] int64
    logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # [R], [R, N], [R, N]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.tokens, *(self.logprobs or ()))

    @staticmethod
    def read(rows: Sequence[SamplingRow], lists: Sequence) -> SamplerOutput:
        """The `SamplerOutput` of `rows` from the host lists of `tensors()`, in order."""
        token_list = lists[0]
        if len(lists) == 1:
            return SamplerOutput(tuple(token_list), (None,) * len(rows))
        return SamplerOutput(tuple(token_list), _logprobs(rows, token_list, *lists[1:]))


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: tuple[int, ...]  # [R] the next token of each row
    logprobs: tuple[TokenLogprob | None, ...]  # [R]; None for rows that did not ask


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, top_n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From `logprobs` [R, V]: the logprob of `token_ids` [R], and the top `top_n` ids and
    logprobs [R, top_n], best first. Also usable for prompt logprobs."""
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    top = logprobs.topk(min(top_n, logprobs.shape[1]), dim=-1)  # sorted descending
    return chosen, top.indices, top.values


def process_logits(
    logits: torch.Tensor, batch: SamplingBatch, with_grammar: bool = True
) -> torch.Tensor:
    """Steps 1-4 (bias, min_tokens masks, penalties, grammar; step 4 left to the caller when
    not `with_grammar`). Returns `logits` itself when no row needs any of them, else a
    processed copy: either way the caller's tensor is left intact."""
    grammar = batch.grammar if with_grammar else None
    stages = (batch.bias, batch.banned, batch.repetition, batch.presence_frequency, grammar)
    if all(stage is None for stage in stages):
        return logits
    out = logits.clone()
    if batch.bias is not None:
        apply_logit_bias(out, *batch.bias)
    if batch.banned is not None:
        mask_tokens(out, *batch.banned)
    if batch.repetition is not None:
        apply_repetition_penalty(out, *batch.repetition)
    if batch.presence_frequency is not None:
        apply_presence_frequency(out, *batch.presence_frequency)
    if grammar is not None:
        grammar.apply(out)
    return out


class Sampler:
    """Holds what is the same for every step: EOS ids and the shared (unseeded) generator."""

    def __init__(
        self,
        eos_token_ids: Sequence[int] = (),
        seed: int | None = None,
        device: torch.device | str = "cpu",
        device_side: bool | None = None,
    ) -> None:
        """`device_side`: filter without host decisions (None: off the CPU; see
        SamplingBatch). Either way a row gets the same bits."""
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = torch.device(device)
        self.device_side = device_side
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()  # nondeterministic, from the OS
        else:
            self._generator.manual_seed(seed)

    def __call__(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], grammar: TokenMask | None = None
    ) -> SamplerOutput:
        """`draw`, then its results on the host in one wait."""
        drawn = self.draw(logits, rows, grammar)
        return Drawn.read(rows, fetch(*drawn.tensors()))

    def draw(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], grammar: TokenMask | None = None
    ) -> Drawn:
        """`grammar`: the allowed tokens of the rows that sample under a grammar (step 4)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"logits must be [rows, vocab] with {len(rows)} rows, got {tuple(logits.shape)}"
            )
        batch = SamplingBatch.build(
            rows, logits.shape[1], logits.device, self.eos_token_ids, grammar, self.device_side
        )
        if batch.plain_greedy:
            return Drawn(self._argmax(logits), None)
        filters = batch.filters
        # All greedy: the grammar's masked argmax needs no masked copy of the logits (step 4).
        processed = process_logits(logits, batch, with_grammar=filters is not None)
        if filters is None:
            grammar = batch.grammar
            tokens = self._argmax(processed) if grammar is None else grammar.argmax(processed)
        elif len(filters.rows) == len(rows):
            tokens = self._sample(processed, filters, rows)
        else:
            tokens = self._argmax(processed)  # [R]; kept for the greedy rows
            sampled = self._sample(processed.index_select(0, filters.row_index), filters, rows)
            tokens.index_copy_(0, filters.row_index, sampled)
        if batch.max_logprobs is None:
            return Drawn(tokens, None)
        logprobs = gather_logprobs(softmax_rows(logits, log=True), tokens, batch.max_logprobs)
        return Drawn(tokens, logprobs)

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """[R, V] -> [R]: numpy's vectorised argmax on the CPU's way (torch's CPU kernel was
        ~10x slower, and slower still with its thread pool contended), torch's on a device."""
        on_host = not self.device_side if self.device_side is not None else logits.is_cpu
        return row_argmax(logits) if on_host and logits.is_cpu else logits.argmax(dim=-1)

    def _sample(
        self, logits: torch.Tensor, filters: SamplingFilters, rows: Sequence[SamplingRow]
    ) -> torch.Tensor:
        """Draws for the sampling rows; `logits` is [S, V], already restricted to them."""
        probs = filtered_probs(
            logits, filters.temperature, filters.top_k, filters.top_p, filters.min_p, filters.plan
        )  # [S, V]
        # One uniform per row; a row's own generator when it has one, else the shared one.
        generators = [rows[i].generator for i in filters.rows]
        uniform = torch.empty(len(generators), 1, dtype=torch.float64, device=probs.device)
        shared = [j for j, g in enumerate(generators) if g is None]
        if len(shared) == len(generators):
            uniform = torch.rand(
                len(shared), 1, dtype=torch.float64, device=probs.device, generator=self._generator
            )
        elif shared:
            draws = torch.rand(
                len(shared), 1, dtype=torch.float64, device=probs.device, generator=self._generator
            )
            uniform.index_copy_(0, to_device(shared, torch.int64, probs.device), draws)
        for j, generator in enumerate(generators):
            if generator is not None:
                uniform[j] = torch.rand(
                    1, dtype=torch.float64, device=probs.device, generator=generator
                )
        return sample_inverse_cdf(probs, uniform)


def _logprobs(
    rows: Sequence[SamplingRow],
    token_list: list[int],
    chosen_l: list[float],
    ids_l: list[list[int]],
    values_l: list[list[float]],
) -> tuple[TokenLogprob | None, ...]:
    """The rows' `TokenLogprob`s from the host lists `fetch` brought back."""
    result: list[TokenLogprob | None] = []
    for i, row in enumerate(rows):
        n = row.params.logprobs
        if n is None:
            result.append(None)
            continue
        top = tuple(zip(ids_l[i][:n], values_l[i][:n], strict=True))
        result.append(TokenLogprob(token_id=token_list[i], logprob=chosen_l[i], top=top))
    return tuple(result)
