"""How an encoder-decoder request (T5, BART) lives in the decoder-only bookkeeping.

One sequence's token list is laid out as `[encoder input, padded to a whole block | decoder
prompt | generated tokens]`. The scheduler and block manager see an ordinary prompt, so the one
token-accounting rule holds unchanged: the encoder region's blocks are allocated and freed with
the sequence, counted in admission, shared by reference on fork (n > 1, beam search) and,
being whole blocks nobody writes after the encoder pass, never copied on write; a preempted
request recomputes from 0, encoder included. In those slots the model runner
(engine/encdec_runner.py) stores every decoder layer's cross-attention K/V, written once by the
step whose chunk completes the region; the decoder's self-attention K/V follow in the blocks
after it, with decoder positions counted from the region's end.

Contract: `EncoderLayout(model_config, block_size)`: `region(num_encoder_tokens)` is the padded
length; `prompt(encoder_ids)` the token list a `Request` starts with (encoder ids, pad ids, then
the decoder prompt: decoder_start_token_id, and forced_bos_token_id when the config sets one).
RequestIntake (engine/intake.py) lays requests out so (`Request.decoder_start`, copied to each
sequence, is the region's length: the runner and sampling's repetition penalty read the decoder's
tokens from there) and refuses prompt logprobs (the prompt is the encoder's input). Prefix
caching is off for these models (engine_factory): a block of cross K/V depends on the whole
encoder input, not on the tokens up to it as a prefix-cache key says.
"""

from __future__ import annotations

from collections.abc import Sequence


class EncoderLayout:
    def __init__(self, model_config, block_size: int) -> None:
        encdec = model_config.encoder_decoder
        if encdec is None:
            raise ValueError(f"{model_config.architecture} is not an encoder-decoder model")
        self.block_size = block_size
        self.pad_id = encdec.pad_token_id or 0
        forced = () if encdec.forced_bos_token_id is None else (encdec.forced_bos_token_id,)
        self.decoder_prompt: tuple[int, ...] = (encdec.decoder_start_token_id, *forced)

    def region(self, num_encoder_tokens: int) -> int:
        """Slots the encoder's cross K/V take: the input rounded up to whole blocks."""
        return -(-num_encoder_tokens // self.block_size) * self.block_size

    def prompt(self, encoder_ids: Sequence[int]) -> tuple[int, ...]:
        padding = (self.pad_id,) * (self.region(len(encoder_ids)) - len(encoder_ids))
        return (*encoder_ids, *padding, *self.decoder_prompt)
