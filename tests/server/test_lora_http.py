"""LoRA adapters over HTTP on the real engine (the tiny random Llama with its BPE tokenizer;
adapters made with peft on its weights): /v1/models lists each adapter with its `parent`, the
openai client's `model` and TGI's `adapter_id` pick it (greedy logprobs equal transformers +
peft), vLLM's load / unload routes change the set at run time and refuse with the reason (a
DoRA folder, an adapter a request is using, an unknown name)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
import torch

from engine import Engine, EngineConfig, LoraConfig
from tests.models.lora.peft_adapters import make_peft_adapter
from tests.server.live import LiveServer, metric
from tests.server.test_live_engine import hf_greedy

PROMPT = "Hello world, how are you"


@pytest.fixture(scope="module")
def adapters(tiny_model_folder, tmp_path_factory):
    import transformers
    from tokenizers import Tokenizer

    base = transformers.LlamaForCausalLM.from_pretrained(tiny_model_folder, dtype=torch.float32)
    folder = tmp_path_factory.mktemp("lora_http")
    peft = {
        name: make_peft_adapter(base.eval(), folder / name, seed=s)
        for name, s in (("sql", 40), ("chat", 41))
    }
    make_peft_adapter(base, folder / "dora", seed=42, use_dora=True)
    tok = Tokenizer.from_file(str(tiny_model_folder / "tokenizer.json"))
    return folder, peft, tok


@pytest.fixture(scope="module")
def server(tiny_model_folder, adapters):
    folder, _, _ = adapters
    lora = LoraConfig(adapters=(("sql", str(folder / "sql")),), max_loras=2)
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, max_num_seqs=8, lora=lora
    )
    factory = lambda: Engine.from_model(str(tiny_model_folder), config)  # noqa: E731
    with LiveServer(factory, admission_limit=16, enable_lora_runtime_updates=True) as live:
        yield live


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def greedy_logprobs(server, model: str) -> list[float]:
    out = client(server).completions.create(
        model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1
    )
    return out.choices[0].logprobs.token_logprobs


def test_models_lists_adapters_with_their_parent(server) -> None:
    cards = {m.id: m for m in client(server).models.list().data}
    assert cards["sql"].parent == "tiny" and cards["tiny"].parent is None
    assert httpx.get(server.url + "/v1/models/sql").json()["parent"] == "tiny"


def test_model_and_adapter_id_pick_the_adapter(server, adapters) -> None:
    _, peft, tok = adapters
    ids = tok.encode(PROMPT).ids
    want_ids, want_lps = hf_greedy((peft["sql"], tok), ids, 5)
    assert greedy_logprobs(server, "sql") == pytest.approx(want_lps, abs=1e-4)
    assert greedy_logprobs(server, "tiny") != pytest.approx(want_lps, abs=1e-4)
    body = {
        "inputs": PROMPT,
        "parameters": {"max_new_tokens": 5, "details": True, "adapter_id": "sql"},
    }
    tgi = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    assert [t["id"] for t in tgi["details"]["tokens"]] == want_ids
    body["parameters"]["adapter_id"] = "nope"
    refused = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert refused.status_code == 422 and "adapter_id" in refused.json()["error"]
    with pytest.raises(openai.NotFoundError):
        greedy_logprobs(server, "nope")


def test_load_and_unload_at_run_time(server, adapters) -> None:
    folder, peft, tok = adapters
    load = server.url + "/v1/load_lora_adapter"
    unload = server.url + "/v1/unload_lora_adapter"
    ok = httpx.post(load, json={"lora_name": "chat", "lora_path": str(folder / "chat")})
    assert ok.status_code == 200 and ok.text.startswith("Success")
    _, want = hf_greedy((peft["chat"], tok), tok.encode(PROMPT).ids, 5)
    assert greedy_logprobs(server, "chat") == pytest.approx(want, abs=1e-4)
    dora = httpx.post(load, json={"lora_name": "d", "lora_path": str(folder / "dora")})
    assert dora.status_code == 400 and "DoRA" in dora.json()["error"]["message"]
    again = httpx.post(load, json={"lora_name": "chat", "lora_path": str(folder / "chat")})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]

    started = threading.Event()

    def long_stream() -> None:  # holds the adapter while the unload is tried
        body = {
            "model": "chat",
            "prompt": PROMPT,
            "max_tokens": 200,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert started.wait(30)
    busy = httpx.post(unload, json={"lora_name": "chat"})
    reader.join(60)
    assert busy.status_code == 400 and "in use" in busy.json()["error"]["message"]
    assert httpx.post(unload, json={"lora_name": "chat"}).status_code == 200
    assert "chat" not in {m.id for m in client(server).models.list().data}
    assert httpx.post(unload, json={"lora_name": "chat"}).status_code == 404
    with pytest.raises(openai.NotFoundError):
        greedy_logprobs(server, "chat")


def test_request_metrics_are_labelled_by_model(server) -> None:
    greedy_logprobs(server, "sql")
    greedy_logprobs(server, "tiny")
    text = httpx.get(server.url + "/metrics").text
    for model in ("sql", "tiny"):
        labels = {"model_name": model, "finish_reason": "length"}
        assert metric(text, "tgserve_request_success_total", labels) >= 1, model
