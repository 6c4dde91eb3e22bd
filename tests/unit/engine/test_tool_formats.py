"""Tool formats native to model families (engine/chat/tool_formats.py, native_reply.py): the
format each real template gets, what the template renders of tools, calls and results,
and model-written replies read back whole and streamed split at every character (the
deltas concatenate to the whole reply's calls and answer)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from llmserve.service.domain.errors import InvalidRequest
from llmserve.service.domain.events import ToolCall
from llmserve.service.engine.chat.chat import PACKAGED_TEMPLATES, ChatMessage, ChatTemplate
from llmserve.service.engine.chat.native_reply import NativeReader, parse_native
from llmserve.service.engine.chat.tool_formats import FORMATS, GENERIC, choose, detect, template_tools
from llmserve.service.engine.chat.tool_messages import template_messages
from llmserve.service.engine.chat.tool_plan import session_tools
from llmserve.service.engine.chat.tools import Tool, ToolChoice
from llmserve.service.model.grammar_sources import to_gbnf

TEMPLATES = Path(__file__).parents[2] / "data" / "templates"
WEATHER = Tool("get_weather", "The weather in a city (<40 chars) & more", json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
FAMILIES = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral-args",
    "Qwen3-Coder.jinja": "generic",  # <tool_call> with XML parameters: not hermes JSON
}
# What each family's model writes (the shapes llama.cpp's parsers and the models' cards show).
REPLIES = {
    "hermes": ('I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"arguments": {"city": "Rome \\u00e9"}, "name": "get_weather"}\n</tool_call>',
               "I will look it up.\n", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome \\u00e9"}')]),
    "llama3": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
               [("get_weather", '{"city": "Paris"}')]),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}]', None,
                [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')]),
    "mistral-args": ('Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}',
                     "Sure. ", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')]),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_auto_picks_the_format_the_template_writes(name: str) -> None:
    assert detect((TEMPLATES / name).read_text()).name == FAMILIES[name]


def test_templates_without_tools_and_explicit_choices() -> None:
    assert detect(PACKAGED_TEMPLATES["gemma3"].read_text()) is GENERIC
    assert choose("auto", None) is GENERIC
    assert choose("generic", (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()) is GENERIC
    assert choose("llama3", None) is FORMATS["llama3"]


def _render(name: str) -> str:
    template = ChatTemplate((TEMPLATES / name).read_text(), "<s>", "</s>", "file")
    call = ToolCall("abcDEF123", "get_weather", '{"city": "Paris"}')  # 9 alphanumerics: Mistral's templates check
    messages = [ChatMessage("user", "Weather in Paris?"), ChatMessage("assistant", "", (call,)),
                ChatMessage("tool", "sunny, 21 C", (), "abcDEF123")]
    return template.render(template_messages(messages), tools=template_tools([WEATHER]))


@pytest.mark.parametrize("name,call", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", '"name": "get_weather"'),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]'),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris"}'),
])
def test_the_template_renders_the_tools_the_call_and_the_result(name: str, call: str) -> None:
    text = _render(name)
    assert "The weather in a city (<40 chars) & more" in text  # HF's tojson: plain JSON, not jinja2's \u003c
    assert call in text and "sunny, 21 C" in text


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_a_reply_reads_the_same_whole_and_split_at_every_character(name: str) -> None:
    fmt = FORMATS[name]
    text, answer, calls = REPLIES[name]
    whole = parse_native(fmt, text)
    assert whole.content == answer
    assert [(c.name, c.arguments) for c in whole.tool_calls] == calls
    if fmt.call_id_length:
        assert all(len(c.id) == 9 and c.id.isalnum() for c in whole.tool_calls)
    splits = [(text[:cut], text[cut:]) for cut in range(len(text) + 1)] + [tuple(text)]  # and one at a time
    for pieces in splits:
        reader = NativeReader(fmt)
        streamed, heads, arguments = "", [], {}
        for piece in pieces:
            said, deltas = reader.feed(piece)
            streamed += said
            for d in deltas:
                if d.id:
                    heads.append((d.index, d.id, d.name))
                arguments[d.index] = arguments.get(d.index, "") + d.arguments
        streamed += reader.flush()
        end = reader.finish()
        assert streamed == (answer or ""), (pieces, streamed)
        assert [(c.id, c.name, c.arguments) for c in end.tool_calls] == [(i, n, arguments[k]) for k, i, n in heads]
        assert [(c.name, c.arguments) for c in end.tool_calls] == calls


def test_text_that_is_not_the_syntax_stays_answer_text() -> None:
    hermes, llama3 = FORMATS["hermes"], FORMATS["llama3"]
    assert parse_native(hermes, "a <tool_call> that is not JSON").content == "a <tool_call> that is not JSON"
    assert parse_native(hermes, "ends with <tool_").content == "ends with <tool_"
    assert parse_native(llama3, '{"answer": 42}').content == '{"answer": 42}'
    assert parse_native(llama3, "Hello").content == "Hello"
    cut = parse_native(hermes, '<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert cut.tool_calls == ()  # cut short: no finished call


def test_native_plans_hold_calls_to_frames_and_leave_answers_free() -> None:
    hermes = FORMATS["hermes"]
    plan, constraint = session_tools([WEATHER], ToolChoice("required"), False, None, "response_format", hermes)
    assert plan.active and constraint is not None and constraint[0] == "tool_frames"
    gbnf = to_gbnf(*constraint)
    assert 'frame ::= "<tool_call>\\n" call "\\n</tool_call>"' in gbnf and "root ::= frame\n" in gbnf
    plan, constraint = session_tools([WEATHER], ToolChoice("auto"), True, None, "response_format", hermes)
    assert plan.active and constraint is None
    with pytest.raises(InvalidRequest) as refused:
        session_tools([WEATHER], ToolChoice("auto"), False, ("json_object", ""), "response_format", hermes)
    assert refused.value.field == "response_format"
    for name in ("llama3", "mistral", "mistral-args"):
        _, constraint = session_tools([WEATHER], ToolChoice("function", "get_weather"), True, None, "r", FORMATS[name])
        assert constraint is not None and "get_weather" in to_gbnf(*constraint)


def test_auto_is_held_from_the_opening_tag_when_it_is_one_token() -> None:
    for name in ("hermes", "llama3", "mistral", "mistral-args"):
        fmt = replace(FORMATS[name], opening_is_token=True)
        _, constraint = session_tools([WEATHER], ToolChoice("auto"), False, None, "response_format", fmt)
        assert constraint is not None and constraint[0] == "tool_frames", name
        frames = json.loads(constraint[1])
        assert frames["trigger"] == fmt.opening and frames.get("opening", "").startswith(fmt.opening)
        assert f'frame ::= "{fmt.opening}' in to_gbnf(*constraint)  # the grammar starts with the trigger's text
