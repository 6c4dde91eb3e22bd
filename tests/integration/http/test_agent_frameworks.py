"""The frameworks agents are built with, each through its own client library, against the real
server and model (issue 42 §4): the OpenAI Agents SDK on its Chat Completions and its Responses
model, LangChain's `ChatOpenAI` (invoke, stream, `bind_tools` and a ToolMessage turn,
`with_structured_output`), and pydantic-ai (text and a typed output). Small calls; each case
fails when the server answers wrongly (a field refused, a reply the library cannot read, a tool
call that does not parse to the tool's arguments)."""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.integration.http.conftest import API_KEY

set_tracing_disabled(True)  # the Agents SDK would export traces to OpenAI


class Colour(BaseModel):
    name: str


class Weather(BaseModel):
    """The weather in a city."""

    city: str


@pytest.fixture
def async_client(base_url: str) -> AsyncOpenAI:
    """One per test: each runs its own event loop (asyncio.run), and a client's connections
    belong to the loop that opened them."""
    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_openai_agents_calls_a_function_tool(async_client: AsyncOpenAI, model: str, api: str) -> None:
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"Sunny in {city}"

    kind = OpenAIChatCompletionsModel if api == "chat_completions" else OpenAIResponsesModel
    agent = Agent(name="weather", instructions="Answer with the get_weather tool.", tools=[get_weather],
                  model=kind(model=model, openai_client=async_client), tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=64, temperature=0))
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=2))
    assert len(cities) == 1 and isinstance(cities[0], str) and result.final_output == f"Sunny in {cities[0]}"


def test_openai_agents_answers_in_text(async_client: AsyncOpenAI, model: str) -> None:
    """On the Chat Completions model (a reply cut by max_tokens is an answer there). On the
    Responses model the SDK fails a run whose response is `incomplete`, as against OpenAI,
    and this model at temperature 0 runs every short prompt tried to the limit."""
    agent = Agent(name="terse", instructions="You are terse.",
                  model=OpenAIChatCompletionsModel(model=model, openai_client=async_client),
                  model_settings=ModelSettings(max_tokens=16, temperature=0))
    result = asyncio.run(Runner.run(agent, "Name a colour.", max_turns=1))
    assert isinstance(result.final_output, str) and result.final_output.strip()


@pytest.fixture(scope="module")
def chat_model(base_url: str, model: str) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=f"{base_url}/v1", api_key=API_KEY, max_tokens=48, temperature=0,
                      max_retries=0, timeout=120)


def test_langchain_invoke_and_stream(chat_model: ChatOpenAI) -> None:
    whole = chat_model.invoke("Name a colour.")
    assert isinstance(whole.content, str) and whole.content and whole.usage_metadata["output_tokens"] > 0
    pieces = [chunk.content for chunk in chat_model.stream("Name a colour.")]
    assert len(pieces) > 1 and "".join(pieces)  # not one chunk: streamed (the text may round differently when cached)


def test_langchain_bind_tools_and_a_tool_message_turn(chat_model: ChatOpenAI) -> None:
    with_tools = chat_model.bind_tools([Weather], tool_choice="Weather")
    ask = HumanMessage("What is the weather in Rome?")
    reply = with_tools.invoke([ask])
    (call,) = reply.tool_calls
    assert call["name"] == "Weather" and isinstance(call["args"]["city"], str)
    answer = chat_model.bind_tools([Weather]).invoke(
        [ask, reply, ToolMessage("Sunny, 21 C", tool_call_id=call["id"])])
    assert answer.content or answer.tool_calls


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_structured_output(chat_model: ChatOpenAI, method: str) -> None:
    structured = chat_model.with_structured_output(Colour, method=method)
    prompt = "Name a colour. Answer in JSON with the key name." if method == "json_mode" else "Name a colour."
    colour = structured.invoke(prompt)
    assert isinstance(colour, Colour) and isinstance(colour.name, str)


def test_pydantic_ai_text_and_typed_output(base_url: str, model: str) -> None:
    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=f"{base_url}/v1", api_key=API_KEY))
    text = PydanticAgent(chat, model_settings={"max_tokens": 16, "temperature": 0}).run_sync("Name a colour.")
    assert isinstance(text.output, str) and text.output.strip()
    typed = PydanticAgent(chat, output_type=Colour, model_settings={"max_tokens": 48, "temperature": 0}
                          ).run_sync("Name a colour.")
    assert isinstance(typed.output, Colour) and isinstance(typed.output.name, str)
