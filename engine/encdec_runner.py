"""EncoderDecoderRunner: the model runner of an encoder-decoder model (models/encdec), with the
`ModelRunner` interface the engine steps through (`execute(chunks, block_copies,
full_logits_for) -> StepLogits`).

Each sequence is laid out as engine/encoder_layout.py says: an encoder region of whole blocks,
then the decoder's tokens. Per step:
1. copy-on-write copies (decoder blocks only: the region's blocks are never written twice);
2. the encoder runs once per request, as its prefill, chunked like any prefill: a chunk of the
   region pays for its share of the request's `EncoderPass` (models/encdec/staged_encoder.py:
   the encoder layer-major, a tile of rows through one layer per unit; slots s..e of a region
   of R slots run units up to e * num_units // R), so a step's encoder work follows the step's
   token budget, exceeding a chunk's share by less than one unit (TILE rows through one layer)
   per request; the passes of a step run together; the pass's staged cross K/V go into the
   region's slots of each sequence whose chunk completes the region (one, or after a
   preemption each live beam), and the pass is dropped once every live sequence has them;
3. one decoder forward over every chunk's decoder rows: self-attention over the blocks after
   the region (positions from the region's end), cross-attention over the region;
4. logits of the sampled rows, in chunk order.
Every sequence's attention reads only its own blocks (cross-attention on the CPU through the
C++ paged kernel unless `cpu_kernels` is off), and the linear layers run the CPU's
batch-invariant GEMM (models/linear_backend), so a row never depends on the rest of the batch.
Prompt logprobs are refused at intake, so `full_logits_for` is always empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.host_transfer import to_device
from engine.model_runner import StepLogits, copy_blocks
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


@dataclass
class _DecoderRows:
    ids: list[int]
    positions: list[int]
    self_tables: list[list[int]]
    self_lens: list[int]
    query_lens: list[int]
    cross_tables: list[list[int]]
    cross_lens: list[int]
    sample_rows: list[int]


class EncoderDecoderRunner:
    pending_path = None  # no C++ kernel path to switch to
    decode_graphs = None
    parallel = None

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

    def switch_to_pending_path(self) -> bool:
        return False

    @torch.inference_mode()
    def execute(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        full_logits_for: frozenset[int] = frozenset(),
    ) -> StepLogits:
        if full_logits_for:
            raise ValueError("an encoder-decoder model gives no prompt logprobs")
        if block_copies:
            copy_blocks(self.kv_caches, block_copies, self.device)
        self._run_encoders(chunks)
        rows = self._decoder_rows(chunks)
        vocab = self.sampleable_vocab or self.config.vocab_size
        if not rows.ids:  # only encoder-region chunks that do not complete it
            return StepLogits(torch.empty(0, vocab, device=self.device), {})
        bs = self.block_size
        kernel = self.cpu_kernel
        spans = SeqSpans.build(
            rows.self_tables, rows.self_lens, rows.query_lens, bs, self.device, cpu_kernel=kernel
        )
        cross = SeqSpans.build(
            rows.cross_tables, rows.cross_lens, rows.query_lens, bs, self.device, False, kernel
        )
        hidden = self.model(  # [T, hidden]
            to_device(rows.ids, torch.int64, self.device),
            to_device(rows.positions, torch.int64, self.device),
            spans,
            self.kv_caches,
            cross,
        )
        picked = hidden[to_device(rows.sample_rows, torch.int64, self.device)]
        return StepLogits(self.model.compute_logits(picked)[:, :vocab], {})

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

    def _decoder_rows(self, chunks: Sequence[Any]) -> _DecoderRows:
        rows = _DecoderRows([], [], [], [], [], [], [], [])
        for chunk in chunks:
            region = chunk.seq.decoder_start
            first, end = max(chunk.start, region), chunk.seq_len
            if end <= first:
                continue  # inside the encoder region
            table = chunk.seq.block_table
            rows.ids.extend(chunk.seq.token_ids[first:end])
            rows.positions.extend(range(first - region, end - region))
            rows.self_tables.append(table[region // self.block_size :])
            rows.self_lens.append(end - region)
            rows.query_lens.append(end - first)
            rows.cross_tables.append(table[: region // self.block_size])
            rows.cross_lens.append(len(chunk.request.encoder_token_ids))
            if chunk.sample:
                rows.sample_rows.append(len(rows.ids) - 1)
        return rows


def _stale(request: Any, generation: int) -> bool:
    """A pass no step will advance: its request has finished (or was aborted), or was
    preempted since the pass began (it recomputes its encoder from the first unit)."""
    return request.is_finished or request.num_preemptions != generation
