"""tgserve's engine with tensor parallel over 2 ranks (gloo on CPU, NCCL on CUDA) as a
benchmark backend: `--backend tgserve --backend tgserve-tp2` compares it with one process
in the same command.

Contract: as bench/backends/tgserve.py (same requests, same timing), with
`tensor_parallel_size=2`; `close()` stops the second rank's process.
"""

from __future__ import annotations

import dataclasses

from bench.backends import BackendOptions
from bench.backends import tgserve as single
from bench.model_source import ModelSource

TENSOR_PARALLEL_SIZE = 2


class TgserveTpBackend(single.TgserveBackend):
    name = "tgserve-tp2"

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.note += f", tensor parallel over {TENSOR_PARALLEL_SIZE} ranks"

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        super().close()


def load(source: ModelSource, options: BackendOptions) -> TgserveTpBackend:
    from engine import Engine, warm_up

    config = dataclasses.replace(
        single.engine_config(source, options), tensor_parallel_size=TENSOR_PARALLEL_SIZE
    )
    engine = Engine.from_model(str(source.path), config)
    warm_up(engine)  # as a server does (engine/warm_up.py)
    return TgserveTpBackend(engine)
