"""A long encoder input is a prefill like any other: under a small token budget its encoder runs
over many steps, a step's share bounded by its chunk (models/encdec/staged_encoder.py), while
the requests already decoding get a token every step; and every answer is unchanged: the long
request's equals transformers' `generate` in float64, the decoding ones' equal their runs alone.
(Not transformers' float32 run: on an AVX2 host its BART picks 38 over 82 at the long
request's 8th token, logits 0.007 apart, where float64 has 82 ahead by 0.044, as ours.)"""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from models.encdec.staged_encoder import TILE
from tests.devices import selected_device
from tests.encdec_checkpoints import VOCAB, load_hf, save_encdec_checkpoint
from tests.engine.engine_fixtures import assert_no_leaks

BUDGET = 16  # max_num_batched_tokens
LONG = 100  # encoder tokens (BART's test folders hold 128 positions, region and decoder)
MAX_TOKENS = 8


@pytest.fixture(scope="module", params=["t5v11", "bart"])
def folder(request, tmp_path_factory):
    return save_encdec_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def _engine(folder) -> Engine:
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=2_000_000,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=BUDGET,
        target_itl_ms=None,
        device=str(selected_device()),
    )
    return Engine.from_model(str(folder), config)


def _count_encoder_rows(model) -> list[int]:
    """Rows through each encoder phase (embedding, a layer, the cross K/V), summed into
    counter[0]: one row through one phase is one unit of `TILE`-row work's share."""
    counter = [0]
    for name in ("encoder_embed", "encoder_finish", "cross_kv"):
        method = getattr(model, name)

        def counted(*args, _method=method):
            rows = next(a for a in args if isinstance(a, torch.Tensor))
            counter[0] += rows.shape[0]
            return _method(*args)

        setattr(model, name, counted)
    return counter


def test_a_long_encoder_input_is_chunked_beside_decodes_and_changes_no_answer(folder):
    rng = random.Random(5)
    long_prompt = [rng.randrange(3, VOCAB) for _ in range(LONG)]
    shorts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (3, 5, 2)]
    decoding = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    engine = _engine(folder)
    solo = [list(engine.generate([p], decoding)[0].outputs[0].token_ids) for p in shorts]
    counter = _count_encoder_rows(engine.runner.model)
    for i, prompt in enumerate(shorts):
        engine.add_request(f"short{i}", prompt, decoding)
    got: dict[str, list[int]] = {}
    while len(got) < len(shorts):  # until all three decode
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    engine.add_request("long", long_prompt, greedy)
    steps = []  # (encoder rows, requests that got a token) per step
    while engine.has_unfinished_requests():
        counter[0] = 0
        outs = engine.step()
        for out in outs:
            got.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        steps.append((counter[0], {o.request_id for o in outs}))
    with torch.no_grad():  # the oracle in float64: its float32 run has near ties of its own
        hf_kw = dict(max_new_tokens=MAX_TOKENS, do_sample=False, use_cache=False)
        hf = load_hf(folder, torch.float64)
        want = hf.generate(torch.tensor([long_prompt]), **hf_kw)[0, 1:].tolist()
    eos = engine.runner.config.eos_token_ids[0]
    assert got["long"] == (want[: want.index(eos) + 1] if eos in want else want)
    assert [got[f"short{i}"] for i in range(len(shorts))] == solo
    encoding = [(rows, who) for rows, who in steps if rows]
    phases = engine.runner.model.encoder_num_layers + 2
    whole = LONG * phases
    assert sum(rows for rows, _ in encoding) == whole  # each unit once
    assert len(encoding) >= 5, "the encoder was not spread over steps"
    # A step's chunk of the region is at most the budget; the units it pays for come to
    # phases rows a slot, plus at most one tile's unit beyond.
    assert max(rows for rows, _ in encoding) <= phases * BUDGET + TILE < whole
    for _, who in encoding[:-1]:  # every step while encoding, each decoding request got a token
        assert {f"short{i}" for i in range(len(shorts))} <= who
    assert_no_leaks(engine)
