"""Memory of a GGUF loaded as stored (models/gguf/stored.py, issue #15: resident weight bytes ≈
the file's tensor bytes).

Checked three ways, each against the file's header, not against our loader:
- the model's bytes (parameters, buffers and packed blocks, each storage once) equal the header's
  block-typed matrices (plus the documented 64-byte header of a mixed weight) and the other
  tensors' elements at the load dtype, plus the rotary table;
- no floating-point tensor as large as a block layer's matrix is created while loading (every
  aten op's output is watched by a dispatch mode): the dense matrices are never allocated;
- a ~200 MiB random Q4_0 file loaded in a fresh process grows its resident set (at peak and
  after the load) by less than 1.3x the file's tensor bytes; a dense bf16 copy would be 3.6x.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from torch.utils._python_dispatch import TorchDispatchMode

from models.block_linear import STORED_TYPES, BlockEmbedding, BlockLinear
from models.gguf.header import read_header
from models.loader import load_model
from tests.models.gguf.test_stored import q4_k_m, tiny_quantised_gguf

REPO = Path(__file__).resolve().parents[3]


def model_bytes(model: torch.nn.Module) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in
            (*model.parameters(), *model.buffers())}  # fmt: skip
    for m in model.modules():
        if isinstance(m, BlockLinear | BlockEmbedding):
            seen[m.block_weight.packed.data_ptr()] = m.block_weight.nbytes
    return sum(seen.values())


def expected_bytes(path: Path, dtype: torch.dtype, mixed_weights: int, head_dim: int) -> int:
    """From the header: block matrices as the file stores them (+ 64 bytes per mixed weight),
    every other tensor's elements in `dtype`, and the float32 rotary table [head_dim / 2]."""
    total = 64 * mixed_weights + 4 * (head_dim // 2)
    for info in read_header(path).infos:
        if len(info.shape) == 2 and QT(info.type_id) in STORED_TYPES:
            total += info.nbytes
        else:
            total += int(np.prod(info.shape)) * dtype.itemsize
    return total


@pytest.mark.parametrize(
    ("qtype", "tied", "mix"),
    [(QT.Q4_0, True, None), (QT.Q8_0, False, None), (QT.Q4_K, True, q4_k_m)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_holds_the_files_blocks_and_only_the_dense_rest(tmp_path, qtype, tied, mix, dtype):
    path = tiny_quantised_gguf(tmp_path, qtype, tied, mix)
    model, config = load_model(path, dtype, use_cache=False)
    # q4_k_m mixes types in both fused layers of both layers (tests/models/gguf/test_stored.py)
    mixed = 2 * config.num_layers if mix else 0
    assert model_bytes(model) == expected_bytes(path, dtype, mixed, config.head_dim)


class LargestFloatTensor(TorchDispatchMode):
    """Records the most elements of any floating-point tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type != "meta":
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q6_K])
def test_loading_as_stored_never_makes_a_dense_matrix(tmp_path, qtype):
    path = tiny_quantised_gguf(tmp_path, qtype, tied=False)
    sizes = [(len(i.shape), int(np.prod(i.shape))) for i in read_header(path).infos]
    smallest_matrix = min(n for rank, n in sizes if rank == 2)
    largest_vector = max(n for rank, n in sizes if rank == 1)
    assert largest_vector < smallest_matrix  # so the watch tells a norm from a matrix
    with LargestFloatTensor() as watch:
        model, _ = load_model(path, torch.bfloat16, use_cache=False)
    assert isinstance(model.model.layers[0].mlp.down_proj, BlockLinear)
    assert watch.largest < smallest_matrix, (watch.largest, smallest_matrix)
    # The watch sees dense matrices where they are made: the dequantising load makes them.
    with LargestFloatTensor() as watch:
        load_model(path, torch.bfloat16, use_cache=False, dequantize=True)
    assert watch.largest >= smallest_matrix


# A 1B-like layout scaled down: ~207 MiB of Q4_0 blocks (random bytes: the load never reads them
# as numbers, and random scales are as good as any for counting bytes).
HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, LAYERS, VOCAB = 1024, 16, 4, 4096, 20, 32000


def random_q4_0_gguf(path: Path) -> int:
    """Writes the file; returns its tensors' bytes."""
    rng = np.random.default_rng(0)
    block_elems, block_bytes = GGML_QUANT_SIZES[QT.Q4_0]
    kv = HIDDEN // HEADS * KV_HEADS
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for key, value in {
        "llama.block_count": LAYERS, "llama.context_length": 2048,
        "llama.embedding_length": HIDDEN, "llama.feed_forward_length": INTERMEDIATE,
        "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
        "llama.vocab_size": VOCAB, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }.items():  # fmt: skip
        writer.add_uint32(key, value)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)

    def matrix(name: str, rows: int, cols: int) -> None:
        raw = rng.integers(0, 256, (rows, cols // block_elems * block_bytes), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=QT.Q4_0)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    matrix("token_embd.weight", VOCAB, HIDDEN)
    matrix("output.weight", VOCAB, HIDDEN)
    norm("output_norm.weight")
    for i in range(LAYERS):
        for part, rows, cols in (("attn_q", HIDDEN, HIDDEN), ("attn_k", kv, HIDDEN),
                                 ("attn_v", kv, HIDDEN), ("attn_output", HIDDEN, HIDDEN),
                                 ("ffn_gate", INTERMEDIATE, HIDDEN),
                                 ("ffn_up", INTERMEDIATE, HIDDEN),
                                 ("ffn_down", HIDDEN, INTERMEDIATE)):  # fmt: skip
            matrix(f"blk.{i}.{part}.weight", rows, cols)
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sum(info.nbytes for info in read_header(path).infos)


# Runs in a fresh process: RSS is read around load_model alone, every import done before.
MEASURE = """
import json, sys
import torch
from models import cpu_kernels
from models.loader import load_model
import models.gguf.stored  # noqa: F401

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

assert cpu_kernels.extension() is not None
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM, the peak resident set, to the current one
before = kib("VmRSS")
model, _ = load_model(sys.argv[1], "bfloat16", use_cache=False)
print(json.dumps({"before": before, "after": kib("VmRSS"), "peak": kib("VmHWM")}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux /proc")
def test_resident_set_grows_by_about_the_files_tensor_bytes(tmp_path):
    path = tmp_path / "random-q4_0.gguf"
    tensor_bytes = random_q4_0_gguf(path)
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rss = json.loads(run.stdout.strip().splitlines()[-1])
    after, peak = rss["after"] - rss["before"], rss["peak"] - rss["before"]
    assert after < 1.3 * tensor_bytes, (after, tensor_bytes)
    assert peak < 1.3 * tensor_bytes, (peak, tensor_bytes)
