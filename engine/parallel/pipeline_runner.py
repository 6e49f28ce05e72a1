"""PipelineRunner: the model runner of one pipeline stage (pipeline parallel), below the runner
contract: the engine steps rank 0's runner as it steps any other, and gets the same StepOutput.

Contract: every rank receives the step rank 0 broadcasts (engine/parallel/step_channel.py, as
under tensor parallel) and cuts its rows into the same micro-batches (up to one per stage,
engine/parallel/micro_batches.py). Each stage runs its micro-batches in order through its own
layers (models/parallel/stages.py), over its own K/V cache (the block ids are the engine's,
the same on every stage; each stage's pool holds its layers only), and hands each one on as
soon as it is done (models/parallel/pipe.py: an asynchronous send), so stage s works on
micro-batch m while stage s - 1 works on m + 1. Stage 0 embeds the tokens; the last stage
applies the final norm and sends back to stage 0 only the rows stage 0 reads (sampled rows,
prompt-logprob rows); stage 0 then computes the LM head's logits and rank 0 samples, as the
model runner does. A stage's `run` returns no logits except on stage 0. Under tensor parallel
inside a stage, rank t of a stage talks to rank t of the next (each holds the full hidden
state after its all-reduce). `trace(stage, micro_batch, event)`, when set, is called with
"start" and "end" around each micro-batch's layers (tests count the overlap with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from engine.host_transfer import to_device
from engine.model_runner import ModelRunner
from engine.parallel.micro_batches import MicroBatch, micro_batches
from engine.runner import StepLogits, copy_blocks
from engine.step_inputs import StepInputs
from models.parallel.pipe import Pipe

_RETURN_TAG = 1 << 20  # last stage -> stage 0 (forward sends are tagged with the micro-batch)


class PipelineRunner(ModelRunner):
    def __init__(
        self,
        model: Any,
        config: Any,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        *args: Any,
        pipe: Pipe,
        **kwargs: Any,
    ) -> None:
        """`model`: a models.parallel.StageModel; `config`: the whole model's ModelConfig;
        the rest as ModelRunner's (its KV cache is allocated for the stage's layers only)."""
        stage_config = replace(config, num_layers=model.plan.num_layers)
        super().__init__(model, stage_config, num_blocks, block_size, dtype, *args, **kwargs)
        self.config = config  # the engine reads the whole model's facts
        self.pipe = pipe
        self.hidden_dtype = dtype  # between stages (not the KV cache's: int8 rows there)
        self.trace: Callable[[int, int, str], None] | None = None

    @torch.inference_mode()
    def run(self, step: StepInputs) -> StepLogits:
        if self.pipe.stage == 0:  # the model runner's step; `_hidden` drives the pipeline
            return super().run(step)
        if step.block_copies:
            copy_blocks(self.kv_caches, step.block_copies, self.device)
        if step.ids:
            self._run_stage(step, micro_batches(step, self.pipe.stages))
        return StepLogits(torch.empty(0, self.vocab_size, device=self.device), {})

    def _hidden(self, step: StepInputs) -> torch.Tensor:
        """Stage 0: [T, hidden], the final hidden states of the rows it reads (others zero)."""
        batches = micro_batches(step, self.pipe.stages)
        width = self.config.hidden_size
        back = [  # posted before the first micro-batch runs: the last stage never waits
            self.pipe.recv_last((len(mb.returned), width), self.hidden_dtype, _RETURN_TAG + m)
            if mb.returned
            else None
            for m, mb in enumerate(batches)
        ]
        self._run_stage(step, batches)
        hidden = torch.zeros(len(step.ids), width, dtype=self.hidden_dtype, device=self.device)
        for mb, received in zip(batches, back, strict=True):
            if received is not None:
                rows = to_device([mb.rows[0] + r for r in mb.returned], torch.int64, self.device)
                hidden.index_copy_(0, rows, received.wait())
        return hidden

    def _run_stage(self, step: StepInputs, batches: list[MicroBatch]) -> None:
        """This stage's layers over each micro-batch in turn, each sent on when done."""
        stage, width = self.pipe.stage, self.config.hidden_size
        positions = to_device(step.positions, torch.int64, self.device)
        ids = to_device(step.ids, torch.int64, self.device) if stage == 0 else None
        incoming = [
            None if stage == 0 else self.pipe.recv_prev((mb.num_rows, width), self.hidden_dtype, m)
            for m, mb in enumerate(batches)
        ]
        sends = []
        for m, (mb, received) in enumerate(zip(batches, incoming, strict=True)):
            lo, hi = mb.rows
            inputs = ids[lo:hi] if received is None else received.wait()  # [rows] or [rows, hidden]
            if self.trace is not None:
                self.trace(stage, m, "start")
            meta = self.forward_path.attention.build(mb.tables, mb.seq_lens, mb.query_lens)
            out = self.forward_path.hidden(inputs, positions[lo:hi], meta)  # [rows, hidden]
            if self.trace is not None:
                self.trace(stage, m, "end")
            if stage < self.pipe.stages - 1:
                sends.append(self.pipe.send_next(out, m))
            elif mb.returned:
                keep = to_device(list(mb.returned), torch.int64, self.device)
                sends.append(self.pipe.send_first(out.index_select(0, keep), _RETURN_TAG + m))
        for work in sends:  # the buffers live until sent; a dead peer raises here
            work.wait()
