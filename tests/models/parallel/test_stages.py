"""Pipeline stages split a model's layers into contiguous, near-equal ranges covering every
layer once, the remainder on the last stages (stage 0 also runs the embedding and the LM
head), and refuse a split they cannot make, saying why (hand-worked cases)."""

from __future__ import annotations

import pytest

from models.parallel.stages import plan_stages


@pytest.mark.parametrize(
    ("layers", "stages", "want"),
    [
        (3, 2, [(0, 1), (1, 3)]),
        (30, 4, [(0, 7), (7, 14), (14, 22), (22, 30)]),  # 7, 7, 8, 8
        (80, 4, [(0, 20), (20, 40), (40, 60), (60, 80)]),  # Llama-3-70B's 80 layers
        (2, 2, [(0, 1), (1, 2)]),
    ],
)
def test_stages_cover_every_layer_once_remainder_last(layers, stages, want) -> None:
    plans = [plan_stages(layers, stages, s) for s in range(stages)]
    assert [p.layers for p in plans] == want
    assert [(p.first, p.last) for p in (plans[0], plans[-1])] == [(True, False), (False, True)]


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="larger than the model's 2 layers"):
        plan_stages(2, 3, 0)
