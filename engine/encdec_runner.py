"""EncoderDecoderRunner: the model runner of an encoder-decoder model (models/encdec), with the
`ModelRunner` interface the engine steps through (`execute(chunks, block_copies,
full_logits_for) -> StepLogits`).

Each sequence is laid out as engine/encoder_layout.py says: an encoder region of whole blocks,
then the decoder's tokens. Per step:
1. copy-on-write copies (decoder blocks only: the region's blocks are never written twice);
2. the encoder runs once per request whose chunk completes its region this step (earlier
   chunks inside the region compute nothing: a bidirectional encoder needs its whole input),
   one flat batch over those requests; its output's cross K/V go into the region's slots of
   every such sequence of the request (one, or after a preemption each live beam);
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
from models.encdec.attention import SeqSpans
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
        # unbiased attention (cross-attention, BART's) through the C++ paged kernel
        self.cpu_kernel = cpu_kernels and device.type == "cpu"
        self.forward_path = EncoderDecoderPath()

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
        """Encodes each request whose region a chunk completes; writes the cross K/V."""
        by_request: dict[int, tuple[list[int], list[list[int]]]] = {}
        for chunk in chunks:
            region = chunk.seq.decoder_start
            if chunk.start < region <= chunk.seq_len:
                ids, tables = by_request.setdefault(
                    id(chunk.request), (list(chunk.request.encoder_token_ids), [])
                )
                tables.append(chunk.seq.block_table[: region // self.block_size])
        if not by_request:
            return
        inputs = [ids for ids, _ in by_request.values()]
        lens = [len(ids) for ids in inputs]
        encoded = self.model.encode(  # [sum(lens), hidden]
            to_device([t for ids in inputs for t in ids], torch.int64, self.device),
            to_device([p for n in lens for p in range(n)], torch.int64, self.device),
            lens,
        )
        rows, tables, write_lens = [], [], []
        start = 0
        for n, (_, seq_tables) in zip(lens, by_request.values(), strict=True):
            for table in seq_tables:  # one sequence; several only after a preemption
                rows.extend(range(start, start + n))
                tables.append(table)
                write_lens.append(n)
            start += n
        slots = SeqSpans.build(tables, write_lens, write_lens, self.block_size, self.device)
        if len(rows) != encoded.shape[0]:
            encoded = encoded[to_device(rows, torch.int64, self.device)]
        self.model.write_cross_kv(encoded, slots.slot_mapping, self.kv_caches)

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
