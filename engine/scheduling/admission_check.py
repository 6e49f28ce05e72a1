"""Whether a request could ever be served, checked once, where it enters the engine
(`Engine.new_request`): `check_request` for its prompt and token ids (beam search adds its own
rules, decoding/beam_search.py), `check_admissible` for its shape — context, width and
worst-case KV blocks (after a preemption every sequence recomputes into blocks of its own). Both
raise `InvalidRequest` naming the field at fault (engine/errors.py) with a message a
user can act on: the prompt when it alone does not fit, else the max_tokens, n or best_of that
asks for more than there is."""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import PROMPT, InvalidRequest
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager


def check_request(
    prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int, has_tokenizer: bool
) -> None:
    if not prompt_token_ids:
        raise InvalidRequest(PROMPT, "the prompt must hold at least one token")
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            PROMPT, f"prompt token id {bad} is outside the vocabulary (size {vocab_size})"
        )
    params.validate_for_vocab(vocab_size)  # ids it may sample
    if params.stop and not has_tokenizer:
        raise InvalidRequest(
            "stop", "stop strings need a tokenizer, and this model has none; use stop_token_ids"
        )


def check_admissible(
    prompt_len: int,
    params: SamplingParams,
    rid: str,
    max_model_len: int,
    max_num_seqs: int,
    block_manager: BlockManager,
) -> None:
    """Raises InvalidRequest when a request of this shape could never run on this engine."""
    max_tokens = params.max_tokens
    if max_tokens is None:
        raise ValueError("max_tokens must be resolved before admission (Engine.new_request)")
    width_field = "best_of" if params.best_of is not None else "n"
    if prompt_len + max_tokens > max_model_len:
        raise InvalidRequest(
            PROMPT if prompt_len >= max_model_len else "max_tokens",
            f"request {rid!r}: prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) "
            f"exceeds the maximum context length {max_model_len}; shorten the prompt "
            "or lower max_tokens",
        )
    width = params.num_sequences
    if width > max_num_seqs:
        raise InvalidRequest(
            width_field,
            f"request {rid!r} runs {width} sequences but max_num_seqs is "
            f"{max_num_seqs}; lower n / best_of",
        )
    # Worst case: after a preemption every sequence recomputes into blocks of its own.
    blocks_for, num_blocks = block_manager.blocks_for, block_manager.num_blocks
    one = blocks_for(prompt_len + max_tokens - 1)
    if width * one > num_blocks:
        if one <= num_blocks:  # one sequence fits: the width asks too much
            field = width_field
        elif blocks_for(prompt_len) > num_blocks:  # the prompt alone does not fit
            field = PROMPT
        else:
            field = "max_tokens"
        raise InvalidRequest(
            field,
            f"request {rid!r} needs up to {width * one} KV blocks but the cache has "
            f"{num_blocks}; shorten the prompt, lower max_tokens or n, "
            "or give the KV cache more memory",
        )
