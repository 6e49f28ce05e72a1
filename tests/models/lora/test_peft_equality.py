"""An adapter loaded from a PEFT folder gives transformers + peft's logits and greedy tokens
(float32, 1e-4), unmerged and merged (`merge_and_unload()`), through the PyTorch layers over the
paged cache: a prefill, then decode steps crossing blocks. rsLoRA, rank_pattern and
alpha_pattern, and adapters on a subset of the projections (Qwen3: q/k norms, head_dim 32)."""

from __future__ import annotations

import pytest
import torch

from tests.checkpoints import VOCAB, make_hf_model
from tests.models.lora.peft_adapters import load_into, make_peft_adapter, ours_with_bank
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits

TOL = 1e-4
CASES = {
    "all7": ("llama", {}),
    "rslora_patterns": (
        "llama",
        {
            "r": 6,
            "use_rslora": True,
            "rank_pattern": {"down_proj": 3, "q_proj": 8},
            "alpha_pattern": {"v_proj": 2.5},
        },
    ),
    "qwen3_qv": ("qwen3", {"target_modules": ["q_proj", "v_proj"], "r": 2, "lora_alpha": 16}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_adapter_equals_peft_unmerged_and_merged(case: str, tmp_path) -> None:
    arch, kwargs = CASES[case]
    hf = make_hf_model(arch)
    peft_model = make_peft_adapter(hf, tmp_path / "adapter", seed=3, **kwargs)
    ours, bank = ours_with_bank(hf)
    load_into(bank, 2, tmp_path / "adapter")
    prompt = torch.randint(3, VOCAB, (9,), generator=torch.Generator().manual_seed(5)).tolist()

    driver = PagedDriver(ours, block_size=4)
    seq = driver.add_sequence()
    logits = driver.step({seq: prompt}, adapters={seq: 2})
    torch.testing.assert_close(logits[seq], hf_logits(peft_model, prompt), atol=TOL, rtol=0)
    assert not torch.allclose(logits[seq], hf_logits(hf, prompt), atol=1e-2), "adapter is a no-op"
    tokens = list(prompt)
    for _ in range(6):
        tokens.append(int(logits[seq][-1].argmax()))
        logits = driver.step({seq: tokens[-1:]}, adapters={seq: 2})
        torch.testing.assert_close(
            logits[seq][-1], hf_logits(peft_model, tokens)[-1], atol=TOL, rtol=0
        )
    with torch.no_grad():
        greedy = peft_model.generate(
            torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0
        )[0, len(prompt) :]
    assert tokens[len(prompt) :] == greedy.tolist()
    merged = peft_model.merge_and_unload()
    torch.testing.assert_close(logits[seq][-1], hf_logits(merged, tokens)[-1], atol=TOL, rtol=0)


def test_base_rows_ignore_loaded_adapters(tmp_path) -> None:
    """Rows of slot -1 (and steps without rows) are the base model's, adapters loaded or not."""
    hf = make_hf_model("llama")
    make_peft_adapter(hf, tmp_path / "adapter", seed=4)
    ours, bank = ours_with_bank(hf)
    load_into(bank, 0, tmp_path / "adapter")
    prompt = list(range(3, 14))
    driver = PagedDriver(ours, block_size=4)
    a, b = driver.add_sequence(), driver.add_sequence()
    logits = driver.step({a: prompt, b: prompt}, adapters={a: -1})
    torch.testing.assert_close(logits[a], hf_logits(hf, prompt), atol=TOL, rtol=0)
    torch.testing.assert_close(logits[b], hf_logits(hf, prompt), atol=TOL, rtol=0)
