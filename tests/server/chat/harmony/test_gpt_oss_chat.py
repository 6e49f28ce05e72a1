"""/v1/chat/completions on a tiny gpt-oss folder (the model of tests/models/gpt_oss, the
harmony-shaped vocabulary of tests/models/tokenizer/harmony_vocab.py), and on the GGUF written
from it as llama.cpp writes one, through the openai client: the prompt is rendered in harmony (its text reaches the model), and the model's output,
scripted token by token by a fake output layer (every other token's logit far below), is read
into reasoning_content, content and tool_calls, streamed and whole alike."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from bench.gpt_oss_gguf import write_gpt_oss_gguf
from engine import Engine, EngineConfig
from models.gpt_oss.model import GptOssForCausalLM
from models.tokenizer import load_tokenizer
from tests.models.gpt_oss.checkpoint import save_gpt_oss
from tests.models.tokenizer.harmony_vocab import (
    BPE_SIZE,
    harmony_special_ids,
    save_harmony_tokenizer,
)
from tests.server.live import LiveServer

THOUGHT = "User asks the weather: call the tool."
CALL = (
    "<|channel|>analysis<|message|>" + THOUGHT + "<|end|><|start|>assistant<|channel|>commentary"
    ' to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>The tool said sunny.<|end|><|start|>assistant<|channel|>final"
    "<|message|>It is sunny in Paris.<|return|>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class Script:
    """The fake output layer: after a prompt (a step from position 0), the k-th generated token
    is the k-th of the script the prompt's text picks (ANSWER once a tool result is in it,
    else CALL); the prompts seen are kept."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.prompts = tokenizer, []
        self.tokens, self.prompt_len, self.last = [], 0, 0

    def forward(self, original, model, input_ids, positions, meta, kv):
        hidden = original(model, input_ids, positions, meta, kv)
        if int(positions[0]) == 0:
            text = self.tokenizer.decode(input_ids.tolist(), skip_special_tokens=False)
            self.prompts.append(text)
            script = ANSWER if "<|start|>functions.get_weather" in text else CALL
            self.tokens, self.prompt_len = self.tokenizer.encode(script), len(input_ids)
        self.last = int(positions[-1])
        return hidden

    def logits(self, model, hidden):
        k = min(self.last + 1 - self.prompt_len, len(self.tokens) - 1)
        logits = torch.full((hidden.shape[0], model.config.vocab_size), -1e4)
        logits[:, self.tokens[k]] = 0.0
        return logits.to(hidden.device)


@pytest.fixture(scope="module", params=["folder", "gguf"])
def live(tmp_path_factory, request):
    """Served from the folder, or from the GGUF llama.cpp's converter would write from it (its
    vocabulary, stop tokens and harmony format from the file's tokenizer.ggml.* metadata)."""
    folder = tmp_path_factory.mktemp("gpt_oss_chat")
    ids = harmony_special_ids()
    eos = [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]]
    save_gpt_oss(folder, vocab_size=BPE_SIZE + len(ids), max_position_embeddings=2048,
                 eos_token_id=eos)  # fmt: skip
    save_harmony_tokenizer(folder)
    patch = pytest.MonkeyPatch()
    model = folder
    if request.param == "gguf":
        model = write_gpt_oss_gguf(folder, folder.parent / f"{folder.name}.gguf")
        patch.setenv("TGSERVE_CACHE_DIR", str(folder.parent / f"{folder.name}-cache"))
    script = Script(load_tokenizer(model))
    original = GptOssForCausalLM.forward
    patch.setattr(GptOssForCausalLM, "forward", lambda m, *a: script.forward(original, m, *a))
    patch.setattr(GptOssForCausalLM, "compute_logits", lambda m, h: script.logits(m, h))
    config = EngineConfig(kv_cache_memory_bytes=8 * 1024**2, enable_prefix_caching=False)
    with LiveServer(
        lambda: Engine.from_model(str(model), config), served_model_name=("m",)
    ) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0), script
    patch.undo()


def chat(client, messages, stream: bool, **extra):
    return client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER], stream=stream, **extra
    )


def streamed_message(client, messages) -> tuple[dict, str]:
    message: dict = {"content": None, "reasoning_content": None, "tool_calls": {}}
    finish = None
    for chunk in chat(client, messages, stream=True):
        delta = chunk.choices[0].delta
        finish = chunk.choices[0].finish_reason or finish
        for key, value in (("content", delta.content),
                           ("reasoning_content", (delta.model_extra or {}).get("reasoning_content"))):  # fmt: skip
            if value:
                message[key] = (message[key] or "") + value
        for call in delta.tool_calls or ():
            whole = message["tool_calls"].setdefault(call.index, {"name": "", "arguments": ""})
            whole["name"] += call.function.name or ""
            whole["arguments"] += call.function.arguments or ""
    return message, finish


def test_a_call_then_the_answer_to_its_result(live) -> None:
    client, script = live
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = chat(client, messages, stream=False, reasoning_effort="high")
    assert "Reasoning: high" in script.prompts[-1]
    assert "type get_weather = (_: {" in script.prompts[-1]  # the functions namespace
    assert script.prompts[-1].endswith("<|start|>user<|message|>Weather in Paris?<|end|>"
                                       "<|start|>assistant")  # fmt: skip
    choice = choice_of(reply)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["reasoning_content"] == THOUGHT and choice["content"] is None
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    streamed, finish = streamed_message(client, messages)
    assert finish == "tool_calls" and streamed["reasoning_content"] == THOUGHT
    assert streamed["tool_calls"] == {0: {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
    ]
    answer = choice_of(chat(client, messages, stream=False))
    assert script.prompts[-1].endswith(
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"sky": '
        '"sunny"}<|end|><|start|>assistant'
    )
    assert (answer["finish_reason"], answer["content"]) == ("stop", "It is sunny in Paris.")
    assert answer["reasoning_content"] == "The tool said sunny."
    streamed, finish = streamed_message(client, messages)
    assert (finish, streamed["content"]) == ("stop", "It is sunny in Paris.")
    assert streamed["reasoning_content"] == "The tool said sunny." and not streamed["tool_calls"]


def choice_of(reply) -> dict:
    message = reply.choices[0].message
    return {
        "finish_reason": reply.choices[0].finish_reason,
        "content": message.content,
        "reasoning_content": (message.model_extra or {}).get("reasoning_content"),
    }


def test_an_enforced_tool_choice_is_refused_by_name(live) -> None:
    client, _ = live
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, [{"role": "user", "content": "x"}], stream=False, tool_choice="required")
    assert err.value.body["param"] == "tool_choice"


def test_the_responses_api_reads_harmony_too(live) -> None:
    """/v1/responses renders and reads through the same chat seam: a reasoning item, then the
    function_call item."""
    client, _ = live
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    response = client.responses.create(model="m", input="Weather in Paris?", tools=[tool])
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"]
    call = response.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
