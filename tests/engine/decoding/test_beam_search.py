"""Beam search in the engine: transformers' `generate(num_beams=...)` is the oracle for tokens and
scores; width 1 is greedy; beams share KV blocks; preemption and streaming lose nothing."""

from __future__ import annotations

import pytest
import torch

from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import make_hf_model
from tests.engine.engine_fixtures import (
    assert_no_leaks,
    random_prompts,
    run_beside_a_long_request,
    run_staggered,
    tiny_engine,
)

MAX_TOKENS = 10
# (beam width, n returned, length_penalty, early_stopping): every early-stopping mode, both
# signs of the length penalty and 0 (where the heuristic ends the search soonest).
COMBOS = [
    (1, 1, 1.0, False),
    (2, 2, 0.0, True),
    (2, 1, 0.0, False),
    (4, 2, 1.0, False),
    (4, 4, 2.0, "never"),
    (4, 3, -0.5, True),
]


def beam_params(
    width: int, n: int, lp: float = 1.0, es: bool | str = False, **kw
) -> SamplingParams:
    kw.setdefault("max_tokens", MAX_TOKENS)
    return SamplingParams(
        temperature=0.0,
        n=n,
        best_of=width,
        use_beam_search=True,
        length_penalty=lp,
        early_stopping=es,
        **kw,
    )


def likely_stops(hf, prompt: list[int]) -> tuple[int, ...]:
    """Stop tokens that beams really meet: the 2nd choice after the prompt, and the 4th greedy
    token (so hypotheses end at several lengths)."""
    with torch.no_grad():
        first = hf(torch.tensor([prompt])).logits[0, -1].argsort(descending=True)
        greedy = hf.generate(
            torch.tensor([prompt]), max_new_tokens=4, do_sample=False, pad_token_id=0
        )
    return tuple(dict.fromkeys([int(first[1]), int(greedy[0, len(prompt) + 3])]))


