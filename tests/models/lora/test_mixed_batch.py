"""One step serves rows of four adapters and of the base model together, through the C++ step
(models/cpu_kernels/fused_decoder.py + lora.cpp) and the PyTorch layers: every sequence's logits
equal its solo run bit for bit (prefill chunks beside decodes), and equal transformers + peft
(float32, 1e-4) -- the C++ step's LoRA is checked against the oracle here."""

from __future__ import annotations

import pytest
import torch

from models.cpu_kernels.fused_decoder import FusedDecoder
from models.forward_path import select_forward_path
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.lora.peft_adapters import load_into, make_peft_adapter, ours_with_bank
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits

pytestmark = pytest.mark.cpu_kernels


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    hf = make_hf_model("qwen2")  # q/k/v biases: the adapter adds after the bias
    folder = tmp_path_factory.mktemp("adapters")
    peft_models = [
        make_peft_adapter(hf, folder / str(i), seed=10 + i, r=2 + 2 * i) for i in range(4)
    ]
    return hf, folder, peft_models


def runner_for(hf, folder, path: str, dtype: torch.dtype):
    model, bank = ours_with_bank(hf, slots=4, dtype=dtype)
    for slot in range(4):
        load_into(bank, slot, folder / str(slot), name=str(slot))
    driver = PagedDriver(model, block_size=4)
    if path == "cpp":
        return driver, FusedDecoder.build(model, driver.kv)
    return driver, select_forward_path(model, driver.kv, torch.device("cpu"), cpu_kernels=True)


def run(driver, fused, plan: list[dict[int, list[int]]], slots: dict[int, int]):
    """Feeds the steps of `plan` (seq -> new tokens); returns each seq's logits, step by step."""
    seqs = {s: driver.add_sequence() for s in slots}
    out: dict[int, list[torch.Tensor]] = {s: [] for s in slots}
    for step in plan:
        feed = {seqs[s]: toks for s, toks in step.items() if s in slots}
        if not feed:
            continue
        adapters = {seqs[s]: slot for s, slot in slots.items()}
        logits = driver.step(feed, fused=fused, adapters=adapters)
        for s in slots:
            if seqs[s] in logits:
                out[s].append(logits[seqs[s]])
    return out


@pytest.mark.parametrize("path, dtype", [("cpp", torch.float32), ("cpp", torch.bfloat16),
                                         ("pytorch", torch.bfloat16)])  # fmt: skip
def test_mixed_adapters_equal_solo_runs_bitwise(setup, path: str, dtype: torch.dtype) -> None:
    hf, folder, peft_models = setup
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (6, 9, 5, 12, 7)]
    slots = {0: 0, 1: 1, 2: -1, 3: 2, 4: 3}  # sequence -> adapter slot (2: the base model)
    extra = [[int(t)] for t in torch.randint(3, VOCAB, (3,), generator=gen)]
    plan = [
        {0: prompts[0], 1: prompts[1], 2: prompts[2]},
        {0: extra[0], 1: extra[0], 2: extra[0], 3: prompts[3][:5], 4: prompts[4]},
        {0: extra[1], 1: extra[1], 2: extra[1], 3: prompts[3][5:], 4: extra[1]},
        {s: extra[2] for s in slots},
    ]
    together = run(*runner_for(hf, folder, path, dtype), plan, slots)
    for s, slot in slots.items():
        alone = run(*runner_for(hf, folder, path, dtype), plan, {s: slot})
        for a, b in zip(together[s], alone[s], strict=True):
            assert torch.equal(a, b), f"sequence {s} (slot {slot}) differs from its solo run"
    if dtype == torch.float32:  # the C++ step's adapters against the oracle
        for s, slot in slots.items():
            tokens = [t for step in plan for t in step.get(s, [])]
            oracle = hf if slot < 0 else peft_models[slot]
            last = together[s][-1][-1]
            torch.testing.assert_close(last, hf_logits(oracle, tokens)[-1], atol=1e-4, rtol=0)
