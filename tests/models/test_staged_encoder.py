"""The staged encoder pass (models/encdec/staged_encoder.py): however its units are split over
steps, and whatever other inputs run beside it at whatever progress, an input's cross K/V are
bit for bit those of its encoder run whole (which tests/models/test_encdec_vs_transformers.py
holds against transformers), in float32 and bfloat16, with the CPU's batch-invariant linears
the runner uses; and the units a region's slots pay for never run ahead of them."""

from __future__ import annotations

import random

import pytest
import torch

from models.encdec.staged_encoder import TILE, EncoderPass, advance
from models.linear_backend import use_invariant_linears
from models.loader import load_model
from tests.encdec_checkpoints import VOCAB, save_encdec_checkpoint

LENGTHS = (1, 15, 16, 17, 40, 70)  # around the tile's edges


@pytest.fixture(scope="module", params=["t5v11", "bart"])
def folder(request, tmp_path_factory):
    return save_encdec_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def _inputs(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]


def _whole(model, inputs) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each input's cross K/V from its encoder run alone, all units in one call."""
    result = []
    for ids in inputs:
        encoder = EncoderPass(ids, model.encoder_num_layers)
        advance(model, [(encoder, encoder.num_units)])
        assert encoder.complete
        result.append(encoder.cross)
    return result


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@torch.inference_mode()
def test_any_split_of_the_units_gives_the_bits_of_the_whole_pass(folder, dtype):
    model, _ = load_model(folder, dtype, torch.device("cpu"))
    use_invariant_linears(model)
    inputs = _inputs(seed=3)
    want = _whole(model, inputs)
    rng = random.Random(7)
    for _ in range(3):  # three random schedules: each step advances a random subset
        passes = [EncoderPass(ids, model.encoder_num_layers) for ids in inputs]
        while not all(p.complete for p in passes):
            work = [
                (p, p.done + rng.randint(1, 2 * p.num_tiles))
                for p in passes
                if not p.complete and rng.random() < 0.7
            ]
            advance(model, work)
        for p, cross in zip(passes, want, strict=True):
            for (k, v), (k_want, v_want) in zip(p.cross, cross, strict=True):
                assert torch.equal(k, k_want) and torch.equal(v, v_want), p.length
            assert p.x is None and not p.kv  # the layers' state is freed once staged


def test_units_follow_the_region_slots_they_are_paid_by():
    encoder = EncoderPass(list(range(3, 43)), num_layers=4)  # 40 rows: 3 tiles, 6 phases
    region = 44
    assert encoder.num_units == 6 * -(-40 // TILE)
    due = [encoder.units_at(s, region) for s in range(region + 3)]
    assert due[0] == 0 and due[region] == encoder.num_units == due[-1]
    assert all(b >= a for a, b in zip(due, due[1:], strict=False))
    # A chunk of c slots pays for at most c * units / region + 1 units: no step runs ahead.
    for start in range(region):
        for end in range(start + 1, region + 1):
            assert due[end] - due[start] <= (end - start) * encoder.num_units / region + 1