def hf_beams(hf, prompt, width, n, lp, es, stops) -> list[tuple[list[int], float]]:
    """transformers' returned hypotheses: (generated tokens, sequences_score), best first."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            num_beams=width,
            num_return_sequences=n,
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            length_penalty=lp,
            early_stopping=es,
            eos_token_id=[2, *stops],
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    if width == 1:  # plain greedy: no beam indices, the score is the mean log-prob
        tokens = out.sequences[0, len(prompt) :].tolist()
        logprobs = [s.log_softmax(-1)[0, t] for s, t in zip(out.scores, tokens, strict=False)]
        return [(tokens, float(sum(logprobs)) / len(tokens) ** lp)]
    result = []
    for i in range(n):
        length = int((out.beam_indices[i] != -1).sum())  # the rest is padding
        result.append(
            (
                out.sequences[i, len(prompt) : len(prompt) + length].tolist(),
                float(out.sequences_scores[i]),
            )
        )
    return result


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
def test_beam_search_equals_transformers(arch: str, tmp_path) -> None:
    engine = tiny_engine(tmp_path, arch, max_num_batched_tokens=64)
    hf = make_hf_model(arch)
    prompts = random_prompts(2, (3, 20), seed=11)
    cases = [(p, c, likely_stops(hf, p)) for p in prompts for c in COMBOS]
    params = [beam_params(w, n, lp, es, stop_token_ids=stops) for _, (w, n, lp, es), stops in cases]
    outs = engine.generate([p for p, _, _ in cases], params)  # all groups batched together
    reasons = set()
    for (prompt, (w, n, lp, es), stops), out in zip(cases, outs, strict=True):
        expected = hf_beams(hf, prompt, w, n, lp, es, stops)
        assert [o.index for o in out.outputs] == list(range(n))
        for o, (tokens, score) in zip(out.outputs, expected, strict=True):
            assert list(o.token_ids) == tokens, f"{(w, n, lp, es)} hypothesis {o.index}"
            assert o.cumulative_logprob / len(tokens) ** lp == pytest.approx(
                score, rel=1e-4, abs=1e-5
            )
            reasons.add((o.finish_reason, len(tokens) == MAX_TOKENS, len(tokens) == 1))
    # The cases are not trivial: hypotheses ended on a stop token early, later, and at max_tokens.
    assert {("stop", False, True), ("stop", False, False), ("length", True, False)} <= reasons
    assert_no_leaks(engine)


def test_width_one_equals_greedy(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    prompts = random_prompts(4, (2, 30), seed=12)
    stops = (7, 9, 11)  # some greedy runs end early on these
    greedy = engine.generate(
        prompts, SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=stops)
    )
    beam = engine.generate(prompts, beam_params(1, 1, max_tokens=16, stop_token_ids=stops))
    for g, b in zip(greedy, beam, strict=True):
        assert b.outputs[0].token_ids == g.outputs[0].token_ids
        assert b.outputs[0].finish_reason == g.outputs[0].finish_reason
    assert_no_leaks(engine)


def test_beams_share_prompt_blocks_and_free_them(tmp_path) -> None:
    engine = tiny_engine(tmp_path, block_size=4, max_num_batched_tokens=256)
    prompt = random_prompts(1, (160, 160), seed=13)[0]
    bm = engine.scheduler.block_manager
    single = bm.blocks_for(len(prompt) + 16 - 1)  # one sequence's blocks at its longest
    engine.add_request("beam", prompt, beam_params(4, 4, max_tokens=16, ignore_eos=True))
    peak, widest = 0, 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.stats().kv_blocks_used)
        widest = max(widest, len(getattr(engine.get_request("beam"), "live_seqs", ())))
        bm.check_invariants()
    assert widest == 4  # four beams really ran
    assert peak <= single + 4 * (16 // 4 + 2)  # prompt once, each beam its own tail
    assert peak < 1.5 * single  # well under the 4x of four independent sequences
    assert_no_leaks(engine)


def test_preempted_beam_group_equals_uninterrupted_run(tmp_path) -> None:
    prompt = random_prompts(1, (24, 24), seed=15)[0]
    params = beam_params(4, 2, max_tokens=20)
    final, preemptions, small = run_beside_a_long_request(
        tmp_path / "m", "beam", prompt, params, seed=14
    )
    assert preemptions >= 1, "the beam group was never preempted; shrink the cache"
    alone = tiny_engine(tmp_path / "m").generate([prompt], params)[0]
    assert [o.token_ids for o in final.outputs] == [o.token_ids for o in alone.outputs]
    for a, b in zip(final.outputs, alone.outputs, strict=True):
        assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-4)
    assert_no_leaks(small)


def test_beam_sampling_is_seeded_and_honours_filters(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    prompt = random_prompts(1, (8, 8), seed=15)[0]
    sampled = dict(
        temperature=1.0, n=2, best_of=4, use_beam_search=True, max_tokens=12, ignore_eos=True
    )
    first = engine.generate([prompt], SamplingParams(seed=5, **sampled))[0]
    again = engine.generate([prompt], SamplingParams(seed=5, **sampled))[0]
    other = engine.generate([prompt], SamplingParams(seed=6, **sampled))[0]
    plain = engine.generate([prompt], beam_params(4, 2, max_tokens=12, ignore_eos=True))[0]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    ids = {tuple(o.token_ids) for out in (first, other, plain) for o in out.outputs}
    assert len(ids) > 2  # the seed and sampling change the beams
    # top_k=1 leaves each beam one candidate: the search collapses onto the greedy path.
    greedy = engine.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    )[0]
    top1 = engine.generate([prompt], SamplingParams(seed=5, top_k=1, **sampled))[0]
    assert top1.outputs[0].token_ids == greedy.outputs[0].token_ids
    # logit_bias applies to plain beam search too: the banned tokens never appear.
    banned = {t: -100.0 for t in plain.outputs[0].token_ids}
    biased = engine.generate(
        [prompt], beam_params(4, 2, max_tokens=12, ignore_eos=True, logit_bias=banned)
    )[0]
    assert all(not set(o.token_ids) & set(banned) for o in biased.outputs)
    assert_no_leaks(engine)


class HalfCharTokenizer:
    """Token t is ASCII for t % 3 == 2, else one byte of "é" (0xC3 0xA9): streams hold back
    half characters and invalid orders become U+FFFD, like a real byte-level BPE."""

    def token_bytes(self, token_id: int) -> bytes:
        return [b"\xc3", b"\xa9", bytes([97 + token_id % 26])][token_id % 3]

    def is_special(self, token_id: int) -> bool:
        return token_id == 2

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes(t) for t in ids if not self.is_special(t)).decode(
            errors="replace"
        )


def test_streamed_beam_text_is_append_only_and_ends_as_the_best(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    engine.tokenizer = HalfCharTokenizer()
    prompt = random_prompts(1, (6, 6), seed=16)[0]
    engine.add_request("b", prompt, beam_params(4, 2, max_tokens=24, stop_token_ids=(5,)))
    streamed: dict[int, list[str]] = {0: [], 1: []}
    tokens_seen: dict[int, list[int]] = {0: [], 1: []}
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            for o in out.outputs:
                sent = "".join(streamed[o.index])
                # a delta goes on where the stream stands; the finished hypotheses come whole
                # (offset 0) and must start with everything streamed: nothing is retracted
                assert o.text_offset in (len(sent), 0) and o.token_offset in (
                    len(tokens_seen[o.index]),
                    0,
                )
                whole_text = sent[: o.text_offset] + o.text
                whole_ids = tokens_seen[o.index][: o.token_offset] + list(o.token_ids)
                assert whole_text.startswith(sent), "a streamed delta was retracted"
                assert whole_ids[: len(tokens_seen[o.index])] == tokens_seen[o.index]
                streamed[o.index].append(whole_text[len(sent) :])
                tokens_seen[o.index] = whole_ids
            final = out if out.finished else None
    assert final is not None and len(final.outputs) == 2
    for o in final.outputs:
        assert o.text_offset == 0 and o.token_offset == 0  # the finished hypotheses, whole
        assert "".join(streamed[o.index]) == o.text
        shown = o.token_ids[:-1] if o.finish_reason == "stop" else o.token_ids  # stop id hidden
        assert o.text == engine.tokenizer.decode(shown)
    assert sum(1 for d in streamed[0][:-1] if d) >= 1, "nothing was streamed before the end"
    assert_no_leaks(engine)


def test_beam_logprobs_are_the_models_and_add_up(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    hf = make_hf_model("llama")
    prompt = random_prompts(1, (6, 6), seed=19)[0]
    out = engine.generate([prompt], beam_params(3, 2, max_tokens=8, logprobs=2))[0]
    for o in out.outputs:
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + list(o.token_ids)])).logits[0, len(prompt) - 1 : -1]
        ref = logits.log_softmax(-1)
        assert [e.token_id for e in o.logprobs] == list(o.token_ids)
        for row, e in zip(ref, o.logprobs, strict=True):
            assert e.logprob == pytest.approx(float(row[e.token_id]), abs=1e-4)
            assert [t for t, _ in e.top] == row.topk(2).indices.tolist()
        assert sum(e.logprob for e in o.logprobs) == pytest.approx(o.cumulative_logprob, abs=1e-5)
    assert_no_leaks(engine)


def test_aborted_beam_request_reports_every_index_and_frees_blocks(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    engine.add_request(
        "b", random_prompts(1, (10, 10), seed=17)[0], beam_params(4, 3, max_tokens=30)
    )
    for _ in range(5):
        engine.step()
    engine.abort_request("b")
    (out,) = engine.step()
    assert out.finished and [o.index for o in out.outputs] == [0, 1, 2]
    assert all(o.finish_reason == "abort" for o in out.outputs)
    assert_no_leaks(engine)


def test_beam_search_rejects_what_it_cannot_honour(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    with pytest.raises(ValueError, match="stop strings"):
        engine.new_request(
            "r", [5, 6], SamplingParams(use_beam_search=True, temperature=0.0, stop=("x",))
        )
    with pytest.raises(ValueError, match="early_stopping"):
        engine.new_request(
            "r", [5, 6], SamplingParams(use_beam_search=True, early_stopping="sometimes")
        )
    with pytest.raises(ValueError, match="max_num_seqs"):
        tiny_engine(tmp_path, max_num_seqs=2).new_request("r", [5, 6], beam_params(4, 1))


def test_beam_groups_run_beside_other_traffic(tmp_path) -> None:
    engine = tiny_engine(tmp_path, max_num_batched_tokens=40)
    prompts = random_prompts(6, (4, 30), seed=18)
    params = [
        beam_params(3, 2, max_tokens=12)
        if i % 2
        else SamplingParams(max_tokens=12, temperature=0.0)
        for i in range(6)
    ]
    batched = run_staggered(engine, prompts, params, arrive_every=2)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        alone = engine.generate([prompt], p)[0]
        assert [o.token_ids for o in batched[i].outputs] == [o.token_ids for o in alone.outputs]
    assert_no_leaks(engine)
