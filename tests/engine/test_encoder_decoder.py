"""T5 and BART served by the engine: greedy and beam outputs equal transformers' `generate` on
the same tiny random folders (float32, token for token), alone, batched with each other and
after a preemption; the encoder's cross K/V blocks are shared by every beam, never copied, and
freed with the request; requests the layout cannot serve are refused naming the field."""

from __future__ import annotations

import json

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequest
from engine.requests.sampling_params import SamplingParams
from tests.devices import selected_device
from tests.encdec_checkpoints import VOCAB, load_hf, save_encdec_checkpoint
from tests.engine.decoding.test_beam_search import beam_params
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered

MAX_TOKENS = 8
BLOCK = 4


def _engine(folder, **config) -> Engine:
    defaults = dict(
        dtype="float32",
        kv_cache_memory_bytes=2_000_000,
        block_size=BLOCK,
        max_num_seqs=16,
        device=str(selected_device()),
    )
    return Engine.from_model(str(folder), EngineConfig(**{**defaults, **config}))


def _prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 19, (n,), generator=gen).tolist()
    return [torch.randint(3, VOCAB, (s,), generator=gen).tolist() for s in sizes]


@pytest.fixture(scope="module", params=["t5v10", "t5v11", "bart"])
def folder(request, tmp_path_factory):
    return save_encdec_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def _hf_generate(hf, prompt: list[int], **kw) -> list[list[int]]:
    """transformers' generated tokens (the decoder start token cut off), up to the eos."""
    with torch.no_grad():
        # use_cache=False: transformers' cache assumes as many decoder layers as encoder layers
        kw |= dict(max_new_tokens=MAX_TOKENS, do_sample=False, use_cache=False)
        out = hf.generate(torch.tensor([prompt]), **kw)
    config = hf.generation_config
    eos = config.eos_token_id
    result = []
    for row in out.tolist():
        tokens = row[1:]
        if eos in tokens:  # finished early: padded after its eos
            tokens = tokens[: tokens.index(eos) + 1]
        result.append(tokens)
    return result


def test_greedy_equals_transformers_alone_and_batched(folder):
    _check_greedy(folder)


def test_mbart_greedy_equals_transformers(tmp_path):
    _check_greedy(save_encdec_checkpoint("mbart", tmp_path))  # pre-norm, scaled embeddings


def _check_greedy(folder) -> None:
    hf = load_hf(folder)
    prompts = _prompts(6, seed=3)
    want = [_hf_generate(hf, p)[0] for p in prompts]
    engine = _engine(folder)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    alone = [engine.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    batched = [o.outputs[0].token_ids for o in engine.generate(prompts, greedy)]
    staggered = run_staggered(engine, prompts, [greedy] * len(prompts), arrive_every=2)
    assert [list(t) for t in alone] == want
    assert [list(t) for t in batched] == want
    assert [list(staggered[i].outputs[0].token_ids) for i in range(len(prompts))] == want
    assert_no_leaks(engine)
    # 5 tokens a step: long encoder inputs arrive over several prefill chunks, each running its
    # share of the encoder (tests/engine/test_encoder_chunking.py), beside other decodes.
    chunked = _engine(folder, max_num_batched_tokens=5, max_num_seqs=4, target_itl_ms=None)
    outs = run_staggered(chunked, prompts, [greedy] * len(prompts), arrive_every=1)
    assert [list(outs[i].outputs[0].token_ids) for i in range(len(prompts))] == want
    assert_no_leaks(chunked)


@pytest.mark.parametrize(("width", "n", "lp", "es"), [(2, 2, 1.0, True), (4, 3, 0.5, False)])
def test_beam_search_equals_transformers(folder, width, n, lp, es):
    hf = load_hf(folder)
    prompts = _prompts(3, seed=5)
    engine = _engine(folder)
    params = beam_params(width, n, lp, es, max_tokens=MAX_TOKENS)
    outs = engine.generate(prompts, [params] * len(prompts))  # batched beam groups
    for prompt, out in zip(prompts, outs, strict=True):
        want = _hf_generate(
            hf,
            prompt,
            num_beams=width,
            num_return_sequences=n,
            length_penalty=lp,
            early_stopping=es,
        )
        assert [list(o.token_ids) for o in out.outputs] == want
    assert_no_leaks(engine)


def test_beams_share_the_encoder_blocks_and_never_copy_them(folder):
    engine = _engine(folder)
    prompt = _prompts(1, seed=7)[0] * 3  # a few blocks of encoder input
    params = SamplingParams(
        temperature=0.0, n=4, best_of=4, use_beam_search=True, max_tokens=MAX_TOKENS,
        ignore_eos=True,
    )  # fmt: skip
    copied: list[tuple[int, int]] = []
    execute = engine.runner.execute

    def spy(chunks, block_copies=(), full_logits_for=frozenset()):
        copied.extend(block_copies)
        return execute(chunks, block_copies, full_logits_for)

    engine.runner.execute = spy
    engine.add_request("beams", prompt, params)
    region = engine.get_request("beams").seqs[0].decoder_start // BLOCK
    original = None
    while engine.has_unfinished_requests():
        engine.step()
        request = engine.get_request("beams")
        if request is not None and len(request.live_seqs) > 1:
            tables = {tuple(s.block_table[:region]) for s in request.live_seqs}
            assert len(tables) == 1, "every beam reads the same encoder blocks"
            original = original or next(iter(tables))
    assert original is not None, "the beams never ran side by side"
    assert copied, "the beams never wrote into a shared decoder block"
    assert not {src for src, _ in copied} & set(original), "an encoder block was copied"
    assert_no_leaks(engine)


def test_preempted_request_recomputes_its_encoder_and_equals_its_solo_run(folder):
    prompts = _prompts(6, seed=9)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    solo = [o.outputs[0].token_ids for o in _engine(folder).generate(prompts, greedy)]
    # Both families: 3 decoder layers x (K, V) x 48 values x 4 bytes x 4 tokens = 4608 bytes a
    # block; 14 blocks hold about two of these requests at their longest.
    small = _engine(folder, kv_cache_memory_bytes=14 * 4608)
    assert small.stats().kv_blocks_total == 14
    outs = small.generate(prompts, greedy)
    assert small.stats().num_preemptions >= 1, "nothing was preempted; shrink the cache"
    assert [o.outputs[0].token_ids for o in outs] == solo
    assert_no_leaks(small)


def test_prompt_logprobs_are_refused_naming_the_field(folder):
    engine = _engine(folder)
    with pytest.raises(InvalidRequest) as err:
        engine.add_request("x", [5, 6, 7], SamplingParams(prompt_logprobs=1))
    assert err.value.field == "prompt_logprobs"
    out = engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=2))[0]
    assert list(out.prompt_token_ids) == [5, 6, 7]  # the encoder input, not the layout


