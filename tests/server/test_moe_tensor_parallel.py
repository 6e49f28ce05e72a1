"""A mixture-of-experts model (Qwen2-MoE: routed experts, a shared expert, qkv bias) served
with `--tensor-parallel-size 2` on gloo (each expert sharded like a dense MLP,
models/moe/parallel.py) answers /v1/completions with one process's greedy text."""

from __future__ import annotations

import shutil
import signal

import httpx

from engine import Engine, SamplingParams
from tests.checkpoints import save_checkpoint
from tests.server.live import free_port
from tests.server.test_tensor_parallel import PROMPTS, _config, _serve


def test_http_tp2_moe_text_equals_one_process(tiny_model_folder, tmp_path) -> None:
    folder = save_checkpoint("qwen2_moe", tmp_path / "moe")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the tiny model's (vocab 320)
        shutil.copy(tiny_model_folder / name, folder / name)
    engine = Engine.from_model(str(folder), _config(1))
    solo = [o.outputs[0].text for o in engine.generate(
        PROMPTS, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))]  # fmt: skip
    engine.close()
    port = free_port()
    process, _ = _serve(folder, port)
    try:
        for prompt, want in zip(PROMPTS, solo, strict=True):
            body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
            got = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
            assert got.json()["choices"][0]["text"] == want
    finally:
        process.send_signal(signal.SIGTERM)  # drains, then every rank exits
        process.communicate(timeout=30)
