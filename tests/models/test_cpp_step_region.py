"""The C++ decode step in one OpenMP region per layer (models/cpu_kernels/step_region.h) against
the op-by-op step it replaces for decodes of up to 8 rows (each op its own region; itself
checked against the eager path and transformers in test_fused_decoder.py and gguf/): the same
logits bit for bit, on a tiny Llama GGUF with its blocks as stored (Q4_1: the block kernels)
and with int8 activations (Q8 panels), float32 and int8 K/V rows, at one and three rows (its
gate_up has 6 gate panels: two threads get 2 and 4, uneven units)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from models.activation_quant import quantize_activations_int8
from models.cpu_kernels.fused_decoder import FusedDecoder
from models.loader import load_model
from tests.models.gguf.test_stored import VOCAB, tiny_quantised_gguf
from tests.models.paged_driver import PagedDriver

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


@pytest.mark.parametrize(
    ("int8_activations", "kv_cache_dtype"), [(False, "auto"), (True, "auto"), (True, "int8")]
)
def test_one_region_step_equals_the_op_by_op_step(
    tmp_path, int8_activations: bool, kv_cache_dtype: str
) -> None:
    path = tiny_quantised_gguf(tmp_path, QT.Q4_1, tied=True)
    model, _ = load_model(path, "float32", "cpu", use_cache=False)
    if int8_activations:
        quantize_activations_int8(model)
    driver = PagedDriver(model, block_size=4, kv_cache_dtype=kv_cache_dtype)
    fused = FusedDecoder.build(model, driver.kv)
    assert fused is not None and fused.runs_one_region
    gen = torch.Generator().manual_seed(3)
    tokens = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 9, 13)]
    for _ in tokens:
        driver.add_sequence()
    logits = driver.step(dict(enumerate(tokens)), fused=fused)  # 27 rows: op by op
    last = {s: rows[-1] for s, rows in logits.items()}
    for rows in ((0, 1, 2), (1,), (0, 1, 2)):
        nxt = {s: [int(last[s].argmax())] for s in rows}
        lens, fused.one_region = list(driver.lens), False
        want = driver.step(nxt, fused=fused)
        driver.lens[:], fused.one_region = lens, True  # the same K/V slots written again
        logits = driver.step(nxt, fused=fused)
        for s in nxt:
            assert torch.equal(logits[s], want[s]), f"row {s} of {len(nxt)}"
            last[s] = logits[s][-1]
