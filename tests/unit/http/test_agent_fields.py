"""What the coding agents send (captured from Claude Code 2.1.332 and Codex CLI 0.171.0
against the server), read by the Messages and Responses parsers and the chat template:
fields that change nothing for a model without reasoning are accepted, those that would
change the output and are not served are refused by name, and conversations whose roles
Gemma's template refuses are rendered with one system message and alternating roles."""

from __future__ import annotations

from typing import Any

import pytest
from llmserve.service.engine.chat.chat import PACKAGED_TEMPLATES, ChatMessage, ChatTemplate, alternating
from llmserve.service.http.anthropic_request import parse_messages_request
from llmserve.service.http.errors import ApiError
from llmserve.service.http.responses_request import parse_responses_request

CLAUDE_CODE: dict[str, Any] = {  # the shape of Claude Code's first request (texts shortened)
    "model": "m", "max_tokens": 512, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                     {"type": "text", "text": "Write hi into hello.txt"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
    ],
    "tools": [{"name": "Write", "description": "Write a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["file_path", "content"]}}],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "metadata": {"user_id": "{}"},
}


def _refused(parse: Any, body: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as refused:
        parse(body)
    assert refused.value.status == 400
    return str(refused.value.param)


def test_claude_code_request_is_read() -> None:
    chat = parse_messages_request(CLAUDE_CODE).chat
    assert [m.role for m in chat.messages] == ["system", "user"]  # the system turn joined the user's text
    assert chat.messages[1].content.endswith("Write hi into hello.txt\n\n# Environment\nPlatform: linux")
    assert chat.tools is not None and chat.tools.tools[0].name == "Write"


def test_thinking_blocks_sent_back_are_dropped() -> None:
    body = {**CLAUDE_CODE, "messages": [*CLAUDE_CODE["messages"][:1], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Done."}]},
        {"role": "user", "content": "Thanks"}]}
    chat = parse_messages_request(body).chat
    assert [m.content for m in chat.messages if m.role == "assistant"] == ["Done."]


def test_output_format_is_the_chat_routes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = {k: v for k, v in CLAUDE_CODE.items() if k != "tools"}
    chat = parse_messages_request({**body, "output_config": {"format": {"type": "json_schema", "schema": schema}}}).chat
    assert chat.constraint is not None and chat.constraint.kind == "json_schema" and '"a"' in chat.constraint.text


@pytest.mark.parametrize(("extra", "param"), [
    ({"thinking": {"type": "maybe"}}, "thinking.type"),
    ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management.edits[0].type"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ({"output_config": {"task_budget": 5}}, "output_config.task_budget"),
])
def test_what_would_change_the_output_is_refused_by_name(extra: dict[str, Any], param: str) -> None:
    assert _refused(parse_messages_request, {**CLAUDE_CODE, **extra}) == param


def test_codex_request_is_read() -> None:
    body = {"model": "m", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "client_metadata": {"session_id": "s"},
            "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules"}]},
                      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "More"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Env"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Task"}]}]}
    request = parse_responses_request(body)
    assert [m.role for m in request.chat.messages] == ["system", "system", "user", "user"] and not request.store
    assert _refused(parse_responses_request, {**body, "background": True}) == "background"  # not with store false


def test_roles_gemma_refuses_are_rendered_alternating() -> None:
    template = ChatTemplate.from_file(PACKAGED_TEMPLATES["gemma3"], "<bos>", "<eos>", "packaged")
    messages = [ChatMessage("system", "Rules"), ChatMessage("system", "More"), ChatMessage("user", "Env"),
                ChatMessage("user", "Task")]
    assert [(m.role, m.content) for m in alternating(messages)] == [("system", "Rules\n\nMore"),
                                                                    ("user", "Env\n\nTask")]
    text = template.render_plain(messages)
    assert text.count("<start_of_turn>user") == 1 and "Rules\n\nMore\n\nEnv\n\nTask" in text
    ordered = [ChatMessage("system", "Rules"), ChatMessage("user", "Hi")]
    assert template.render_plain(ordered) == template.render([{"role": "system", "content": "Rules"},
                                                              {"role": "user", "content": "Hi"}])
