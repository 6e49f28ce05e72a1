"""T5 and BART served over HTTP: /v1/completions and TGI /generate and /generate_stream answer
with the text of transformers' greedy `generate` on the same folder (tiny random model, its
tokenizer trained here), decoded by transformers' tokenizer; `echo` and TGI's
`decoder_input_details` (prompt logprobs) are a 400 naming the field, and /v1/chat/completions a 400 naming `messages` (these folders have no chat template)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from tests.encdec_checkpoints import load_hf, save_encdec_checkpoint, save_encdec_tokenizer
from tests.server.live import LiveServer

PROMPTS = ["translate English to German: The house is wonderful.", "Bonjour le monde"]
MAX_TOKENS = 8


@pytest.fixture(scope="module", params=["t5v11", "bart"])
def folder(request, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(request.param)
    save_encdec_tokenizer("t5" if request.param.startswith("t5") else "bart", folder)
    vocab = len(AutoTokenizer.from_pretrained(folder))
    # A few embedding rows past the tokenizer, as t5's 32128 rows over 32100 tokens.
    save_encdec_checkpoint(request.param, folder, vocab=vocab + 4)
    return folder


@pytest.fixture(scope="module")
def server(folder):
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=2_000_000, block_size=4)
    with LiveServer(lambda: Engine.from_model(str(folder), config)) as live:
        yield live


def _hf_generate(folder, prompt: str) -> tuple[list[int], str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = load_hf(folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    vocab = len(tokenizer)
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            use_cache=False,
            # the engine never samples the rows past the tokenizer
            bad_words_ids=[[t] for t in range(vocab, model.config.vocab_size)],
        )
    ids = out[0, 1:].tolist()
    return ids, tokenizer.decode(ids, skip_special_tokens=True)


def test_completions_and_tgi_answer_what_transformers_generates(server, folder):
    """Token ids against transformers'; the text too, unless a random model's bytes end in half
    a character (the server holds it back where transformers writes U+FFFD)."""
    for prompt in PROMPTS:
        want_ids, want = _hf_generate(folder, prompt)
        params = {"max_new_tokens": MAX_TOKENS, "do_sample": False, "details": True}
        r = httpx.post(
            server.url + "/generate", json={"inputs": prompt, "parameters": params}, timeout=120
        )
        assert r.status_code == 200, r.text
        tgi = r.json()
        assert [t["id"] for t in tgi["details"]["tokens"]] == want_ids
        if "\ufffd" not in want:
            assert tgi["generated_text"] == want
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == tgi["generated_text"]
        streamed = ""
        with httpx.stream(
            "POST",
            server.url + "/generate_stream",
            json={"inputs": prompt, "parameters": params},
            timeout=120,
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    if not event["token"]["special"]:
                        streamed += event["token"]["text"]
        assert streamed == tgi["generated_text"]


def test_usage_counts_the_encoder_input(server, folder):
    from transformers import AutoTokenizer

    prompt = PROMPTS[0]
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    usage = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()["usage"]
    assert usage["prompt_tokens"] == len(AutoTokenizer.from_pretrained(folder)(prompt).input_ids)


def test_echo_is_refused_naming_the_field(server):
    body = {"prompt": PROMPTS[0], "max_tokens": 2, "echo": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "echo"
    assert "encoder-decoder" in r.json()["error"]["message"]


def test_tgi_decoder_input_details_are_refused_naming_the_field(server):
    params = {"max_new_tokens": 2, "details": True, "decoder_input_details": True}
    r = httpx.post(
        server.url + "/generate", json={"inputs": PROMPTS[0], "parameters": params}, timeout=60
    )
    assert r.status_code in (400, 422), r.text  # TGI answers its validation errors with 422
    assert "decoder_input_details" in r.json()["error"]
    assert "encoder input" in r.json()["error"]


def test_chat_without_a_template_is_a_clear_400(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages" and "chat template" in error["message"]


def test_stop_strings_cut_the_answer(server):
    body = {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}
    whole = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    text = whole["choices"][0]["text"]
    assert len(text.strip()) >= 3, "the tiny model said too little to cut"
    stop = text.strip()[1:3]
    cut = httpx.post(server.url + "/v1/completions", json=body | {"stop": [stop]}, timeout=120)
    choice = cut.json()["choices"][0]
    assert choice["text"] == text[: text.index(stop)]
    assert choice["finish_reason"] == "stop"
