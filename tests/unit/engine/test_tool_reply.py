"""A generic-format reply read as it streams (engine/chat/tool_reply.py): whatever the split into
pieces, the answer's text and the calls' deltas add up to the whole reply."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llmserve.service.engine.chat.tool_reply import ReplyReader, parse_reply  # parse_reply: spot checks below

CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris \\"X\\"", "days": [1, 2]}}}'
CALLS = '{ "tool_calls": [ {"name": "a", "arguments": {"x": "}]"}} , {"name": "b", "arguments": {}} ] }'
ANSWER = '{"response": "Caf\\u00e9 \\ud83d\\ude00, \\"quoted\\" and \\\\ done"}'
REPLIES = [CALL, CALLS, ANSWER, '{"response": {"k": [1, 2.5e3]}}', "plain text, not the format"]


def _streamed(text: str, cuts: list[int]) -> tuple[str, dict[int, dict[str, str]], object]:
    reader, answer, calls = ReplyReader(), [], {}
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    for a, b in zip(bounds, bounds[1:]):
        text_delta, deltas = reader.feed(text[a:b])
        answer.append(text_delta)
        for d in deltas:
            call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id:
                assert not call["id"], "a call's head comes once"
                call.update(id=d.id, name=d.name)
            else:
                assert call["id"], "arguments come after the head"
            call["arguments"] += d.arguments
    return "".join(answer), calls, reader.finish()


def _oracle(text: str) -> tuple[str | None, list[tuple[str, object]]]:
    """What a whole reply holds, read without the reader under test: json.loads of the whole
    text (an answer that is not a string comes back as its JSON, compared parsed)."""
    try:
        reply = json.loads(text)
    except ValueError:
        return text, []  # not the format: the text itself
    if "tool_call" in reply:
        return None, [(reply["tool_call"]["name"], reply["tool_call"]["arguments"])]
    if "tool_calls" in reply:
        return None, [(c["name"], c["arguments"]) for c in reply["tool_calls"]]
    return reply["response"], []


def _held(content: str | None, expected: object) -> bool:
    if isinstance(expected, str) or expected is None:
        return content == expected
    return content is not None and json.loads(content) == expected


@pytest.mark.parametrize("text", REPLIES)
@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_any_split_streams_what_the_whole_reply_holds(text: str, cuts: list[int]) -> None:
    answer, calls, reply = _streamed(text, cuts)
    content, expected_calls = _oracle(text)
    assert _held(reply.content, content), (reply.content, content)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == expected_calls
    assert all(c.arguments in text for c in reply.tool_calls)  # the arguments as the model wrote them
    if reply.tool_calls:
        assert answer == "" and [(c["id"], c["name"], c["arguments"]) for c in calls.values()] == [
            (c.id, c.name, c.arguments) for c in reply.tool_calls]
    else:
        assert calls == {} and answer == reply.content


def test_what_the_calls_and_answers_hold() -> None:
    one = parse_reply(CALL).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in one] == [("get_weather", {"city": 'Paris "X"', "days": [1, 2]})]
    two = parse_reply(CALLS).tool_calls
    assert [c.name for c in two] == ["a", "b"] and json.loads(two[0].arguments) == {"x": "}]"}
    assert two[0].id != two[1].id and all(c.id.startswith("call_") for c in two)
    assert parse_reply(ANSWER).content == 'Café 😀, "quoted" and \\ done'
    assert parse_reply('{"response": {"k": [1, 2.5e3]}}').content == '{"k": [1, 2.5e3]}'


def test_a_head_waits_for_the_whole_name_and_half_a_character_waits() -> None:
    reader = ReplyReader()
    assert reader.feed('{"tool_call": {"name": "get_wea') == ("", ())
    _, deltas = reader.feed('ther", "arguments": {"ci')
    assert [(d.index, d.name, d.arguments) for d in deltas] == [(0, "get_weather", ""), (0, "", '{"ci')]
    reader = ReplyReader()
    assert reader.feed('{"response": "x \\ud83d') == ("x ", ())  # the surrogate pair is not complete
    assert reader.feed('\\ude00"}') == ("😀", ())
