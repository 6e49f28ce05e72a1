"""The server on the real engine: a tiny seeded random Llama with a trained byte-level BPE.

Oracles: transformers' greedy `generate` on the same checkpoint (token ids and logprobs), the
`tokenizers` library on the same tokenizer.json (prompt lengths, decoded text); streamed
output must equal non-streamed output.
"""

from __future__ import annotations

import codecs
import json
import time

import httpx
import huggingface_hub
import openai
import pytest
import torch

from engine import Engine, EngineConfig
from tests.server.live import LiveServer, metric

PROMPT = "Hello world, how are you"


@pytest.fixture(scope="module")
def folder(tiny_model_folder):
    return tiny_model_folder


@pytest.fixture(scope="module")
def server(folder):
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, max_num_seqs=8
    )
    with LiveServer(lambda: Engine.from_model(str(folder), config), admission_limit=16) as live:
        yield live


@pytest.fixture(scope="module")
def hf(folder):
    import transformers
    from tokenizers import Tokenizer

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, Tokenizer.from_file(str(folder / "tokenizer.json"))


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable}
    chars.update({chr(256 + i): b for i, b in enumerate(others)})
    return chars


BYTE_OF = _byte_level_alphabet()


def whole_characters(tok, ids: list[int]) -> str:
    """The oracle's text of `ids`: the tokenizer's bytes (specials skipped), decoded as far as
    whole characters go; a character the output ends inside is dropped, not shown as U+FFFD
    (`tok.decode` would show it)."""
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    pieces = [tok.id_to_token(i) for i in ids]
    data = bytes(BYTE_OF[ch] for piece in pieces if piece not in special for ch in piece)
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def hf_greedy(hf, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    model, _ = hf
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    ids = out.sequences[0, len(prompt_ids) :].tolist()
    logprobs = [
        torch.log_softmax(step[0].float(), -1)[t].item()
        for step, t in zip(out.logits, ids, strict=False)
    ]
    return ids, logprobs


def test_tgi_generate_returns_the_transformers_greedy_tokens_and_text(server, hf):
    _, tok = hf
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True}}
    result = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    expected_ids, expected_lps = hf_greedy(hf, tok.encode(PROMPT).ids, 6)
    assert [t["id"] for t in result["details"]["tokens"]] == expected_ids
    assert [t["logprob"] for t in result["details"]["tokens"]] == pytest.approx(
        expected_lps, abs=1e-4
    )
    assert result["generated_text"] == whole_characters(tok, expected_ids)


def test_openai_completion_streamed_equals_non_streamed_with_one_finish_and_done(server, hf):
    _, tok = hf
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1}
    whole = client.completions.create(**body)
    _, expected_lps = hf_greedy(hf, tok.encode(PROMPT).ids, 6)
    assert whole.choices[0].logprobs.token_logprobs == pytest.approx(expected_lps, abs=1e-4)
    assert whole.usage.prompt_tokens == len(tok.encode(PROMPT).ids)
    request = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=request, timeout=60) as response:
        events = [e[len("data: ") :] for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole.choices[0].text
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole.usage.model_dump(
        exclude_none=True
    )


def test_chat_through_the_template_streams_the_same_text(server, hf):
    _, tok = hf
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Say hi"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0
    )
    rendered = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    assert whole.usage.prompt_tokens == len(tok.encode(rendered).ids)
    expected_ids, _ = hf_greedy(hf, tok.encode(rendered).ids, 5)
    assert whole.choices[0].message.content == whole_characters(tok, expected_ids)
    chunks = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks)
        == whole.choices[0].message.content
    )


def test_inference_client_stream_matches_non_stream(server, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = huggingface_hub.InferenceClient(model=server.url, timeout=60)
    whole = client.text_generation(PROMPT, max_new_tokens=5, details=True)
    streamed = list(client.text_generation(PROMPT, max_new_tokens=5, stream=True, details=True))
    assert (
        "".join(e.token.text for e in streamed)
        == whole.generated_text
        == streamed[-1].generated_text
    )
    assert [e.token.id for e in streamed] == [t.id for t in whole.details.tokens]


def test_a_disconnected_stream_frees_its_blocks_on_the_real_engine(server):
    body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert metric(httpx.get(server.url + "/metrics").text, "tgserve_kv_cache_blocks_used") > 0
    t0 = time.monotonic()
    while True:
        text = httpx.get(server.url + "/metrics").text
        if (
            metric(text, "tgserve_num_requests_running") == 0
            and metric(text, "tgserve_kv_cache_blocks_used") == 0
        ):
            break
        assert time.monotonic() - t0 < 10, "blocks still held after the client left"
        time.sleep(0.05)
    assert metric(text, "tgserve_generation_tokens_total") < 200


def test_a_prompt_beyond_the_context_is_400_before_any_stream_byte(server):
    body = {"prompt": "word " * 400, "max_tokens": 4, "stream": True}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert "context length" in response.json()["error"]["message"]
