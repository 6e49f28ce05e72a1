"""Continuous batching plans for llama.cpp (bench/backends/llamacpp_batch.py), run against a fake
llama.cpp context: a per-seq_id KV history whose next token is a hash of that history. The oracle
is the same hash applied to each request alone, one token at a time (the serial path).
"""

from __future__ import annotations

import random

import pytest

from bench.backends.llamacpp_batch import ContinuousBatcher
from bench.workload import BenchRequest

VOCAB = 1000


def _next_token(history: list[int]) -> int:
    """A deterministic stand-in for greedy decoding: depends on every token and its order."""
    h = 17
    for t in history:
        h = (h * 31 + t) % 1_000_003
    return h % VOCAB


def _serial(request: BenchRequest) -> list[int]:
    history, out = list(request.prompt_token_ids), []
    while len(out) < request.output_len:
        out.append(_next_token(history))
        history.append(out[-1])
    return out


class FakeContext:
    """Checks what a llama.cpp context would need: contiguous positions per seq_id, cap on
    live seq_ids and tokens per call; forgets a seq_id when told to (llama_memory_seq_rm)."""

    def __init__(self, max_seqs: int, max_tokens: int) -> None:
        self.kv: dict[int, list[int]] = {}
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.steps: list[list] = []

    def decode(self, step) -> list[int]:
        assert 0 < len(step) <= self.max_tokens
        sampled = []
        for tok in step:
            assert 0 <= tok.slot < self.max_seqs
            history = self.kv.setdefault(tok.slot, [])
            assert tok.pos == len(history), "positions must continue the sequence's KV"
            history.append(tok.token)
            if tok.wants_logits:
                sampled.append(_next_token(history))
        assert len(self.kv) <= self.max_seqs
        self.steps.append(step)
        return sampled

    def seq_rm(self, slot: int) -> None:
        del self.kv[slot]


def _requests(n: int, seed: int, max_in: int = 40, max_out: int = 12) -> list[BenchRequest]:
    rng = random.Random(seed)
    return [
        BenchRequest(
            tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, max_in))),
            rng.randint(1, max_out),
        )
        for _ in range(n)
    ]


def _run(requests, max_seqs: int, max_tokens: int) -> tuple[ContinuousBatcher, FakeContext]:
    batcher = ContinuousBatcher(requests, max_seqs, max_tokens)
    ctx = FakeContext(max_seqs, max_tokens)
    while not batcher.done():
        for finished in batcher.accept(ctx.decode(batcher.next_step())):
            ctx.seq_rm(finished.slot)
    return batcher, ctx


@pytest.mark.parametrize(
    ("n", "max_seqs", "max_tokens", "seed"),
    [(1, 1, 512, 0), (9, 4, 16, 1), (20, 8, 7, 2), (5, 64, 2048, 3), (12, 3, 1, 4)],
)
def test_batched_outputs_equal_each_request_decoded_alone(n, max_seqs, max_tokens, seed):
    requests = _requests(n, seed)
    batcher, ctx = _run(requests, max_seqs, max_tokens)
    assert batcher.outputs == [_serial(r) for r in requests]
    assert ctx.kv == {}  # every sequence's cells were released


def test_running_sequences_decode_together_one_token_each_per_step():
    requests = [BenchRequest(tuple(range(i, i + 8)), 5) for i in range(4)]
    _, ctx = _run(requests, max_seqs=4, max_tokens=64)
    # Step 1 prefills all four prompts; the next four decode all four sequences together.
    assert len(ctx.steps) == 5
    assert [len(s) for s in ctx.steps] == [32, 4, 4, 4, 4]
    assert all(sorted(t.slot for t in s) == [0, 1, 2, 3] for s in ctx.steps[1:])


def test_long_prompt_is_prefilled_in_chunks_beside_decoding_sequences():
    short, long = BenchRequest((1, 2), 6), BenchRequest(tuple(range(30)), 2)
    _, ctx = _run([short, long], max_seqs=2, max_tokens=10)
    assert [t.slot for t in ctx.steps[0]] == [0, 0] + [1] * 8
    assert [t.slot for t in ctx.steps[1]] == [0] + [1] * 9  # the decode token comes first
    assert [t.pos for t in ctx.steps[1] if t.slot == 1] == list(range(8, 17))


def test_finished_slot_is_reused_and_concurrency_stays_capped():
    requests = _requests(10, seed=5, max_in=6, max_out=4)
    _, ctx = _run(requests, max_seqs=2, max_tokens=32)
    assert {t.slot for s in ctx.steps for t in s} == {0, 1}


def test_accept_must_match_the_tokens_asked_for():
    batcher = ContinuousBatcher([BenchRequest((1, 2, 3), 2)], 1, 8)
    batcher.next_step()
    with pytest.raises(ValueError, match="asked for 1"):
        batcher.accept([])


@pytest.mark.parametrize(
    "request_", [BenchRequest((), 3), BenchRequest((1,), 0)], ids=["empty", "no-output"]
)
def test_requests_llama_cpp_cannot_serve_are_refused(request_):
    with pytest.raises(ValueError, match="request 0"):
        ContinuousBatcher([request_], 4, 16)
