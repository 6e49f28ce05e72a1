"""Pipeline stages: a Llama-family model's decoder layers cut into P contiguous stages, each
process holding only its stage's layers (and K/V cache for them).

Contract: `plan_stages(num_layers, stages, stage)` returns the stage's `StagePlan` (its
half-open layer range): an even split, the remainder going one layer each to the LAST
stages (stage 0 also runs the embedding and the LM head, so it gets the fewest layers:
30 layers over 4 stages is 7, 7, 8, 8). `check_pipeline_parallel(config, stages)` raises
ValueError, saying why, for a split it refuses (a family other than Llama / its
mixture-of-experts kin, more stages than layers). `cut_to_stage(model, plan)` keeps a loaded
(and, under tensor parallel, sharded) model's stage and returns a `StageModel`:
- stage 0 holds the embedding and the LM head (tied or not) and takes token ids;
- every other stage takes the previous stage's hidden states [T, hidden];
- the last stage applies the final norm, so its output is what the whole model's forward
  returns (a single stage is the whole model).
`StageModel.forward(inputs, positions, meta, kv_caches) -> [T, hidden]` with one (k, v)
per layer of the stage; `compute_logits` on stage 0. Nothing here sends anything: the engine
(engine/parallel/pipeline_runner.py) moves hidden states between the stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.attention import AttentionMetadata, KVCache
from models.config import ModelConfig
from models.parallel.layout import Range


@dataclass(frozen=True)
class StagePlan:
    stage: int
    stages: int
    layers: Range  # [first, end) of the model's decoder layers

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


def plan_stages(num_layers: int, stages: int, stage: int) -> StagePlan:
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} outside a pipeline of {stages} stages")
    if num_layers < stages:
        raise ValueError(
            f"pipeline_parallel_size {stages} is larger than the model's {num_layers} layers"
        )
    base, extra = divmod(num_layers, stages)
    # The last `extra` stages take one more layer each.
    start = stage * base + max(0, stage - (stages - extra))
    size = base + (1 if stage >= stages - extra else 0)
    return StagePlan(stage, stages, (start, start + size))


def check_pipeline_parallel(config: ModelConfig, stages: int) -> None:
    if stages < 1:
        raise ValueError(f"pipeline_parallel_size must be at least 1, got {stages}")
    if stages == 1:
        return
    if config.family not in ("llama", "moe") or config.is_encoder_decoder:
        raise ValueError(
            f"pipeline parallel runs the Llama family (Llama, Mistral, Qwen2/3, SmolLM2) and its "
            f"mixture-of-experts kin; {config.architecture} runs with pipeline_parallel_size 1"
        )
    plan_stages(config.num_layers, stages, 0)  # more stages than layers: refused there


class StageModel(nn.Module):
    """One stage of a Llama-family causal LM (the module names of the model it was cut from)."""

    def __init__(self, causal_lm: nn.Module, plan: StagePlan) -> None:
        super().__init__()
        self.config = causal_lm.config
        self.plan = plan
        self.model = causal_lm.model  # .layers holds this stage's layers only
        self.lm_head = causal_lm.lm_head if plan.first else None
        self.lora_bank = None  # adapters are refused under pipeline parallel

    def forward(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """inputs: token ids [T] on stage 0, else the previous stage's hidden [T, hidden]."""
        x = self.model.embed_tokens(inputs) if self.plan.first else inputs  # [T, hidden]
        rope = self.model.rotary_emb(positions, x.dtype)
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, cache)
        return self.model.norm(x) if self.plan.last else x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            raise RuntimeError(f"stage {self.plan.stage} holds no LM head (stage 0 does)")
        return self.lm_head(hidden).float()


def cut_to_stage(causal_lm: nn.Module, plan: StagePlan) -> StageModel:
    """Drops every layer (and the embedding, head, final norm) the stage does not run."""
    from models.llama import LlamaForCausalLM

    if not isinstance(causal_lm, LlamaForCausalLM):
        raise ValueError(f"pipeline parallel cannot cut {type(causal_lm).__name__} into stages")
    inner = causal_lm.model
    lo, hi = plan.layers
    inner.layers = nn.ModuleList(list(inner.layers)[lo:hi])
    if not plan.first:
        inner.embed_tokens = None
        causal_lm.lm_head = None
    if not plan.last:
        inner.norm = None
    return StageModel(causal_lm, plan)
