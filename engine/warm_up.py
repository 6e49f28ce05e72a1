"""The warm-up an engine goes through before its first request: what a server runs at start-up
(server/state.py) and what `tgserve bench` runs after loading, so the benchmark measures the
engine a server serves with.

Contract: `warm_up_requests(info)` -> the (request id, prompt token ids, SamplingParams) of the
warm-up, to run one after the other, each to its end; `warm_up(engine)` runs them on a
synchronous `EngineCore` (one that nothing else steps) and raises RuntimeError when one fails.

Why two prompts of up to `WARM_UP_PROMPT_TOKENS` tokens (`CPU_WARM_UP_PROMPT_TOKENS` on a CPU)
and not one token:
- Start-up pays what the first multi-token steps pay once (kernel choice and compilation for
  a prefill's shapes, allocator growth), not the first user's request.
- The scheduler's step-cost model (engine/scheduling/step_cost.py) never learns from an engine's
  first step (its one-time costs), and it does not size a chunk past twice the largest step it
  learned from (its trust region). After a one-token warm-up and a few decode steps, the first
  long prompt was cut into chunks of 8, 16, 32, ... tokens, one eager step each
  (tests/engine/test_warm_up.py); on an H200 the first timed 512-token prompt of `bench
  latency` took 3.5 s to its first token, the third 15 ms. The second prompt here is a step
  the model learns from, with a decode step after each prompt, so the fit sees both sizes and
  a prompt up to twice the warm-up's length is one step.
The prompts differ from their first token on (no prefix-cache hit: the second computes its
whole prompt). An encoder-decoder engine gets the one-token request it always had: its prompt
is an encoder input, with limits of its own.
"""

from __future__ import annotations

from engine.api import EngineCore, EngineInfo
from engine.requests.sampling_params import SamplingParams

WARM_UP_PROMPT_TOKENS = 512
# On a CPU a step's one-time costs are small and a 512-token prompt takes ~0.5 s of start-up
# (the default model): shorter prompts there, and the trust region starts at 128 rows.
CPU_WARM_UP_PROMPT_TOKENS = 64
_STRIDE = 7919  # a prime: consecutive prompt tokens spread over the vocabulary


def warm_up_requests(
    info: EngineInfo, token: int = 0
) -> list[tuple[str, list[int], SamplingParams]]:
    """The warm-up requests for an engine described by `info`, in the order they run (`token`:
    the prompt of the one-token request, e.g. the tokenizer's BOS)."""
    longest = CPU_WARM_UP_PROMPT_TOKENS if info.device == "cpu" else WARM_UP_PROMPT_TOKENS
    prompt_len = min(longest, info.context_tokens - 2)
    if info.encoder_decoder or prompt_len < 2 or info.vocab_size < 2:
        return [("warm-up", [token], SamplingParams(max_tokens=1, temperature=0.0))]
    # a token from the prefill step and one from a decode step; whatever EOS says
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    vocab = info.vocab_size
    return [
        (f"warm-up-{k}", [(k + _STRIDE * i) % vocab for i in range(prompt_len)], params)
        for k in (1, 2)
    ]


def warm_up(engine: EngineCore) -> None:
    """Runs the warm-up on an engine stepped by the caller's thread alone (the benchmark's)."""
    for request_id, prompt, params in warm_up_requests(engine.info):
        engine.add(engine.new_request(request_id, prompt, params))
        finished = None
        while finished is None and engine.has_unfinished_requests():
            finished = next((out for out in engine.step() if out.finished), None)
        error = "it never finished" if finished is None else finished.error
        if error is not None:
            raise RuntimeError(f"the warm-up request failed: {error}")
