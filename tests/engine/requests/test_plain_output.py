"""PlainOutput (engine/requests/plain_output.py) behaves as the general shape it stands for:
the oracle is each output's `general()` (a RequestOutput holding one CompletionOutput) put
through outputs.py's own merge, unseen and accumulation."""

from __future__ import annotations

import pickle
import random

from engine.requests.outputs import OutputAccumulator, RequestMetrics, closing_output
from engine.requests.plain_output import PlainOutput
from engine.types import TokenLogprob


def _deltas(seed: int, with_logprobs: bool) -> list[PlainOutput]:
    """A stream of one request's deltas: random text and ids, the last one finished."""
    rng = random.Random(seed)
    out, chars, tokens, total = [], 0, 0, 0.0
    for k in range(rng.randrange(3, 9)):
        n = rng.randrange(0, 4)
        ids = tuple(rng.randrange(100) for _ in range(n))
        text = "".join(rng.choice("ab é") for _ in range(rng.randrange(0, 5)))
        lps = tuple(TokenLogprob(t, -0.5 * t, ()) for t in ids) if with_logprobs else None
        total -= n * 0.25
        last = k == 7 or rng.random() < 0.2
        metrics = RequestMetrics(arrival_time=float(k))  # differs per delta: not compared
        out.append(
            PlainOutput(
                "r", (1, 2, 3), text, ids, total, lps, "stop" if last else None,
                None, chars, tokens, last, ((None, None) if k == 0 else None), metrics,
            )
        )  # fmt: skip
        chars, tokens = chars + len(text), tokens + n
        if last:
            break
    return out


def test_reads_as_its_general_shape():
    for seed in range(20):
        for d in _deltas(seed, seed % 2 == 0):
            g = d.general()
            assert d == g and d.outputs == (d,) and d.outputs[0] == g.outputs[0]
            assert (d.num_tokens, d.text_end) == (g.outputs[0].num_tokens, g.outputs[0].text_end)
            assert pickle.loads(pickle.dumps(d)) == d


def test_merge_equals_the_general_merge():
    for seed in range(40):
        deltas = _deltas(seed, seed % 2 == 0)
        for cut in range(len(deltas)):  # merge runs starting anywhere, in order
            plain, general = deltas[cut], deltas[cut].general()
            for d in deltas[cut + 1 :]:
                plain, general = plain.merge(d), general.merge(d)
                assert plain == general
                assert plain.prompt_logprobs == general.prompt_logprobs


def test_merge_with_a_closing_output_takes_the_general_path():
    deltas = _deltas(3, True)
    closing = closing_output("r", deltas[0], "abort", None)
    merged = deltas[0].merge(closing)
    assert merged == deltas[0].general().merge(closing)
    assert merged.outputs[0].finish_reason == "abort"


def test_unseen_equals_the_general_unseen():
    for seed in range(20):
        for d in _deltas(seed, True):
            c = d.completion()
            for chars in range(d.text_offset - 1, d.text_end + 2):
                for tokens in range(d.token_offset - 1, d.num_tokens + 2):
                    assert d.unseen(chars, tokens) == c.unseen(chars, tokens)


def test_accumulated_whole_equals_the_general_whole():
    for seed in range(20):
        deltas = _deltas(seed, seed % 3 == 0)
        plain, general = OutputAccumulator(), OutputAccumulator()
        for d in deltas:
            plain.add(d)
            general.add(d.general())
        assert plain.result() == general.result()
