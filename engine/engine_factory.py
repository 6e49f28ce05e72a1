"""Building an Engine from a model path and an EngineConfig: load the tokenizer, build the
runner (engine/runner_factory.py: weights, KV cache), wire runner and scheduler.

With `tensor_parallel_size` N > 1 this process is rank 0: it starts the other ranks of its
machine (engine/parallel/workers.py; other machines' ranks join it, `cluster`), joins their
process group, and every rank builds its runner the
same way (`build_runner`: load the one set of model files, keep its shard, size its KV cache;
the number of blocks is the smallest any rank can hold). Only rank 0 has a scheduler.
`random_weights` (a config.json dict) builds that shape with seeded random weights instead
(models/random_weights.py; no tokenizer: token-id prompts), for benchmarks.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.requests.generation_defaults import GenerationDefaults
from engine.runner_factory import build_runner
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler

log = logging.getLogger("tgserve.engine")


def build_engine(
    cls,
    model_path: str | None,
    config: EngineConfig,
    progress: bool,
    random_weights: dict[str, Any] | None = None,
    tokenizer=None,
    cluster=None,
):
    """`tokenizer`: with `random_weights` only, one to use (the random shape has no files);
    `cluster`: the machines a tensor-parallel group spans (engine/parallel/cluster.py; None:
    this one)."""
    from models.default_model import default_model_path
    from models.tokenizer import load_tokenizer

    if random_weights is not None:
        path = Path(model_path or "random")  # a name only: nothing is read from it
    else:
        path = Path(model_path) if model_path else default_model_path()
    workers, group = None, None
    if config.parallel_world_size > 1:
        from engine.parallel.workers import start_ranks

        workers, group = start_ranks(str(path), config, cluster)
    elif cluster is not None and cluster.nnodes > 1:
        raise ValueError(
            f"--nnodes {cluster.nnodes} splits the model's ranks over machines: give "
            "--tensor-parallel-size and/or --pipeline-parallel-size (their product, all the "
            "ranks, a multiple of --nnodes)"
        )
    try:
        try:
            if random_weights is None:
                tokenizer = load_tokenizer(path)
        except ValueError as exc:
            log.warning("no tokenizer: %s (token-id prompts still work)", exc)
            tokenizer = None
        vocab = tokenizer.vocab_size if tokenizer is not None else None
        built = build_runner(
            path, config, progress, group, vocab, workers, random_weights=random_weights
        )
    except BaseException:
        if workers is not None:
            workers.stop(timeout=5.0)
        raise
    runner, model_config = built.runner, built.model_config
    # "auto" settled by the runner's build: the engine, its tiers' keys and its description
    # name what runs (engine/activation_choice.py)
    asked, config = config, replace(config, activation_quantization=built.activation_quantization)
    tiers = {}  # K/V tiers behind the pool (engine/kv_tiers): strong chained keys
    if config.kv_tiers is not None and config.enable_prefix_caching:
        from engine.kv_tiers.keys import chained_block_hash
        from engine.kv_tiers.open_store import open_tier_store

        store = open_tier_store(config, path, tokenizer, built, random_weights)
        tiers = {"hash_fn": chained_block_hash, "tiers": store} if store else {}
    scheduler = Scheduler(
        config,
        BlockManager(built.num_blocks, config.block_size, config.enable_prefix_caching, **tiers),
        built.max_model_len,
    )
    eos = tuple(
        dict.fromkeys((tokenizer.eos_token_ids if tokenizer else ()) + model_config.eos_token_ids)
    )
    name = path.stem if path.is_file() else path.name
    log.info(
        "loaded %s (%s, %s on %s%s); KV cache: %d blocks of %d tokens = %d tokens;"
        " max_model_len %d; %s",
        name,
        model_config.architecture,
        built.dtype_name,
        runner.device,
        _parallel(config) if workers else "",
        built.num_blocks,
        config.block_size,
        built.num_blocks * config.block_size,
        built.max_model_len,
        runner.description,
    )
    not_honoured = GenerationDefaults.from_file(model_config.generation).ignored
    if not_honoured:  # settings that change outputs, which no tgserve request can apply
        log.warning("generation_config.json sets what tgserve does not apply: %s", not_honoured)
    draft = None
    if config.speculative is not None and config.speculative.method == "draft":
        from engine.speculative.draft import build_draft

        draft = build_draft(asked, runner.vocab_size)  # its own file: its own "auto"
    engine = cls(runner, scheduler, tokenizer, config, name, eos, draft=draft)
    for adapter, adapter_path in config.lora.adapters if config.lora else ():
        engine.intake.adapters.register(
            adapter, adapter_path
        )  # read and checked now: fails at start
    return engine


def _parallel(config: EngineConfig) -> str:
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    return f", tensor parallel over {tp} ranks" + (
        f" in each of {pp} pipeline stages" if pp > 1 else ""
    )


def leader_engine(cls, model_path: str | None, config: EngineConfig, cluster, progress: bool):
    """`cls.from_model` on rank 0 of a group whose ranks `cluster` places over machines."""
    return build_engine(cls, model_path, config, progress, cluster=cluster)


def fake_device_engine(
    cls, device_s: float, config: EngineConfig | None = None, vocab_size: int = 256
):
    """A `cls` (Engine) with no model whose every step holds a device thread `device_s`
    seconds (engine/fake_device.py): the engine's host time against a device's, on any
    machine. No tokenizer: token-id prompts; greedy outputs cycle through the vocabulary."""
    from engine.fake_device import FakeDeviceRunner

    config = config or EngineConfig()
    runner = FakeDeviceRunner(vocab_size, device_s, config.max_model_len or 4096, config.seed)
    max_len = runner.config.max_position_embeddings
    blocks = config.max_num_seqs * -(-max_len // config.block_size)  # every seat a full context
    manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
    return cls(runner, Scheduler(config, manager, max_len), None, config, "fake-device", ())
