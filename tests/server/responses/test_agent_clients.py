"""/v1/responses driven by the agent frameworks that speak it: the OpenAI Agents SDK runs an agent
with one function tool to completion, and LangChain's ChatOpenAI(use_responses_api=True)
invokes and streams (with and without a bound tool).

Oracle: the scripted model (tests.server.scripted_model.py): it calls get_weather for Paris,
then answers with the tool's result in its prompt; the tool records what it was called with.
"""

from __future__ import annotations

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer
from tests.server.scripted_model import HELLO, SUNNY, WEATHER_TOOL, script


@pytest.fixture(scope="module")
def live():
    engine = lambda: FakeEngine(max_model_len=4096, num_blocks=4096, script=script)  # noqa: E731
    with LiveServer(engine) as server:
        yield server


def test_an_agent_with_one_function_tool_runs_to_completion(live):
    set_tracing_disabled(True)  # no trace export to a remote service
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = AsyncOpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="fake-model", openai_client=client),
    )
    result = Runner.run_sync(agent, "Weather in Paris?")
    assert calls == ["Paris"]
    assert result.final_output == SUNNY


@pytest.fixture(scope="module")
def llm(live):
    return ChatOpenAI(
        model="fake-model",
        base_url=live.url + "/v1",
        api_key="x",
        use_responses_api=True,
        max_retries=0,
        timeout=30,
    )


def test_langchain_invoke_and_stream(llm):
    assert llm.invoke("hi").text == HELLO
    assert "".join(chunk.text for chunk in llm.stream("hi")) == HELLO


def test_langchain_reads_tool_calls_invoked_and_streamed(llm):
    bound = llm.bind_tools([WEATHER_TOOL])
    whole = bound.invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    merged = None
    for chunk in bound.stream("Weather in Paris?"):
        merged = chunk if merged is None else merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
