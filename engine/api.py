"""The engine's contract with the floors above it: what a server or a benchmark may rely on.

- `EngineInfo`: frozen facts about a loaded engine (model, tokenizer, context, KV cache), read
  once after loading.
- `EngineCore`: what `AsyncEngine` drives, as a Protocol. `Engine` implements it, and so does the
  tests' fake engine (a test checks both). Threading: `new_request` is pure validation and may
  run on any thread; every other method runs on the engine's own thread.
  - `new_request(request_id, prompt_token_ids, params)` validates the request once, where it
    enters the engine (`InvalidRequest`: a ValueError naming the field at fault, with a message
    a user can act on), fills in what the request left to the engine (`max_tokens=None`: the
    room left in the context) and returns it, changing nothing;
  - `add(request)` queues it (`QueueFullError` when the queue is full, ValueError for a
    request id in use);
  - `abort_request(request_id)` takes effect at the next step;
  - `step()` returns one `RequestOutput` of deltas per request that moved (see outputs.py);
    every admitted request ends with exactly one finished output;
  - `has_unfinished_requests()`, `stats()` (a frozen `EngineStats`), `info`.
The errors it raises are in engine/errors.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine.requests.generation_defaults import GenerationDefaults
from engine.requests.outputs import RequestOutput
from engine.requests.request import Request
from engine.requests.sampling_params import SamplingParams
from engine.stats import EngineStats


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    tokenizer: Any  # models' Tokenizer, or None when the vocabulary has no tiktoken form
    max_model_len: int  # prompt + generated tokens admitted per request
    kv_blocks_total: int
    kv_block_size: int
    vocab_size: int  # token ids a prompt may hold
    encoder_decoder: bool = False  # T5 / BART: the prompt is the encoder's input
    device: str = "cpu"  # the torch device type the forward runs on ("cpu", "cuda", ...)
    # What the folder's generation_config.json asks of requests that leave fields unset.
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks_total * self.kv_block_size

    @property
    def context_tokens(self) -> int:
        """What one request can fill: the context, or the whole KV cache if that is smaller."""
        return min(self.max_model_len, self.kv_tokens)

    def default_max_tokens(self, prompt_len: int, decoder_prompt_len: int | None = None) -> int:
        """max_tokens of a request that leaves it out: the room left after its prompt, within
        generation_config.json's bound (`decoder_prompt_len`: the decoder's part of the prompt,
        when it is not the whole)."""
        room = max(1, self.context_tokens - prompt_len)
        bound = self.generation.max_tokens(
            prompt_len if decoder_prompt_len is None else decoder_prompt_len
        )
        return room if bound is None else min(room, bound)


@runtime_checkable
class EngineCore(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    def new_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> Request: ...

    def add(self, request: Request) -> None: ...

    def abort_request(self, request_id: str) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def stats(self) -> EngineStats: ...
