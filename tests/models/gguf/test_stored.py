"""GGUF files served as stored (models/gguf/stored.py): tiny seeded Llama checkpoints quantised to
each kept type load as BlockLinear / BlockEmbedding layers and agree with our own dequantising
path (`dequantize=True`, the path tgserve took before: gguf's dequantisation, then the dtype).

"Agree" for Q4_0, Q4_1 and Q8_0 (block_linear.cpp) means bit for bit: the kernel dequantises each
weight as gguf does (then rounds it to the dtype, as the dequantising loader does) and runs the
dense kernel's per-lane order over it, so logits and greedy tokens are identical in float32 and
bfloat16. The Q5 and K-quant types (kquant_linear.cpp) keep a per-sub-block order (float32 sums
scaled by the sub-block's scale): the same weights summed in another order, so their logits agree
to a tolerance and greedy tokens of the tiny models are identical in float32 (checked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QT

from engine import Engine, EngineConfig, SamplingParams
from models.attention import AttentionMetadata
from models.block_linear import STORED_TYPES, BlockEmbedding, BlockLinear
from models.loader import load_model
from tests.models.gguf.tiny_gguf import to_gguf

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

VOCAB = 96
DENSE_ORDER = {QT.Q4_0, QT.Q4_1, QT.Q8_0}  # the kernels whose lanes run the dense order


def dims(qtype: QT) -> tuple[int, int]:
    """(hidden, intermediate): every K a multiple of the type's blocks (K-quants: 256 wide)."""
    return (256, 512) if qtype.name.endswith("_K") else (64, 96)


def q4_k_m(gguf_name: str) -> QT:
    """A Q4_K_M-like mix with every fused layer mixed: q/k Q4_K + v Q6_K, gate Q4_K + up Q5_K."""
    part = gguf_name.split(".")[-2]
    return {"attn_v": QT.Q6_K, "ffn_up": QT.Q5_K, "ffn_down": QT.Q6_K, "token_embd": QT.Q6_K}.get(
        part, QT.Q4_K
    )


def tiny_quantised_gguf(folder: Path, qtype: QT, tied: bool, mix=None) -> Path:
    torch.manual_seed(int(qtype))
    hidden, intermediate = dims(qtype)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-6,
        max_position_embeddings=128, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger than init's 0.02 so the logits spread and matter
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    meta = {
        "llama.block_count": 2,
        "llama.context_length": 128,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": intermediate,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.freq_base": 5000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-6,
        "llama.vocab_size": VOCAB,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    path = folder / f"tiny-{qtype.name}-{'tied' if tied else 'untied'}.gguf"
    return to_gguf(model, path, "llama", tied, meta, qtype=mix or qtype)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    c = model.config
    meta = AttentionMetadata.build(
        block_tables=[[0, 1]], seq_lens=[len(ids)], query_lens=[len(ids)], block_size=16
    )
    dtype = model.model.norm.weight.dtype
    shape = (2, 16, c.num_kv_heads, c.head_dim)
    caches = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))] * c.num_layers
    caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids)), meta, caches)).double()


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("qtype", sorted(STORED_TYPES, key=int))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_gguf_as_stored_gives_the_dequantised_paths_logits(tmp_path, qtype, tied, dtype):
    path = tiny_quantised_gguf(tmp_path, qtype, tied)
    stored, _ = load_model(path, dtype, use_cache=False)
    plain, _ = load_model(path, dtype, use_cache=False, dequantize=True)
    layer = stored.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                   layer.mlp.down_proj, stored.lm_head):  # fmt: skip
        assert isinstance(linear, BlockLinear) and linear.block_weight.qtype == qtype
    assert isinstance(stored.model.embed_tokens, BlockEmbedding)
    if tied:  # one copy of the blocks serves both
        assert stored.lm_head.block_weight is stored.model.embed_tokens.block_weight
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(1))
    ours, want = logits(stored, ids), logits(plain, ids)
    if qtype in DENSE_ORDER:
        assert torch.equal(ours, want), float((ours - want).abs().max())
    else:  # float32: only the order differs; bf16: the dequantised path rounds W to bf16 too
        tol = 2e-4 if dtype == "float32" else 0.15
        assert (ours - want).abs().max() <= tol * want.abs().max(), float((ours - want).abs().max())


# Equal greedy tokens: every type in float32; in bfloat16 the dense-order types only (the others
# scale exact integers per sub-block, where the dequantised path rounds each weight to bf16).
GREEDY_CASES = [(q, "float32") for q in sorted(STORED_TYPES, key=int)] + [
    (q, "bfloat16") for q in sorted(DENSE_ORDER, key=int)
]


@pytest.mark.parametrize(("qtype", "dtype"), GREEDY_CASES)
def test_tiny_gguf_as_stored_greedy_tokens_equal_the_dequantised_path(tmp_path, qtype, dtype):
    path = tiny_quantised_gguf(tmp_path, qtype, tied=True)
    assert_greedy_as_stored_equals_dequantised(path, dtype)


def test_tiny_q4_k_m_gguf_mixes_types_in_fused_layers_and_greedy_equals_the_dequantised_path(
    tmp_path,
):
    path = tiny_quantised_gguf(tmp_path, QT.Q4_K, tied=True, mix=q4_k_m)
    stored, _ = load_model(path, "float32", use_cache=False)
    layer = stored.model.layers[1]
    qkv, gate_up = layer.self_attn.qkv_proj.block_weight, layer.mlp.gate_up_proj.block_weight
    assert qkv.parts == ((QT.Q4_K, 256), (QT.Q4_K, 128), (QT.Q6_K, 128))
    assert gate_up.parts == ((QT.Q4_K, 512), (QT.Q5_K, 512))
    assert layer.mlp.down_proj.block_weight.qtype == QT.Q6_K
    assert stored.lm_head.block_weight.qtype == QT.Q6_K
    plain, _ = load_model(path, "float32", use_cache=False, dequantize=True)
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(1))
    ours, want = logits(stored, ids), logits(plain, ids)
    assert (ours - want).abs().max() <= 2e-4 * want.abs().max(), float((ours - want).abs().max())
    assert_greedy_as_stored_equals_dequantised(path)


def assert_greedy_as_stored_equals_dequantised(path: Path, dtype: str = "float32") -> None:
    """3 prompts x 24 greedy tokens through the engine (float32, C++ step), both paths."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [[5, 17, 33, 9], [60, 2, 71], list(range(10, 40))]
    runs = []
    for dequantize in (False, True):
        engine = Engine.from_model(str(path), EngineConfig(dtype=dtype, dequantize=dequantize))
        assert engine.runner.forward_path.description  # the C++ step serves both
        runs.append([out.outputs[0].token_ids for out in engine.generate(prompts, params)])
    assert runs[0] == runs[1]
