"""The default model end to end: `tgserve generate --chat` answers the capital question, and
the engine's greedy tokens equal a greedy loop over transformers' own load of the same GGUF."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from server.cli import main

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_model(None, EngineConfig(dtype="float32", kv_cache_memory_bytes=64 * 2**20))


def test_cli_generate_chat_answers_paris(capsys) -> None:
    assert main(["generate", "--chat", QUESTION, "--max-tokens", "32"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_greedy_tokens_equal_transformers_for_32_steps(
    engine: Engine, smollm2_transformers
) -> None:
    prompt = engine.tokenizer.encode(
        engine.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}])
    )
    ours = engine.generate(
        [prompt], SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    )[0]
    hf = smollm2_transformers  # tests/conftest.py: transformers' load of the same GGUF
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(32):  # plain greedy over the full sequence: no cache, no stopping rules
            tokens.append(int(hf(torch.tensor([tokens])).logits[0, -1].argmax()))
    assert list(ours.outputs[0].token_ids) == tokens[len(prompt) :]
    assert "Paris" in engine.tokenizer.decode(tokens[len(prompt) :])
