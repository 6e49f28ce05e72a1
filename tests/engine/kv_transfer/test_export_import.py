"""A prefill engine's exported prefix, put into a decode engine's RAM tier, is loaded there as a
tier hit instead of prefilled, and the decode engine then answers greedy and seeded requests
as a single engine does (the CPU path moves the K/V bytes bit for bit): the K/V side of
prefill/decode disaggregation without the wire (test_channel.py is the wire).

Oracle: the same requests on a fresh engine without tiers (its own prefill). The decode
engine's tier-hit and prefix-hit counters show it computed only the tail; zeroed K/V in the
batch changes the answer, so the equality is not vacuous. A batch of another forward path
is refused and changes nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.kv_tiers.config import KVTierConfig
from engine.kv_transfer.link import export_prefix
from engine.kv_transfer.receiver import put_batch
from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, tiny_engine

PROMPT = random_prompts(1, (30, 30), seed=21)[0]  # 7 full blocks of 4 before the last token
BLOCKS = (len(PROMPT) - 1) // 4
GREEDY = SamplingParams(max_tokens=8, temperature=0)
SEEDED = SamplingParams(max_tokens=8, temperature=0.9, seed=5)
TIERS = KVTierConfig(ram_bytes=2_000_000)


def answers(engine) -> list[tuple[int, ...]]:
    return [engine.generate([PROMPT], p)[0].outputs[0].token_ids for p in (GREEDY, SEEDED)]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kv_transfer") / "llama"


@pytest.fixture(scope="module")
def solo(model) -> list[tuple[int, ...]]:
    return answers(tiny_engine(model))


@pytest.fixture(scope="module")
def batch(model):
    prefill = tiny_engine(model, kv_tiers=TIERS)
    prefill.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0))
    return export_prefix(prefill, PROMPT, transfer_id=7)


def test_exported_blocks_are_loaded_not_prefilled_and_answer_as_one_engine(model, solo, batch):
    assert batch.transfer_id == 7 and len(batch.keys) == BLOCKS
    assert batch.tokens[0] == tuple(PROMPT[:4]) and batch.kv.shape[0] == BLOCKS
    decode = tiny_engine(model, kv_tiers=TIERS)
    assert put_batch(decode.scheduler.block_manager.tiers.index, batch) == BLOCKS
    greedy = decode.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    stats = decode.stats()
    assert stats.kv_tiers.ram_hits == BLOCKS  # every block came from the batch
    assert stats.prefix_cache_hits == BLOCKS * 4  # only the tail was computed here
    assert [greedy, answers(decode)[1]] == solo
    assert_no_leaks(decode)


def test_zeroed_kv_changes_the_answer_so_the_equality_is_not_vacuous(model, solo, batch):
    decode = tiny_engine(model, kv_tiers=TIERS)
    zeroed = dataclasses.replace(batch, kv=batch.kv.clone().zero_())
    put_batch(decode.scheduler.block_manager.tiers.index, zeroed)
    assert decode.generate([PROMPT], GREEDY)[0].outputs[0].token_ids != solo[0]


def test_a_batch_of_another_forward_path_is_refused(model, solo, batch):
    decode = tiny_engine(model, kv_tiers=TIERS)
    foreign = dataclasses.replace(batch, digest=batch.digest ^ 1)
    assert put_batch(decode.scheduler.block_manager.tiers.index, foreign) == 0
    assert answers(decode) == solo and decode.stats().kv_tiers.ram_hits == 0
