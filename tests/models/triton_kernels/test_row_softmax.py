"""The Triton temperature + softmax / log-softmax equals torch's on the scaled rows (vocab
over several blocks and not a multiple of one, masked -inf tokens, temperatures per row); a
row's result does not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from tests.models.triton_kernels.row_checks import assert_rows_batch_invariant


def _logits(rows: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 7 + vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 5
    logits[:, ::3] = float("-inf")  # masked tokens (grammar, top-k)
    temperature = 0.3 + torch.rand(rows, generator=gen) * 1.5
    return logits.to(device), temperature.to(device)


@pytest.mark.parametrize("rows,vocab", [(1, 50), (4, 2500)])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("with_temperature", [False, True])
def test_equals_torch(triton_kernels, rows, vocab, log, with_temperature) -> None:
    from models.triton_kernels.row_softmax import row_softmax

    logits, temperature = _logits(rows, vocab, triton_kernels)
    t = temperature if with_temperature else None
    scaled = logits / temperature.unsqueeze(1) if with_temperature else logits
    want = scaled.log_softmax(-1) if log else scaled.softmax(-1)
    got = row_softmax(logits, t, log=log)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if not log:
        assert torch.equal(got == 0, logits == float("-inf"))  # masked: never drawn


def test_a_row_does_not_depend_on_the_batch(triton_kernels) -> None:
    from models.triton_kernels.row_softmax import row_softmax

    logits, temperature = _logits(5, 1500, triton_kernels)
    assert_rows_batch_invariant(row_softmax, logits, temperature)
