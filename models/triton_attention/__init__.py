"""Triton kernels of the GPU path: paged attention of mixed steps and the K/V slot write.

`paged_attention.py` (the attention, reading K/V in place through the block tables),
`split_decode.py` (decode-only steps of a few rows with each row's keys split across programs,
where batch invariance is not promised),
`tile_plan.py` (how a step's rows are cut into its query tiles, built once per step) and
`kv_write.py` (storing a step's K/V at their slots). They run on CUDA tensors, and on CPU
tensors under `TRITON_INTERPRET=1` (CI tests them so against the float64 reference). The
forward path (models/forward_path.py) switches them on for CUDA; `is_available()` says
whether triton can be imported here. Importing this package does not import triton.
"""

from __future__ import annotations

import importlib.util


def is_available() -> bool:
    return importlib.util.find_spec("triton") is not None
