"""Offline generation: a batch of prompts run to completion on an engine (`Engine.generate`).

Contract: `generate(engine, prompts, params)` adds one request per prompt (text prompts need
the engine's tokenizer; token-id prompts go as they are), steps the engine until all of them
finished and returns their whole outputs in prompt order. `params` is one `SamplingParams` for
every prompt, one per prompt (a ValueError if the counts differ) or None for the defaults.
Nobody reads these tokens as they come, so the requests are not streamed
(`SamplingParams.streamed` False): the step-time target does not hold their steps back.
Outputs of requests someone else added before are stepped past, not returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from engine.requests.outputs import OutputAccumulator, RequestOutput
from engine.requests.sampling_params import SamplingParams
from engine.stats import EngineStats


class SteppedEngine(Protocol):
    """What offline generation drives (`Engine` is one)."""

    tokenizer: Any  # None when the model has no tokenizer

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def stats(self) -> EngineStats: ...


def generate(
    engine: SteppedEngine,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[RequestOutput]:
    params_list = (
        list(params)
        if isinstance(params, list | tuple)
        else [params or SamplingParams()] * len(prompts)
    )
    if len(params_list) != len(prompts):
        raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
    batch = engine.stats().num_steps  # ids unique across batches run on one engine
    ids = []
    for i, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
        if isinstance(prompt, str):
            if engine.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; pass token ids")
            prompt = engine.tokenizer.encode(prompt, add_special_tokens=True)
        rid = f"offline-{batch}-{i}"
        engine.add_request(rid, prompt, dataclasses.replace(p, streamed=False))
        ids.append(rid)
    partial = {rid: OutputAccumulator() for rid in ids}
    finals: dict[str, RequestOutput] = {}
    while len(finals) < len(ids):
        for out in engine.step():
            if out.request_id not in partial:  # added before, by someone else
                continue
            partial[out.request_id].add(out)
            if out.finished:
                finals[out.request_id] = partial[out.request_id].result()
    return [finals[rid] for rid in ids]
