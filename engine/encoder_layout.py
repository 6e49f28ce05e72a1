"""How an encoder-decoder request (T5, BART) lives in the decoder-only bookkeeping.

One sequence's token list is laid out as `[digest of the encoder input, the input, padding to a
whole block | decoder prompt | generated tokens]`. The scheduler and block manager see an
ordinary prompt, so the one token-accounting rule holds unchanged: the encoder region's blocks are allocated and freed with
the sequence, counted in admission, shared by reference on fork (n > 1, beam search) and,
being whole blocks nobody writes after the encoder pass, never copied on write; a preempted
request recomputes from 0, encoder included. In those slots the model runner
(engine/encdec_runner.py) stores every decoder layer's cross-attention K/V, written once by the
step whose chunk completes the region; the decoder's self-attention K/V follow in the blocks
after it, with decoder positions counted from the region's end.

Contract: `EncoderLayout(model_config, block_size)`: `region(num_encoder_tokens)` is the padded
length; `prompt(encoder_ids)` the token list a `Request` starts with (the digest, the encoder
ids, REGION_PAD, then the decoder prompt: decoder_start_token_id, and forced_bos_token_id when
the config sets one); `layout_for(model_config, block_size)` is one, or None for a decoder-only
model. The region's token ids are bookkeeping only: the encoder reads
`Request.encoder_token_ids`, and slot j of the region holds encoder position j's cross K/V.
RequestIntake (engine/intake.py) lays requests out so (`Request.decoder_start`, copied to each
sequence, is the region's length: the runner and sampling's repetition penalty read the decoder's
tokens from there) and refuses prompt logprobs (the prompt is the encoder's input).

Prefix caching keys on the encoder input: a block of cross K/V depends on the whole input, not
on the tokens up to it as a prefix-cache key says. So the region opens with a digest of the
whole input (a negative id, `input_digest`: no token id), which every later block's hash chains:
region blocks are equal, and shared (by a prefix hit or by the block manager's deduplication),
only between equal inputs. The scheduler takes a cached prefix only when it covers the whole
region: earlier region blocks are registered before the step that completes the region writes
them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

REGION_PAD = -1  # fills an encoder region past the input (no token id)


def input_digest(encoder_ids: Sequence[int]) -> int:
    """A negative id naming the whole input: 62 bits of BLAKE2b over its ids (a second input
    with the same digest would take 2**62 tries to find on purpose)."""
    data = b"".join(int(t).to_bytes(4, "little", signed=True) for t in encoder_ids)
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return -2 - (int.from_bytes(digest, "little") >> 2)


class EncoderLayout:
    def __init__(self, model_config, block_size: int) -> None:
        encdec = model_config.encoder_decoder
        if encdec is None:
            raise ValueError(f"{model_config.architecture} is not an encoder-decoder model")
        self.block_size = block_size
        forced = () if encdec.forced_bos_token_id is None else (encdec.forced_bos_token_id,)
        self.decoder_prompt: tuple[int, ...] = (encdec.decoder_start_token_id, *forced)

    def region(self, num_encoder_tokens: int) -> int:
        """Slots the region takes: the digest and the input, rounded up to whole blocks."""
        return -(-(num_encoder_tokens + 1) // self.block_size) * self.block_size

    def prompt(self, encoder_ids: Sequence[int]) -> tuple[int, ...]:
        padding = (REGION_PAD,) * (self.region(len(encoder_ids)) - len(encoder_ids) - 1)
        return (input_digest(encoder_ids), *encoder_ids, *padding, *self.decoder_prompt)


def layout_for(model_config, block_size: int) -> EncoderLayout | None:
    """The request layout of an encoder-decoder model (T5 / BART); None for a decoder-only one."""
    return EncoderLayout(model_config, block_size) if model_config.is_encoder_decoder else None
