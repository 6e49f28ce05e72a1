"""ModelRunner: the decoder-only `Runner` (engine/runner.py, whose skeleton it fills in): turns
one step's scheduled chunks into tensors, runs ONE forward over all of them (prefill chunks and
decodes mixed), and returns logits only for the rows that sample.

Contract: `execute(chunks, block_copies, full_logits_for)` where each chunk has `.seq` (with `token_ids` and
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
from typing import Any

import torch

from engine.cuda_graphs.buckets import DecodeRows
from engine.cuda_graphs.decode_graphs import (
    DecodeGraphs,
    GraphSettings,
    recorder_for,
)
from engine.description import EngineDescription, describe_runner
from engine.errors import FatalEngineError
from engine.host_transfer import to_device
from engine.kernel_switch import PendingKernelPath
from engine.parallel.rank import ParallelRank
from engine.runner import StepLogits, StepRunner, copy_blocks
from engine.step_inputs import StepInputs
from models import allocate_kv_cache
from models.attention_backend import GraphSupport
from models.config import ModelConfig
from models.forward_path import select_forward_path
from models.host_memory import release_freed_memory

log = logging.getLogger("tgserve.engine")


class ModelRunner(StepRunner):
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
        kv_cache_dtype: str = "auto",
    ) -> None:
        """`graphs`: decode steps through engine/cuda_graphs where the forward path allows it
        (captured on CUDA; elsewhere, e.g. in CPU tests, re-run over the same persistent
        buffers and padding). None: every step eager. `kernels_in_background` (CPU, no graphs):
        start on PyTorch ops while the C++ kernels build (engine/kernel_switch.py); the engine
        calls `between_requests` before each step. `kernel_model()`, when given, loads the
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
        if parallel is not None and not parallel.is_driver:  # rank 0's adapter loads
            parallel.channel.on_load = self.load_adapter
        kv_heads = None if parallel is None else parallel.layout.num_kv_heads
        # One more block than the block manager's when graphs pad decode steps: the scratch
        # block (index num_blocks) that padding rows write into.
        extra = 1 if graphs is not None else 0
        # kv_cache_dtype "int8": int8 rows with their scales (models/kv_quant.py); "int8v":
        # float16 K rows, int8 V rows
        self.kv_caches = allocate_kv_cache(
            config, num_blocks + extra, block_size, dtype, device, kv_heads, kv_cache_dtype
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

    def between_requests(self, idle: Callable[[], bool]) -> bool:
        """Adopts the C++ kernel path once it is ready (engine/kernel_switch.py) and `idle()`
        says no request has started; True when it switched."""
        if self.pending_path is None or not idle():
            return False
        ready = self.pending_path.take()
        if ready is None:
            if self.pending_path.settled:
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
            self.forward_path,
            buffers,
            graphs.max_num_seqs,
            recorder_for(self.device),
            adapters=getattr(self.model, "lora_bank", None) is not None,
        )
        decode.capture()
        return decode

    def _prepare(self, chunks: Sequence[Any]) -> None:
        self._pick_thread_count()

    def _replay(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]],
        full_logits_for: frozenset[int],
    ) -> StepLogits | None:
        if self.decode_graphs is None or full_logits_for or not _decode_only(chunks):
            return None
        if block_copies:  # applied again if no graph holds the step: a copy is idempotent
            copy_blocks(self.kv_caches, block_copies, self.device)
        logits = self.decode_graphs.run(DecodeRows.from_chunks(chunks))
        return None if logits is None else StepLogits(sampling=self._cut(logits), all_rows={})

    def _inputs(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]],
        full_logits_for: frozenset[int],
    ) -> StepInputs:
        return StepInputs.from_chunks(chunks, block_copies, full_logits_for)

    def _dispatch(self, step: StepInputs) -> StepLogits:
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

    def _hidden(self, step: StepInputs) -> torch.Tensor:
        # Built before the forward, in one host-to-device copy (models/attention_backend.py).
        meta = self.forward_path.attention.build(step.tables, step.seq_lens, step.query_lens)
        rows = step.adapter_rows()
        if rows is not None:  # each row's LoRA slot: step metadata, read by every projection
            meta.lora_rows = to_device(rows, torch.int64, self.device)
        return self.forward_path.hidden(  # [T, hidden]
            to_device(step.ids, torch.int64, self.device),
            to_device(step.positions, torch.int64, self.device),
            meta,
        )

    def _logits(self, rows: torch.Tensor) -> torch.Tensor:
        return self.forward_path.logits(rows)

    # ----- LoRA adapters (models/lora; the engine's table: engine/lora_adapters.py) --------
    @property
    def lora_slots(self) -> int:
        """Slots of the model's adapter bank (0: adapters are off)."""
        bank = getattr(self.model, "lora_bank", None)
        return 0 if bank is None else bank.slots

    def check_adapter(self, name: str, path: str) -> None:
        """Reads and validates an adapter (LoraRefused says why not) without loading it."""
        from models.lora import load_adapter

        self.model.lora_bank.check(load_adapter(path, name, self.config))

    def load_adapter(self, slot: int, name: str, path: str) -> None:
        """Writes the adapter into `slot`; under tensor parallel every rank writes its part
        (rank 0 sends the load before the step that reads it: engine/parallel/step_channel)."""
        from models.lora import load_adapter

        if self.parallel is not None and self.parallel.is_driver:
            self.parallel.channel.send_load(slot, name, path)
        self.model.lora_bank.write(slot, load_adapter(path, name, self.config))

    # ----- the engine's hooks (engine/runner.py) -------------------------------------------
    def describe(self) -> EngineDescription:
        captured = self.decode_graphs is not None and self.device.type == "cuda"
        # only the C++ step packs copies of the weights
        packed = getattr(self.forward_path, "packed_bytes", 0)
        return describe_runner(
            self.model, self.config, self.kv_caches, self.forward_path, captured, packed
        )

    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        if self.parallel is not None:
            self.parallel.watch_failures(on_failure)

    def close(self) -> None:
        if self.parallel is not None:
            self.parallel.close()


def _decode_only(chunks: Sequence[Any]) -> bool:
    """Every chunk feeds the last token of its sequence and samples the next one (a steady
    step's decode columns, one sampled token a row, read by index)."""
    if hasattr(chunks, "decode_inputs"):
        pairs = zip(chunks.seqs, chunks.starts, strict=True)
        return bool(chunks) and all(s + 1 == len(seq.token_ids) for seq, s in pairs)
    return bool(chunks) and all(
        c.num_new_tokens == 1 and c.sample and c.seq_len == len(c.seq.token_ids) for c in chunks
    )
