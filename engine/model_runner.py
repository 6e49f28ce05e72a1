"""ModelRunner: turns one step's scheduled chunks into tensors, runs ONE forward over all of
them (prefill chunks and decodes mixed), and returns logits only for the rows that sample.

Contract: `execute(chunks, block_copies)` where each chunk has `.seq` (with `token_ids` and
`block_table`), `.start` (tokens already in the cache), `.num_new_tokens`, `.seq_len` (start +
num_new_tokens) and `.sample`.
Returns `[num_sampling_chunks, vocab]` float32 logits in chunk order, plus, when asked,
the logits of every new row (for prompt logprobs). Under tensor parallel, rank 0's `execute`
broadcasts the step's inputs (engine/parallel/) and every rank's `run` does the same forward;
a failed step is then a `FatalEngineError` (the ranks are out of step). The KV cache is owned
here; how the forward runs (C++ step, PyTorch layers with C++ or Triton attention, plain
PyTorch) is chosen once, in models/forward_path.py, and the runner only calls the path it
returns.

Every step's attention metadata comes from the path's attention backend
(`forward_path.attention.build`, models/attention_backend.py), built before the forward in one
host-to-device copy. Decode-only steps (every chunk one new token, nothing asking for prompt
logprobs) replay a CUDA graph of their batch-size bucket when `graphs` settings are given and
the path's `graph_support` is DECODE_ONLY (engine/cuda_graphs/: on CUDA captured graphs; on
other devices, e.g. CPU tests, the same function re-run over the same persistent buffers); the
KV cache then has one extra block past the block manager's, the scratch block padding rows
write into. Mixed steps run eagerly. Other host lists reach the device through
engine/host_transfer.to_device (no wait for the device); nothing here reads device data back.
`description`: the path's, plus ", CUDA graphs" when decode steps replay captured graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.cuda_graphs.buckets import DecodeRows
from engine.cuda_graphs.decode_graphs import (
    DecodeGraphs,
    GraphSettings,
    recorder_for,
)
from engine.errors import FatalEngineError
from engine.host_transfer import to_device
from engine.kernel_switch import PendingKernelPath
from engine.parallel.rank import ParallelRank
from engine.step_inputs import StepInputs
from models import allocate_kv_cache
from models.attention_backend import GraphSupport
from models.config import ModelConfig
from models.forward_path import select_forward_path
from models.host_memory import release_freed_memory

log = logging.getLogger("tgserve.engine")


@dataclass(frozen=True)
class StepLogits:
    sampling: torch.Tensor  # [num_sampling_chunks, vocab] float32, in chunk order
    all_rows: dict[int, torch.Tensor]  # chunk index -> [num_new_tokens, vocab] when asked


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        cpu_kernels: bool = False,
        sampleable_vocab: int | None = None,
        parallel: ParallelRank | None = None,
        graphs: GraphSettings | None = None,
        kernels_in_background: bool = False,
        kernel_model: Callable[[], torch.nn.Module] | None = None,
        batch_invariant: bool = False,
    ) -> None:
        """`graphs`: decode steps through engine/cuda_graphs where the forward path allows it
        (captured on CUDA; elsewhere, e.g. in CPU tests, re-run over the same persistent
        buffers and padding). None: every step eager. `kernels_in_background` (CPU, no graphs):
        start on PyTorch ops while the C++ kernels build (engine/kernel_switch.py); the engine
        calls `switch_to_pending_path` between requests. `kernel_model()`, when given, loads the
        model the kernels then run in place of `model` (a GGUF file's blocks as stored)."""
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = device
        # Embedding tables padded past the tokenizer (Qwen2: 151936 rows, 151665 tokens) hold
        # ids nothing can decode: the sampler only ever sees the first `sampleable_vocab`.
        self.sampleable_vocab = (
            sampleable_vocab if sampleable_vocab and sampleable_vocab < config.vocab_size else None
        )
        # Tensor parallel: this rank's shard of the model and the KV heads it holds.
        self.parallel = parallel
        kv_heads = None if parallel is None else parallel.layout.num_kv_heads
        # One more block than the block manager's when graphs pad decode steps: the scratch
        # block (index num_blocks) that padding rows write into.
        extra = 1 if graphs is not None else 0
        self.kv_caches = allocate_kv_cache(
            config, num_blocks + extra, block_size, dtype, device, kv_heads
        )
        # cpu_kernels: tgserve's C++ CPU kernels are wanted; the seam says what can run.
        later = cpu_kernels and kernels_in_background and graphs is None
        self.forward_path = select_forward_path(
            model,
            self.kv_caches,
            device,
            cpu_kernels=cpu_kernels and not later,
            batch_invariant=batch_invariant,
        )
        self.pending_path: PendingKernelPath | None = None
        if later:

            def kernel_path() -> tuple[torch.nn.Module, Any]:
                runs = kernel_model() if kernel_model is not None else model
                return runs, select_forward_path(runs, self.kv_caches, device, cpu_kernels=True)

            self.pending_path = PendingKernelPath(kernel_path)
        # While the compiler runs in the background it holds cores: steps take one thread then
        # (OpenMP threads sharing a core with cc1plus stall each other, ~10x slower steps seen),
        # all of them again once the engine has switched (or given up). Set in the stepping
        # thread (execute): torch's intra-op thread count is per thread.
        self._threads = torch.get_num_threads()
        self.decode_graphs = self._decode_graphs(graphs, num_blocks)

    def _pick_thread_count(self) -> None:
        # pending_path is cleared only at a step no request has started (switched, or the build
        # failed), so a request never sees its thread count change mid-way.
        want = 1 if self.pending_path is not None else self._threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    @property
    def description(self) -> str:
        """The forward path's, and whether decode steps replay CUDA graphs (start-up log)."""
        captured = self.decode_graphs is not None and self.device.type == "cuda"
        return self.forward_path.description + (", CUDA graphs" if captured else "")

    def switch_to_pending_path(self) -> bool:
        """Adopts the C++ kernel path once it is ready (engine/kernel_switch.py); True when it
        switched. The engine calls it only where no request has started."""
        ready = self.pending_path.take() if self.pending_path is not None else None
        if ready is None:
            if self.pending_path is not None and self.pending_path.settled:
                self.pending_path = None  # the build failed: PyTorch ops for good
            return False
        model, path = ready
        log.info(
            "forward steps now: %s (were: %s)", path.description, self.forward_path.description
        )
        self.model, self.forward_path, self.pending_path = model, path, None
        release_freed_memory()  # a dequantised copy the kernels replaced
        return True

    def _decode_graphs(self, graphs: GraphSettings | None, scratch: int) -> DecodeGraphs | None:
        if graphs is None:
            return None
        if self.forward_path.graph_support is not GraphSupport.DECODE_ONLY:
            log.info("decode steps eager: %s is not capturable", self.forward_path.description)
            return None
        width = -(-graphs.max_model_len // self.block_size) + 1  # + a block allocated ahead
        buffers = self.forward_path.attention.decode_buffers(graphs.max_num_seqs, width, scratch)
        decode = DecodeGraphs(
            self.forward_path, buffers, graphs.max_num_seqs, recorder_for(self.device)
        )
        decode.capture()
        return decode

    @torch.inference_mode()
    def execute(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        full_logits_for: frozenset[int] = frozenset(),
    ) -> StepLogits:
        self._pick_thread_count()
        if self.decode_graphs is not None and not full_logits_for and _decode_only(chunks):
            if block_copies:
                self._copy_blocks(block_copies)
            logits = self.decode_graphs.run(DecodeRows.from_chunks(chunks))
            if logits is not None:
                return StepLogits(sampling=self._sampleable(logits), all_rows={})
            block_copies = ()  # done above
        step = StepInputs.from_chunks(chunks, block_copies, full_logits_for)
        if self.parallel is None:
            return self.run(step)
        try:  # rank 0: every rank runs the same step, so it goes out first
            self.parallel.channel.send(step)
            return self.run(step)
        except Exception as exc:  # a rank may have run collectives the others did not
            raise FatalEngineError(
                f"a tensor-parallel step failed ({type(exc).__name__}: {exc}); "
                "the ranks are out of step"
            ) from exc

    @torch.inference_mode()
    def run(self, step: StepInputs) -> StepLogits:
        """One forward over a step's inputs (every rank of a tensor-parallel group runs it)."""
        if step.block_copies:
            self._copy_blocks(step.block_copies)
        # Built before the forward, in one host-to-device copy (models/attention_backend.py).
        meta = self.forward_path.attention.build(step.tables, step.seq_lens, step.query_lens)
        hidden = self.forward_path.hidden(  # [T, hidden]
            to_device(step.ids, torch.int64, self.device),
            to_device(step.positions, torch.int64, self.device),
            meta,
        )
        rows = hidden
        if len(step.sample_rows) != len(step.ids):
            rows = hidden[to_device(step.sample_rows, torch.int64, self.device)]
        sampling = self._sampleable(self.forward_path.logits(rows))
        # Prompt logprobs: the model's own LM head over every new row, whatever the path.
        starts = step.row_starts
        all_rows = {
            i: self.model.compute_logits(hidden[starts[i] : starts[i] + step.query_lens[i]])
            for i in step.full_logits_for
        }
        return StepLogits(sampling=sampling, all_rows=all_rows)

    def _sampleable(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.sampleable_vocab is None else logits[:, : self.sampleable_vocab]

    def _copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: a sharer about to write into a shared block got a fresh copy of it."""
        src = to_device([s for s, _ in copies], torch.int64, self.device)
        dst = to_device([d for _, d in copies], torch.int64, self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache[src])
            v_cache.index_copy_(0, dst, v_cache[src])


def _decode_only(chunks: Sequence[Any]) -> bool:
    """Every chunk feeds the last token of its sequence and samples the next one."""
    return bool(chunks) and all(
        c.num_new_tokens == 1 and c.sample and c.seq_len == len(c.seq.token_ids) for c in chunks
    )
