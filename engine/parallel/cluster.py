"""Cluster: where a replica's ranks run when they span machines (nodes), as flags or
torchrun's variables say it. Pure Python (the server reads it before torch is imported).

Contract: a frozen description of the group's machines: `nnodes` nodes, this one
`node_rank`, the rendezvous (`master_addr`:`master_port`, hosted by rank 0's process, or by
torchrun's agent when `agent_store`), how long a rank waits for the others at start-up
(`init_timeout_s`), and, when a launcher started one process per rank (torchrun), that
process's `rank`. `ranks_on(node, world)` lists a node's ranks (node n holds the n-th equal
slice of 0..world-1); `node_of(rank, world)` is its inverse; `local_ranks(world)` are the
ranks this process starts itself (itself first: rank 0 on node 0, which serves HTTP; the
first rank of its node elsewhere). `Cluster.from_environ(values, environ)` fills unset
values from torchrun's RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / NODE_RANK (GROUP_RANK) /
MASTER_ADDR / MASTER_PORT; ValueError names the flag or variable that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
DEFAULT_INIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Cluster:
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = LOOPBACK
    master_port: int | None = None  # None: one node, a free loopback port picked at start
    init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S
    rank: int | None = None  # one process per rank (torchrun): this process's rank
    world_size: int | None = None  # and the number of ranks (torchrun's WORLD_SIZE)
    agent_store: bool = False  # torchrun's agent hosts the rendezvous store, not rank 0

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes - 1}], got {self.node_rank}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ValueError(f"--master-port must be in [1, 65535], got {self.master_port}")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("--nnodes > 1 needs --master-port (and --master-addr: rank 0's host)")
        if not self.init_timeout_s > 0:
            raise ValueError(f"--dist-init-timeout must be > 0, got {self.init_timeout_s}")

    @property
    def is_leader(self) -> bool:
        """The process that holds rank 0: it schedules and serves HTTP."""
        return self.node_rank == 0 and (self.rank is None or self.rank == 0)

    def check_world(self, world: int) -> None:
        if world % self.nnodes:
            raise ValueError(
                f"the group's {world} ranks (--tensor-parallel-size x --pipeline-parallel-size) "
                f"must be a multiple of --nnodes {self.nnodes} (every node holds as many ranks)"
            )

    def ranks_on(self, node: int, world: int) -> range:
        per_node = world // self.nnodes
        return range(node * per_node, (node + 1) * per_node)

    def node_of(self, rank: int, world: int) -> int:
        return rank // (world // self.nnodes)

    def local_ranks(self, world: int) -> list[int]:
        if self.rank is not None:  # the launcher started every other rank
            return [self.rank]
        return list(self.ranks_on(self.node_rank, world))

    @classmethod
    def from_environ(cls, values: Mapping[str, object], environ: Mapping[str, str]) -> Cluster:
        """`values`: the flags given (None: unset); torchrun's variables fill the rest."""
        given = {k: v for k, v in values.items() if v is not None}
        env = {}
        for key, var in (
            ("master_addr", "MASTER_ADDR"),
            ("master_port", "MASTER_PORT"),
            ("node_rank", "NODE_RANK"),
            ("node_rank", "GROUP_RANK"),  # torchrun's name for the node's rank
            ("rank", "RANK"),
        ):
            if var in environ and key not in env:
                env[key] = environ[var] if key == "master_addr" else _int(var, environ[var])
        if "RANK" in environ:  # one process per rank: the nodes follow from the sizes
            world = _int("WORLD_SIZE", environ.get("WORLD_SIZE", ""))
            per_node = _int("LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", str(world)))
            env["world_size"] = world
            env["nnodes"] = max(1, world // max(1, per_node))
            env["node_rank"] = env["rank"] // max(1, per_node)
            env["agent_store"] = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        return cls(**{**env, **given})


def _int(var: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{var} must be an integer, got {text!r}") from None
