"""A decode step of the capturable forward path (the Triton path, models/forward_path.py
`TritonPath`) on CPU, for the capture tests: a tiny GQA model with a sliding window (Mistral),
three sequences prefilled through the path, their next tokens as host rows, and the path's
persistent decode buffers. The Triton kernels run in the interpreter (TRITON_INTERPRET=1,
tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.decode_buffers import DecodeBuffers
from models.forward_path import TritonPath
from models.linear_backend import use_invariant_linears
from tests.checkpoints import make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from

PROMPT_LENS = (12, 3, 6)  # the first crosses the tiny Mistral's window of 8, and its next
# token opens a new block
MAX_ROWS = 8


@dataclass
class DecodeCase:
    path: TritonPath
    driver: PagedDriver
    buffers: DecodeBuffers
    scratch: int  # the block only padding rows touch
    token_ids: list[int]
    positions: list[int]
    tables: list[list[int]]

    def eager_logits(self) -> torch.Tensor:
        """The same decode step through the path's eager metadata (backend.build): the oracle."""
        step = self.driver.step({s: [t] for s, t in enumerate(self.token_ids)}, fused=self.path)
        return torch.cat([step[s] for s in range(len(self.token_ids))])


def decode_case(seed: int = 0, kv_cache_dtype: str = "auto") -> DecodeCase:
    """`kv_cache_dtype` "fp8": the cache holds e4m3 rows (models/kv_fp8.py)."""
    model = ours_from(make_hf_model("mistral"), torch.float32)
    # Linears whose rows do not depend on the batch size (what the CPU paths run), so a step
    # padded to its bucket can be compared bit for bit with the unpadded one.
    use_invariant_linears(model)
    driver = PagedDriver(model, block_size=4, kv_cache_dtype=kv_cache_dtype)
    scratch = driver.free.pop()
    path = TritonPath(model, driver.kv)
    gen = torch.Generator().manual_seed(seed)
    prompts = {}
    for n in PROMPT_LENS:
        prompts[driver.add_sequence()] = torch.randint(3, 300, (n,), generator=gen).tolist()
    driver.step(prompts, fused=path)
    width = 6  # blocks per row in the buffers: room for 24 tokens
    buffers = path.attention.decode_buffers(MAX_ROWS, width, scratch)
    token_ids = torch.randint(3, 300, (len(PROMPT_LENS),), generator=gen).tolist()
    positions = list(driver.lens)
    tables, taken = [], 0
    for seq, pos in enumerate(positions):  # the blocks the new token needs, as the driver adds
        table = list(driver.tables[seq])
        while len(table) * driver.block_size <= pos:
            taken += 1
            table.append(driver.free[-taken])
        tables.append(table)
    return DecodeCase(path, driver, buffers, scratch, token_ids, positions, tables)