def test_logprobs_equal_transformers_scores(folder):
    hf = load_hf(folder)
    prompt = _prompts(1, seed=11)[0]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            use_cache=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, 1:].tolist()
    want = [float(s.log_softmax(-1)[0, t]) for s, t in zip(out.scores, tokens, strict=False)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1)
    got = _engine(folder).generate([prompt], params)[0].outputs[0]
    assert list(got.token_ids) == tokens[: len(got.token_ids)]
    assert [e.logprob for e in got.logprobs] == pytest.approx(want[: len(got.token_ids)], abs=1e-4)


def test_seeded_samples_do_not_depend_on_the_batch(folder):
    prompts = _prompts(4, seed=13)
    sampled = SamplingParams(temperature=2.0, seed=7, n=3, max_tokens=MAX_TOKENS, ignore_eos=True)
    others = [
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        SamplingParams(temperature=1.0, seed=1, max_tokens=4),
        SamplingParams(temperature=0.0, n=2, best_of=2, use_beam_search=True, max_tokens=5),
    ]
    engine = _engine(folder)
    alone = engine.generate([prompts[0]], sampled)[0]
    batched = engine.generate(prompts, [sampled, *others])[0]
    assert len(alone.outputs) == 3
    assert [o.token_ids for o in batched.outputs] == [o.token_ids for o in alone.outputs]
    assert len({tuple(o.token_ids) for o in alone.outputs}) > 1  # the three samples differ
    assert_no_leaks(engine)


def test_forced_bos_token_opens_every_answer_as_in_transformers(tmp_path):
    folder = save_encdec_checkpoint("bart", tmp_path)  # bart-large-cnn's folders set it to 0
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"forced_bos_token_id": 0}))
    hf = load_hf(folder)
    engine = _engine(folder)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS - 1)
    for prompt in _prompts(3, seed=17):
        want = _hf_generate(hf, prompt, forced_bos_token_id=0)[0]
        got = engine.generate([prompt], greedy)[0].outputs[0].token_ids
        assert want[0] == 0 and want[1:] == list(got)  # the engine puts it in the prompt


def test_repetition_penalty_reads_the_decoder_tokens_as_transformers(folder):
    hf = load_hf(folder)
    engine = _engine(folder)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.8)
    for prompt in _prompts(3, seed=19):
        want = _hf_generate(hf, prompt, repetition_penalty=1.8)[0]
        assert list(engine.generate([prompt], params)[0].outputs[0].token_ids) == want


def test_prefix_cache_reuses_an_encoder_only_for_the_same_whole_input(folder):
    hf = load_hf(folder)
    base = _prompts(1, seed=21)[0] * 2  # 2 x up to 18 tokens: several region blocks
    # Same first blocks, another end: their cross K/V differ everywhere (a bidirectional
    # encoder), so nothing of `base`'s region may serve them.
    other = base[:-1] + [3 + (base[-1] - 2) % (VOCAB - 3)]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    engine = _engine(folder)
    first = engine.generate([base], greedy)[0]
    again = engine.generate([base, other], greedy)
    assert again[0].metrics.num_cached_prompt_tokens >= len(base)  # the encoder was reused
    assert again[1].metrics.num_cached_prompt_tokens == 0
    for prompt, out in zip([base, base, other], [first, *again], strict=True):
        assert list(out.outputs[0].token_ids) == _hf_generate(hf, prompt)[0]
    assert_no_leaks(engine)
