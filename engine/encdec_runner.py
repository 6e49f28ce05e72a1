"""EncoderDecoderRunner: the `Runner` (engine/runner.py, whose `execute` skeleton it fills in)
of an encoder-decoder model (models/encdec).

Each sequence is laid out as engine/encoder_layout.py says: an encoder region of whole blocks,
then the decoder's tokens. Per step:
1. the encoder runs once per request, as its prefill, chunked like any prefill: a chunk of the
   region pays for its share of the request's `EncoderPass` (models/encdec/staged_encoder.py:
   the encoder layer-major, a tile of rows through one layer per unit; slots s..e of a region
   of R slots run units up to e * num_units // R), so a step's encoder work follows the step's
   token budget, exceeding a chunk's share by less than one unit (TILE rows through one layer)
   per request; the passes of a step run together; the pass's staged cross K/V go into the
   region's slots of each sequence whose chunk completes the region (one, or after a
   preemption each live beam), and the pass is dropped once every live sequence has them;
2. copy-on-write copies (decoder blocks only: the region's blocks are never written twice);
3. one decoder forward over every chunk's decoder rows: self-attention over the blocks after
   the region (positions from the region's end), cross-attention over the region;
4. logits of the sampled rows, in chunk order.
Every sequence's attention reads only its own blocks (cross-attention on the CPU through the
C++ paged kernel unless `cpu_kernels` is off), and the linear layers run the CPU's
batch-invariant GEMM (models/linear_backend), so a row never depends on the rest of the batch.
Prompt logprobs are refused at intake, so `full_logits_for` is always empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.description import EngineDescription, describe_runner
from engine.host_transfer import to_device
from engine.runner import StepRunner
from engine.step_inputs import StepInputs
from models import allocate_kv_cache
from models.attention_backend import GraphSupport
from models.config import ModelConfig
from models.cpu_kernels import extension as kernel_extension
from models.encdec.attention import SeqSpans
from models.encdec.packed_linears import pack_decoder_linears
from models.encdec.staged_encoder import EncoderPass, advance
from models.linear_backend import use_invariant_linears


@dataclass(frozen=True)
class EncoderDecoderPath:
    """What the engine's reports read of a forward path (engine/description.py)."""

    description: str = "PyTorch encoder-decoder layers"
    attention_kernel: bool = False
    graph_support: GraphSupport = GraphSupport.NONE


@dataclass(frozen=True)
class DecoderStep(StepInputs):
    """A step's decoder rows: `tables` / `seq_lens` are the self-attention's (the blocks after
    the encoder region, lengths from its end), and per chunk its cross-attention's region."""

    cross_tables: tuple[tuple[int, ...], ...] = ()
    cross_lens: tuple[int, ...] = ()


