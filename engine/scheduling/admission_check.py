"""Whether a request of a given shape could ever run on an engine: its context, its width and
its worst-case KV blocks (after a preemption every sequence recomputes into blocks of its own).
Checked once, where a request enters the engine (`Engine.new_request`)."""

from __future__ import annotations

from engine.sampling.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager


def check_admissible(
    prompt_len: int,
    params: SamplingParams,
    rid: str,
    max_model_len: int,
    max_num_seqs: int,
    block_manager: BlockManager,
) -> None:
    """Raises ValueError when a request of this shape could never run on this engine."""
    max_tokens = params.max_tokens
    if max_tokens is None:
        raise ValueError("max_tokens must be resolved before admission (Engine.new_request)")
    if prompt_len + max_tokens > max_model_len:
        raise ValueError(
            f"request {rid!r}: prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) "
            f"exceeds the maximum context length {max_model_len}; shorten the prompt "
            "or lower max_tokens"
        )
    width = params.num_sequences
    if width > max_num_seqs:
        raise ValueError(
            f"request {rid!r} runs {width} sequences but max_num_seqs is "
            f"{max_num_seqs}; lower n / best_of"
        )
    # Worst case: after a preemption every sequence recomputes into blocks of its own.
    need = width * block_manager.blocks_for(prompt_len + max_tokens - 1)
    if need > block_manager.num_blocks:
        raise ValueError(
            f"request {rid!r} needs up to {need} KV blocks but the cache has "
            f"{block_manager.num_blocks}; shorten the prompt, lower max_tokens or n, "
            "or give the KV cache more memory"
        )
