"""Pipeline parallel over gloo ranks computes what one process computes: the same logits
(fp32 within 1e-5) through prefill chunks (the first step's 16 rows are cut into two
micro-batches of 8 across a chunk's rows), decodes (one row per micro-batch), a
copy-on-write block copy and prompt-logprob rows; at PP=2 (a 3-layer Llama: 1 + 2 layers,
the remainder on the last stage) on the PyTorch layers and with the C++ attention (float32
and int8 K/V rows: the hidden states between stages stay in the model's dtype), and at
TP=2 x PP=2 (4 processes). Stages overlap: stage 0 does not start micro-batch 1 of a step
until stage 1 has finished micro-batch 0 (a hook that waits on the other stage; without the
overlap that wait would never end, and the test fails on its timeout)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.checkpoints import save_checkpoint
from tests.engine.parallel.tp_driver import run_tp, run_tp1

# (dtype, C++ kernels[, KV cache dtype]): int8 K/V rows (models/kv_quant.py) on the C++ attention
CASES = [("float32", False), ("float32", True), ("float32", True, "int8")]


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return save_checkpoint("llama", tmp_path_factory.mktemp("pp") / "llama", num_hidden_layers=3)


@pytest.fixture(scope="module")
def solo(llama3):
    return {case: run_tp1(llama3, *case) for case in CASES}


class StageOneFirst:
    """Every stage's `trace`: stage 0 waits, before micro-batch 1 of a step, until stage 1 has
    finished micro-batch 0 (counted in `waited`; a wait that times out in `stuck`)."""

    def __init__(self, ctx) -> None:
        self.done = ctx.Event()
        self.waited = ctx.Value("i", 0)
        self.stuck = ctx.Value("i", 0)

    def __call__(self, stage: int, micro_batch: int, event: str) -> None:
        if (stage, micro_batch, event) == (1, 0, "end"):
            self.done.set()
        elif (stage, micro_batch, event) == (0, 1, "start"):
            counter = self.waited if self.done.wait(WAIT_S) else self.stuck
            self.done.clear()  # stage 1 sets it again only after this step's next send
            with counter.get_lock():
                counter.value += 1


WAIT_S = 30.0  # a bound on a deadlock, not a timing: a passing wait returns at once


@pytest.fixture(scope="module")
def pp2(llama3):
    hook = StageOneFirst(mp.get_context("spawn"))
    runs = run_tp([(llama3, *case) for case in CASES], world=1, stages=2, hook=hook)
    return runs, hook


def _compare(want, got) -> None:
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        assert w.shape == g.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


def test_pp2_logits_equal_one_process(pp2, solo) -> None:
    runs, _ = pp2
    for case, (got, description) in zip(CASES, runs, strict=True):
        assert ("C++ paged attention" in description) == case[1]
        _compare(solo[case], got)


def test_stage_1_finishes_micro_batch_0_before_stage_0_starts_micro_batch_1(pp2) -> None:
    _, hook = pp2
    # Per case, 7 of the script's 8 steps have two rows or more: two micro-batches each.
    assert (hook.waited.value, hook.stuck.value) == (len(CASES) * 7, 0)


def test_tp2_x_pp2_logits_equal_one_process(llama3, solo) -> None:
    ((got, _),) = run_tp([(llama3, "float32", False)], world=2, stages=2)
    _compare(solo[("float32", False)], got)
