"""A model with a SentencePiece vocabulary served end to end: a tiny random Llama whose
tokenizer.json has Llama 2's shape (byte fallback, "▁" spaces, a Llama-2-style chat template).

Oracles: transformers' tokenizer on the same tokenizer.json (prompt ids of /tokenize, the chat
prompt's length), the streamed answer against the non-streamed one (the detokenizer joins the
pieces' bytes), and the JSON schema a constrained answer must satisfy.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from transformers import PreTrainedTokenizerFast

from engine import Engine, EngineConfig
from tests.checkpoints import VOCAB, save_checkpoint
from tests.models.tokenizer.spm_files import LLAMA2_TEMPLATE, llama2_json, spm_folder
from tests.server.live import LiveServer

CHAT = [{"role": "user", "content": "Bonjour, ça va ? Привет 😀"}]
SCHEMA = {
    "type": "object",
    "properties": {"word": {"type": "string", "maxLength": 6}},
    "required": ["word"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = spm_folder(tmp_path_factory.mktemp("spm") / "model", llama2_json(VOCAB - 259))
    save_checkpoint("llama", folder, seed=0)
    return folder


@pytest.fixture(scope="module")
def server(folder):
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4)
    with LiveServer(lambda: Engine.from_model(str(folder), config)) as live:
        yield live


@pytest.fixture(scope="module")
def hf(folder):
    return PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=LLAMA2_TEMPLATE,
    )


def _chat(server, **fields) -> dict:
    body = {"messages": CHAT, "max_tokens": 24, "temperature": 0, "ignore_eos": True, **fields}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_prompts_tokenize_as_transformers_does(server, hf):
    text = "Grüße aus München, 你好 👋"
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]
    assert tokens == hf.encode(text)
    usage = _chat(server, max_tokens=1)["usage"]
    assert usage["prompt_tokens"] == len(hf.apply_chat_template(CHAT, return_dict=False))


def test_the_streamed_answer_adds_up_to_the_whole_one(server):
    whole = _chat(server)["choices"][0]["message"]["content"]
    body = {"messages": CHAT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    body["stream"] = True
    pieces = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:])["choices"]
                pieces += [c["delta"].get("content") or "" for c in choices]
    assert "".join(pieces) == whole and whole


def test_a_json_schema_answer_follows_the_schema(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    answer = _chat(server, response_format=fmt, max_tokens=40, ignore_eos=False)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
