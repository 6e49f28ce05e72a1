"""A prompt at the context limit completes, on the C++ path the CPU serves with (issue 46: on
a 2-core AVX2 host a prompt at the default model's 8,192-token limit did not answer within
120 s): a 1,020-token prompt on a tiny Llama whose limit is 1,024 tokens, prefilled in chunks
against its growing cached context (the attention's long-context path, every chunk's rows
grouped over the same keys), then decoded to the limit. Oracle: transformers' greedy tokens
in float64 on the same folder; and nothing leaks.
"""

from __future__ import annotations

import pytest
import torch

from engine.requests.sampling_params import SamplingParams
from models.forward_path import CppStepPath
from tests.checkpoints import make_hf_model, save_checkpoint
from tests.devices import selected_device
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, tiny_engine

LIMIT = 1024  # the checkpoint's max_position_embeddings and the engine's max_model_len
NEW = 4


@pytest.mark.skipif(selected_device().type != "cpu", reason="the CPU kernels' long context")
def test_a_prompt_at_the_context_limit_completes_with_transformers_tokens(tmp_path) -> None:
    folder = save_checkpoint("llama", tmp_path / "llama", max_position_embeddings=LIMIT)
    engine = tiny_engine(
        folder,
        max_model_len=LIMIT,
        kv_cache_memory_bytes=32_000_000,
        max_num_batched_tokens=256,  # 4 chunks, the later ones over up to 768 cached keys
        block_size=16,
    )
    assert CppStepPath.description in engine.runner.description, engine.runner.description
    (prompt,) = random_prompts(1, (LIMIT - NEW, LIMIT - NEW), seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    (result,) = engine.generate([prompt], params)
    got = list(result.outputs[0].token_ids)
    assert len(prompt) + len(got) == LIMIT
    with torch.no_grad():
        hf = make_hf_model("llama", max_position_embeddings=LIMIT).double().eval()
        want = hf.generate(
            torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW
        )[0, len(prompt) :].tolist()
    assert got == want
    assert_no_leaks(engine)
