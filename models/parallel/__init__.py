"""Tensor parallelism: the shard layout of a model over N ranks, the process group, the
parallel layers and the function that shards a loaded model in place.

Contract: `plan_shards(config, world, rank)` says which heads, KV heads, MLP columns and
vocabulary rows a rank holds (ValueError, saying why, for a split that cannot be made);
`init_group(...)` joins the ranks through torch.distributed; `shard_model(model, layout,
group)` turns a loaded model's linear layers into their shards. Nothing here knows about
requests or steps: the engine (engine/parallel/) drives the ranks.
"""

from models.parallel.group import ParallelGroup, exit_rank, free_port, init_group
from models.parallel.layout import ShardLayout, check_tensor_parallel, plan_shards
from models.parallel.shard import shard_model

__all__ = [
    "ParallelGroup",
    "ShardLayout",
    "check_tensor_parallel",
    "exit_rank",
    "free_port",
    "init_group",
    "plan_shards",
    "shard_model",
]