class EncoderDecoderRunner(StepRunner):
    def __init__(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        sampleable_vocab: int | None = None,
        cpu_kernels: bool = True,
    ) -> None:
        self.model, self.config = model, config
        self.block_size, self.device = block_size, device
        self.sampleable_vocab = (
            sampleable_vocab if sampleable_vocab and sampleable_vocab < config.vocab_size else None
        )
        self.kv_caches = allocate_kv_cache(config, num_blocks, block_size, dtype, device)
        if device.type == "cpu":
            use_invariant_linears(model)
        # unbiased attention (cross-attention, BART's) through the C++ paged kernel, and the
        # decode rows' linears through the C++ packed one (models/encdec/packed_linears.py)
        self.cpu_kernel = cpu_kernels and device.type == "cpu"
        ext = kernel_extension() if self.cpu_kernel else None
        self.packed_bytes = pack_decoder_linears(model, ext) if ext is not None else 0
        self.forward_path = EncoderDecoderPath()
        # Requests whose encoder is under way: their pass and their preemption count then.
        self._passes: dict[Any, tuple[EncoderPass, int]] = {}

    @property
    def description(self) -> str:
        return self.forward_path.description

    def _prepare(self, chunks: Sequence[Any]) -> None:
        self._run_encoders(chunks)

    def _inputs(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]],
        full_logits_for: frozenset[int],
    ) -> DecoderStep:
        if full_logits_for:
            raise ValueError("an encoder-decoder model gives no prompt logprobs")
        return self._decoder_rows(chunks, block_copies)

    def _hidden(self, step: DecoderStep) -> torch.Tensor:
        bs, kernel, device = self.block_size, self.cpu_kernel, self.device
        spans = SeqSpans.build(
            step.tables, step.seq_lens, step.query_lens, bs, device, cpu_kernel=kernel
        )
        cross = SeqSpans.build(
            step.cross_tables, step.cross_lens, step.query_lens, bs, device, False, kernel
        )
        return self.model(  # [T, hidden]
            to_device(step.ids, torch.int64, device),
            to_device(step.positions, torch.int64, device),
            spans,
            self.kv_caches,
            cross,
        )

    # ----- the engine's hooks (engine/runner.py) -------------------------------------------
    def describe(self) -> EngineDescription:
        path = self.forward_path
        return describe_runner(self.model, self.config, self.kv_caches, path, False, 0)

    def between_requests(self, idle: Callable[[], bool]) -> bool:
        return False  # one way to run, chosen at load

    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        pass  # no tensor-parallel group

    def close(self) -> None:
        pass

    def _run_encoders(self, chunks: Sequence[Any]) -> None:
        """Advances the encoder pass of each request with a chunk in its region by the units
        the chunk's region slots pay for; writes the cross K/V of each sequence whose chunk
        completes its region; drops the passes nobody needs any more."""
        for request in [r for r, (_, gen) in self._passes.items() if _stale(r, gen)]:
            del self._passes[request]  # finished, aborted, or preempted (recomputed from 0)
        targets: dict[Any, int] = {}
        completing: list[tuple[EncoderPass, list[int]]] = []
        for chunk in chunks:
            region, request = chunk.seq.decoder_start, chunk.request
            if chunk.start >= region:
                continue
            if request not in self._passes:
                layers = self.model.encoder_num_layers
                self._passes[request] = (
                    EncoderPass(request.encoder_token_ids, layers),
                    request.num_preemptions,
                )
            encoder = self._passes[request][0]
            due = encoder.units_at(chunk.seq_len, region)
            targets[request] = max(targets.get(request, 0), due)
            if chunk.seq_len >= region:
                completing.append((encoder, chunk.seq.block_table[: region // self.block_size]))
        advance(self.model, [(self._passes[r][0], t) for r, t in targets.items()])
        for encoder, table in completing:  # one sequence; several only after a preemption
            n = encoder.length
            slots = SeqSpans.build([table], [n], [n], self.block_size, self.device).slot_mapping
            encoder.write_cross(slots, self.kv_caches)
        done = {id(chunk.seq) for chunk in chunks if chunk.seq_len >= chunk.seq.decoder_start}
        for request in targets:  # every live sequence holds its cross K/V: the pass is spent
            waiting = [s for s in request.live_seqs if s.num_computed_tokens < s.decoder_start]
            if all(id(s) in done for s in waiting):
                del self._passes[request]

    def _decoder_rows(
        self, chunks: Sequence[Any], block_copies: Sequence[tuple[int, int]]
    ) -> DecoderStep:
        ids: list[int] = []
        positions: list[int] = []
        tables, lens, query_lens, cross_tables, cross_lens, sample_rows = [], [], [], [], [], []
        for chunk in chunks:
            region = chunk.seq.decoder_start
            first, end = max(chunk.start, region), chunk.seq_len
            if end <= first:
                continue  # inside the encoder region
            table = chunk.seq.block_table
            ids.extend(chunk.input_ids[first - chunk.start :])  # (a carried input resolved)
            positions.extend(range(first - region, end - region))
            tables.append(tuple(table[region // self.block_size :]))
            lens.append(end - region)
            query_lens.append(end - first)
            cross_tables.append(tuple(table[: region // self.block_size]))
            cross_lens.append(len(chunk.request.encoder_token_ids))
            if chunk.sample:
                sample_rows.append(len(ids) - 1)
        return DecoderStep(
            ids=tuple(ids),
            positions=tuple(positions),
            tables=tuple(tables),
            seq_lens=tuple(lens),
            query_lens=tuple(query_lens),
            sample_rows=tuple(sample_rows),
            block_copies=tuple(block_copies),
            cross_tables=tuple(cross_tables),
            cross_lens=tuple(cross_lens),
        )


def _stale(request: Any, generation: int) -> bool:
    """A pass no step will advance: its request has finished (or was aborted), or was
    preempted since the pass began (it recomputes its encoder from the first unit)."""
    return request.is_finished or request.num_preemptions != generation
