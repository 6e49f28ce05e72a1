"""ModelRunner: one forward per step, logits only for sampling rows, and never a token id
beyond what the tokenizer can decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch

from engine.model_runner import ModelRunner
from engine.scheduling.step_plan import ScheduledChunk
from models import build_model
from models.config import ModelConfig
from tests.checkpoints import make_hf_model


@dataclass
class _Seq:
    token_ids: list[int]
    block_table: list[int] = field(default_factory=lambda: [0, 1, 2, 3])


# The scheduler's chunk of a fake sequence, without a request: _Chunk(seq, start, n, sample).
_Chunk = partial(ScheduledChunk, None)


def _runner(
    sampleable_vocab=None, dtype=torch.float32, device: torch.device | str = "cpu"
) -> tuple[ModelRunner, torch.nn.Module]:
    """A runner on `device` and the transformers model it was made from (moved there too)."""
    hf = make_hf_model("llama").to(device)
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    model = build_model(config, dtype, device)
    model.load_weights(hf.state_dict().items())
    device = torch.device(device)
    runner = ModelRunner(model, config, 16, 4, dtype, device, sampleable_vocab=sampleable_vocab)
    return runner, hf


def test_logits_only_for_sampling_rows_and_equal_to_transformers(device) -> None:
    runner, hf = _runner(device=device)
    a, b = _Seq(list(range(3, 12))), _Seq(list(range(20, 26)), [4, 5, 6, 7])
    out = runner.forward([_Chunk(a, 0, 9, True), _Chunk(b, 0, 4, False)])
    assert out.sampling.shape == (1, hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(torch.tensor([a.token_ids], device=device)).logits[0, -1]
    torch.testing.assert_close(out.sampling[0], ref, atol=1e-4, rtol=0)


def test_padded_vocabulary_rows_are_never_offered_to_the_sampler(device) -> None:
    full, _ = _runner(device=device)
    limited, _ = _runner(sampleable_vocab=200, device=device)
    seq = _Seq(list(range(3, 12)))
    want = full.forward([_Chunk(seq, 0, 9, True)]).sampling
    got = limited.forward([_Chunk(seq, 0, 9, True)]).sampling
    assert got.shape == (1, 200)
    torch.testing.assert_close(got, want[:, :200])


def test_one_token_steps_through_invariant_linears_equal_plain_f_linear(monkeypatch) -> None:
    """The PyTorch path's padded-row linears (models/linear_backend) against plain F.linear,
    fp32 and bf16; torch's global oneDNN flag is never touched."""
    from models import forward_path

    onednn = torch.backends.mkldnn.enabled
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 0.1)):
        outs = []
        for fast in (True, False):
            if not fast:
                monkeypatch.setattr(forward_path, "use_invariant_linears", lambda model: 0)
            runner, _ = _runner(dtype=dtype)
            seq = _Seq(list(range(3, 12)))
            runner.forward([_Chunk(seq, 0, 8, False)])
            outs.append(runner.forward([_Chunk(seq, 8, 1, True)]).sampling.float())
        torch.testing.assert_close(outs[0], outs[1], atol=tol, rtol=0)
        monkeypatch.undo()
    assert torch.backends.mkldnn.enabled == onednn
