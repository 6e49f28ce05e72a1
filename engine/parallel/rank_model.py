"""A rank's part of the model: its tensor-parallel shard and, under pipeline parallel, its
stage's layers.

Contract: `rank_part(model, model_config, config, group)` takes a model loaded from the one set
of model files and the rank's world group (every rank calls it at once: it creates the
pipeline's groups) and returns a `RankPart`: the model the rank runs (sharded in place over
its stage's tensor-parallel ranks when there are several, then cut to its stage's layers:
models/parallel/stages.py), its shard layout, its `Pipe` (None without pipeline parallel)
and the number of layers whose K/V it holds (the whole model's without pipeline parallel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from engine.config import EngineConfig
from models.parallel import ParallelGroup, ShardLayout, plan_shards, shard_model
from models.parallel.pipe import Pipe, init_pipeline
from models.parallel.stages import check_pipeline_parallel, cut_to_stage, plan_stages


@dataclass(frozen=True)
class RankPart:
    model: nn.Module
    layout: ShardLayout
    pipe: Pipe | None
    num_layers: int  # the layers (and K/V caches) this rank holds


def rank_part(
    model: nn.Module, model_config: Any, config: EngineConfig, group: ParallelGroup
) -> RankPart:
    if config.pipeline_parallel_size == 1:
        layout = plan_shards(model_config, group.world, group.rank)
        shard_model(model, layout, group)
        return RankPart(model, layout, None, model_config.num_layers)
    check_pipeline_parallel(model_config, config.pipeline_parallel_size)
    pipe = init_pipeline(group, config.tensor_parallel_size, config.pipeline_parallel_size)
    layout = plan_shards(model_config, pipe.tensor.world, pipe.tensor.rank)
    if pipe.tp > 1:  # the whole model is sharded, then cut: shard_model walks every layer
        shard_model(model, layout, pipe.tensor)
    plan = plan_stages(model_config.num_layers, pipe.stages, pipe.stage)
    return RankPart(cut_to_stage(model, plan), layout, pipe, plan.num_layers)
