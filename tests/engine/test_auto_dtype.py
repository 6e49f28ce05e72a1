"""`--dtype auto` (engine/config.py `resolve_dtype_name`, engine/runner_factory.py): on a CPU,
float32 when the engine runs GGUF blocks as stored (the weight bytes are the file's either way
and the block kernels sum in float32; also under "auto" activations, which read those blocks
with int16 activations on an AVX2 build, but not with an explicit `activation_quantization`),
else bfloat16 where the CPU computes it natively, else float32; CUDA keeps bfloat16 / float16.
The predicate `stores_blocks` must say exactly what the loader then keeps (checked against
`load_model`'s layers), and the engine must load in the dtype the rule names (checked on its KV
cache, which is allocated in the model dtype)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine import Engine, EngineConfig, SamplingParams, resolve_dtype_name
from engine.activation_choice import auto_mode
from models.activation_quant import Q8Linear
from models.block_linear import BlockLinear
from models.cpu_features import native_bf16
from models.gguf.stored import stores_blocks
from models.loader import load_model
from tests.models.gguf.test_stored import tiny_quantised_gguf
from tests.models.gguf.tiny_gguf import tiny_model, to_gguf


def test_auto_is_float32_for_blocks_as_stored_on_a_cpu_only():
    for native in (True, False):
        assert resolve_dtype_name("auto", "cpu", native, blocks_as_stored=True) == "float32"
    assert resolve_dtype_name("auto", "cpu", True, blocks_as_stored=False) == "bfloat16"
    assert resolve_dtype_name("auto", "cpu", False, blocks_as_stored=False) == "float32"
    # CUDA never serves blocks as stored (the loader dequantises there): the flag changes nothing
    assert resolve_dtype_name("auto", "cuda", True, blocks_as_stored=True) == "bfloat16"
    assert resolve_dtype_name("auto", "cuda:0", False, blocks_as_stored=True) == "float16"
    # a concrete dtype is the user's choice
    assert resolve_dtype_name("bfloat16", "cpu", True, blocks_as_stored=True) == "bfloat16"


def _keeps_blocks(path) -> bool:
    model, _ = load_model(path, "float32", "cpu", use_cache=False)
    return any(isinstance(m, BlockLinear) for m in model.modules())


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q8_0, QT.Q4_K])
def test_stores_blocks_is_true_for_a_llama_gguf_the_loader_keeps_as_stored(tmp_path, qtype):
    path = tiny_quantised_gguf(tmp_path, qtype, tied=True)
    assert stores_blocks(path)
    assert _keeps_blocks(path)


def test_stores_blocks_is_false_where_the_loader_dequantises(tmp_path):
    # a float GGUF (no block matrix), a GPT-2 GGUF in Q8_0 (not the Llama family), an HF folder
    llama, meta = tiny_model("llama", tied=True)
    float_file = to_gguf(llama, tmp_path / "f32.gguf", "llama", True, meta)
    gpt2, gmeta = tiny_model("gpt2", tied=True)
    gpt2_file = to_gguf(gpt2, tmp_path / "gpt2.gguf", "gpt2", True, gmeta, qtype=QT.Q8_0)
    folder = tmp_path / "hf"
    llama.save_pretrained(folder)
    for path in (float_file, gpt2_file):
        assert not stores_blocks(path)
        assert not _keeps_blocks(path)
    assert not stores_blocks(folder)


def _kv_dtype(engine: Engine) -> torch.dtype:
    return engine.runner.kv_caches[0][0].dtype


def test_engine_loads_a_gguf_as_stored_in_float32_and_its_dequantised_copy_as_before(tmp_path):
    """The CPU's rule: pinned to the CPU, so a GPU machine's default device does not change it."""
    path = tiny_quantised_gguf(tmp_path, QT.Q4_1, tied=True)
    as_stored = Engine.from_model(str(path), EngineConfig(device="cpu"))
    assert _kv_dtype(as_stored) == torch.float32
    # activation_quantization "auto" reads the Q4_1 blocks with int16 activations on an AVX2
    # build (engine/activation_choice.py), "none" through the float block kernels: float32
    # either way
    assert isinstance(as_stored.runner.model.lm_head, Q8Linear if auto_mode() else BlockLinear)
    float_blocks = Engine.from_model(
        str(path), EngineConfig(activation_quantization=None, device="cpu")
    )
    assert _kv_dtype(float_blocks) == torch.float32
    assert isinstance(float_blocks.runner.model.lm_head, BlockLinear)
    dequantised = Engine.from_model(str(path), EngineConfig(dequantize=True, device="cpu"))
    want = torch.bfloat16 if native_bf16(torch.device("cpu")) else torch.float32
    assert _kv_dtype(dequantised) == want
    # int8 activations quantise the activations whatever the dtype: auto keeps the dense rule
    int8 = Engine.from_model(str(path), EngineConfig(activation_quantization="int8", device="cpu"))
    assert _kv_dtype(int8) == want
    # auto as stored is float32 as stored: the same greedy tokens as asking for float32
    explicit = Engine.from_model(str(path), EngineConfig(dtype="float32", device="cpu"))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 17, 33, 9], [60, 2, 71]]
    runs = [
        [o.outputs[0].token_ids for o in e.generate(prompts, params)] for e in (as_stored, explicit)
    ]
    assert runs[0] == runs[1]
