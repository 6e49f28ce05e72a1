"""Decode steps whose rows use LoRA adapters replay from the graphs (engine/cuda_graphs/
decode_graphs.py: each row's slot in a persistent buffer) and give exactly the eager step's
logits; the graphs are captured with every slot at -1 (the base model), so a replay that kept
the capture-time slots would give the adapter rows the base model's logits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.cuda_graphs.decode_graphs import GraphSettings
from engine.model_runner import ModelRunner
from engine.scheduling.step_plan import ScheduledChunk
from models import build_model
from models.config import ModelConfig
from models.lora import LoraAdapter, LoraBank, ModuleLora
from models.lora.adapter import TARGET_MODULES, module_shape
from tests.checkpoints import make_hf_model
from tests.engine.cuda_graphs.test_decode_graphs import (  # noqa: F401 (the fixture)
    BLOCK_SIZE,
    NUM_BLOCKS,
    _record_replays,
    _same,
    capturable,
)
from tests.engine.test_model_runner import _Seq

SLOTS = (0, -1, 1)  # three sequences: adapter 0, the base model, adapter 1


def _adapter(config: ModelConfig, seed: int) -> LoraAdapter:
    gen = torch.Generator().manual_seed(seed)
    modules = {}
    for layer in range(config.num_layers):
        for module in TARGET_MODULES:
            k, n = module_shape(config, module)
            a = torch.randn(4, k, generator=gen) * 0.3
            b = torch.randn(n, 4, generator=gen) * 0.3
            modules[(layer, module)] = ModuleLora(a, b, scale=2.0)
    return LoraAdapter(f"a{seed}", modules)


def _runner(graphs: GraphSettings | None, device: torch.device) -> ModelRunner:
    hf = make_hf_model("llama")
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    model = build_model(config, torch.float32, device)
    model.load_weights(hf.state_dict().items())
    bank = LoraBank(config, 2, 8, torch.float32, device)
    bank.attach(model)
    for slot in (0, 1):
        bank.write(slot, _adapter(config, seed=slot + 1))
    return ModelRunner(model, config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, device, graphs=graphs)


def _chunk(seq: _Seq, slot: int, start: int, n: int) -> ScheduledChunk:
    return ScheduledChunk(SimpleNamespace(lora_slot=slot), seq, start, n, True)


def _decode_steps(runner: ModelRunner, steps: int) -> list[torch.Tensor]:
    seqs = [_Seq(list(range(5 + i, 9 + 2 * i)), [4 * i + j for j in range(4)]) for i in range(3)]
    chunks = [_chunk(s, slot, 0, len(s.token_ids)) for s, slot in zip(seqs, SLOTS, strict=True)]
    out = runner.forward(chunks).sampling
    logits = [out.clone()]
    for _ in range(steps):
        for seq, token in zip(seqs, out.argmax(dim=-1).tolist(), strict=True):
            seq.token_ids.append(token)
        chunks = [
            _chunk(s, slot, len(s.token_ids) - 1, 1) for s, slot in zip(seqs, SLOTS, strict=True)
        ]
        out = runner.forward(chunks).sampling
        logits.append(out.clone())
    return logits


@pytest.mark.usefixtures("capturable")
def test_adapter_rows_replay_from_the_graphs_with_the_eager_logits(device) -> None:
    eager = _runner(None, device)
    graphed = _runner(GraphSettings(max_num_seqs=4, max_model_len=48), device)
    assert graphed.decode_graphs is not None
    replays = _record_replays(graphed)
    want = _decode_steps(eager, steps=2)  # the second replays over the first's K/V
    got = _decode_steps(graphed, steps=2)
    assert replays == [4] * 2  # every decode step replayed (3 rows padded to the bucket of 4)
    for w, g in zip(want, got, strict=True):
        _same(w, g)
    # the adapters move their rows' logits (else the equality above proves nothing of slots):
    # the base row and an adapter row were fed the same way, yet their first-step logits differ
    # from what the base model gives for that adapter row's tokens
    base = _runner(None, device)
    base.model.lora_bank.clear(0)
    base.model.lora_bank.clear(1)
    plain = _decode_steps(base, steps=0)[0]
    assert not torch.equal(plain[0], want[0][0]) and not torch.equal(plain[2], want[0][2])
    assert torch.equal(plain[1], want[0][1])  # the base row is the base model's
