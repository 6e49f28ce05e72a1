"""Our models' logits equal transformers' (fp32, 1e-4) through the paged KV cache: a batched
prefill of sequences of different lengths, then 24 batched decode steps crossing blocks.
Both models run on the tests' device (TGSERVE_TEST_DEVICE, default cpu)."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.config import ModelConfig
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver

TOL = 1e-4


def ours_from(hf_model, device: torch.device | str = "cpu") -> torch.nn.Module:
    """Ours, with the weights of `hf_model`, on `device` (the HF model is moved there too)."""
    config = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    model = build_model(config, torch.float32, device)
    hf_model.to(device)
    model.load_weights(hf_model.state_dict().items())
    return model


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    device = next(hf_model.parameters()).device
    with torch.no_grad():
        return hf_model(torch.tensor([tokens], device=device)).logits[0].float()


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3", "mistral", "gpt2"])
def test_logits_equal_transformers_prefill_then_decode(arch: str, device) -> None:
    hf = make_hf_model(arch)
    ours = ours_from(hf, device)
    driver = PagedDriver(ours, block_size=4)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 11, 18)]
    seqs = [driver.add_sequence() for _ in prompts]
    logits = driver.step(dict(zip(seqs, prompts, strict=True)))
    for seq, prompt in zip(seqs, prompts, strict=True):
        torch.testing.assert_close(logits[seq], hf_logits(hf, prompt), atol=TOL, rtol=0)
    tokens = [list(p) for p in prompts]
    for _ in range(24):
        nxt = {s: [int(logits[s][-1].argmax())] for s in seqs}
        logits = driver.step(nxt)
        for s in seqs:
            tokens[s] += nxt[s]
            torch.testing.assert_close(
                logits[s][-1], hf_logits(hf, tokens[s])[-1], atol=TOL, rtol=0
            )


def test_mixed_prefill_chunks_and_decodes_in_one_forward(device) -> None:
    """A prompt fed in chunks while another sequence decodes gives the same logits."""
    hf = make_hf_model("mistral")  # sliding window 8 < the sequences
    ours = ours_from(hf, device)
    driver = PagedDriver(ours, block_size=4)
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (9, 23))
    sa, sb = driver.add_sequence(), driver.add_sequence()
    out = driver.step({sa: a, sb: b[:7]})
    for chunk_end in (14, 23):
        start = driver.lens[sb]
        nxt = int(out[sa][-1].argmax())
        a.append(nxt)
        out = driver.step({sa: [nxt], sb: b[start:chunk_end]})
        torch.testing.assert_close(out[sa][-1], hf_logits(hf, a)[-1], atol=TOL, rtol=0)
        torch.testing.assert_close(out[sb], hf_logits(hf, b[:chunk_end])[start:], atol=TOL, rtol=0)


def test_qwen2_bias_and_tied_embeddings_are_loaded() -> None:
    hf = make_hf_model("llama", tie_word_embeddings=True)
    ours = ours_from(hf)
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    with pytest.raises(ValueError, match="shape"):
        bad = dict(hf.state_dict())
        bad["model.norm.weight"] = torch.ones(3)
        ours.load_weights(bad.items())
