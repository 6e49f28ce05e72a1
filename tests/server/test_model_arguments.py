"""What `--model` users meet before and right after start-up.

- A Hugging Face hub id (owner/name) that is not a local path is refused with the command that
  fetches the folder (tgserve downloads nothing), and serving the folder it names is said.
- A model folder without a usable tokenizer (a tiny seeded Llama with no tokenizer files) serves
  token-id prompts only: said at start (a warning) and in /v1/models (`token_ids_only`); text is
  a 400 naming the prompt, token ids are answered. The fake engine (it has a tokenizer) is the
  contrast: `token_ids_only` false.
"""

from __future__ import annotations

import logging

import httpx

from server.cli import main
from tests.checkpoints import save_checkpoint
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer


def test_a_hub_id_is_refused_with_the_command_that_fetches_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    assert main(["serve", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"]) == 2
    message = capsys.readouterr().err
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir" in message
    assert "--model models/SmolLM2-135M-Instruct" in message


def test_a_missing_path_that_is_no_hub_id_is_refused_plainly(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path / "nowhere.gguf")]) == 2
    message = capsys.readouterr().err
    assert "does not exist" in message and "hf download" not in message


def _tiny_engine_without_tokenizer(folder):
    from engine import Engine, EngineConfig

    save_checkpoint("llama", folder)  # config.json + weights, no tokenizer files
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, max_num_seqs=4
    )
    return lambda: Engine.from_model(str(folder), config)


def test_a_model_without_tokenizer_serves_token_ids_only_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tgserve.server")
    with LiveServer(_tiny_engine_without_tokenizer(tmp_path)) as live:
        (model,) = httpx.get(live.url + "/v1/models").json()["data"]
        assert model["token_ids_only"] is True
        text = httpx.post(live.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert text.status_code == 400 and text.json()["error"]["param"] == "prompt"
        ids = httpx.post(live.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2})
        assert ids.status_code == 200 and ids.json()["usage"]["completion_tokens"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("token-id prompts only" in w for w in warnings), warnings


def test_a_model_with_a_tokenizer_is_not_token_ids_only():
    with LiveServer(FakeEngine) as live:
        (model,) = httpx.get(live.url + "/v1/models").json()["data"]
        assert model["token_ids_only"] is False
