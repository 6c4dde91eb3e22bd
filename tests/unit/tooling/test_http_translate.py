"""The combination fuzzer's HTTP mode (tests/soak/http_translate.py) feeds the oracle faithfully.

Replies are built (http_replies.py) as a correct OpenAI-compatible server sends them, whole and as
server-sent events; each test then breaks one thing the way a faulty HTTP wing would (a
stop string leaked, a logprob dropped, ignore_eos ignored, the wrong field named, a
stream without [DONE], ...) and asserts that the translated record fails the same
oracle the gRPC calls go through. The correct replies must pass.
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.soak.http_translate import HttpOutcome, request, to_record
from tests.soak.oracle import RunContext, check_call
from tests.soak.oracle_run import check_run
from tests.soak.plans import draw_plans

from .http_replies import CTX, EOT, HEADERS, plan, problems, sse, whole


def test_correct_replies_pass() -> None:
    p = plan(top=2, stop=("yes",), n=2)  # sample 1 stops at "yes": its text is what came before
    assert problems(p, whole(p, [["Hello", EOT], [" no", " yes"]], ["Hello", " no "], ["stop", "stop"])) == []
    s = plan(stream=True, top=0)
    assert problems(s, sse(s, ["Hi", " there", EOT], ["Hi", " there", ""], "stop")) == []
    text = plan(chat=False, top=1)
    legacy = {"tokens": ["a", "b"], "token_logprobs": [-1.0, -1.0], "top_logprobs": [{"a": -1.0}, {"b": -1.0}],
              "text_offset": [0, 1]}
    body = {"choices": [{"index": 0, "text": "ab", "logprobs": legacy, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    assert problems(plan(chat=False, top=1, max_tokens=2), HttpOutcome(200, HEADERS, body)) == []
    body["choices"][0]["logprobs"]["text_offset"] = [0, 0]  # the legacy offsets must follow the tokens
    assert any("legacy logprobs" in x for x in problems(text, HttpOutcome(200, HEADERS, body)))


def test_a_leaked_stop_string_is_caught() -> None:
    p = plan(stream=True, stop=("yes",))
    assert any("the stop string 'yes'" in x for x in problems(p, sse(p, [" no", " yes"], [" no", " yes"], "stop")))


def test_a_dropped_logprob_is_caught() -> None:
    p = plan(top=3)
    out = whole(p, [["Hello", " world", EOT]], ["Hello world"], ["stop"])
    out.body["choices"][0]["logprobs"]["content"].pop(1)
    found = problems(p, out)
    assert any("usage completion_tokens 3, the choices show 2 tokens" in x for x in found), found
    s = plan(stream=True, top=3)
    short = sse(s, ["Hi", " there", EOT], ["Hi", " there", ""], "stop")
    short.events[2]["choices"][0]["logprobs"]["content"][0]["top_logprobs"].pop()
    assert any("[2] alternatives, top_logprobs 3" in x for x in problems(s, short))


def test_limits_and_the_end_of_generation_rules_are_checked() -> None:
    p = plan(max_tokens=2)
    assert any("3 tokens, max_tokens 2" in x for x in problems(p, whole(p, [["a", "b", "c"]], ["abc"], ["length"])))
    early = plan(max_tokens=5)
    assert any("finish length after 2 tokens" in x for x in problems(early, whole(early, [["a", "b"]], ["ab"], ["length"])))
    timed = plan(max_tokens=5, ending="deadline")  # x-request-timeout: cut early, or a 408 before the turn began
    assert problems(timed, whole(timed, [["a", "b"]], ["ab"], ["length"])) == []
    assert problems(timed, HttpOutcome(408, {}, {"error": {"message": "deadline", "type": "timeout"}})) == []
    ignored = plan(ignore_eos=True)  # no stop string, no constraint: `stop` means an end token despite ignore_eos
    assert any("finish stop after 2 tokens" in x for x in problems(ignored, whole(ignored, [["a", "b"]], ["ab"], ["stop"])))
    short = plan(min_tokens=4, top=0)
    assert any("among the first 4 (min_tokens)" in x
               for x in problems(short, whole(short, [["a", EOT]], ["a"], ["stop"])))
    made_up = plan(top=0)  # the text is not what the tokens say
    assert any("is not the tokens'" in x for x in problems(made_up, whole(made_up, [["a", EOT]], ["b"], ["stop"])))


def test_a_schema_output_that_does_not_validate_is_caught() -> None:
    p = plan(schema=json.dumps({"type": "object", "required": ["a"]}))
    assert any("not valid for the schema" in x for x in problems(p, whole(p, [["{}", EOT]], ["{}"], ["stop"])))
    assert problems(p, whole(p, [['{"a"', ": 1}", EOT]], ['{"a": 1}'], ["stop"])) == []


def test_the_stream_format_is_checked() -> None:
    p = plan(stream=True)
    good = sse(p, ["Hi", EOT], ["Hi", ""], "stop")
    assert problems(p, good) == []
    no_done = copy.deepcopy(good)
    no_done.done = False
    assert any("without data: [DONE]" in x for x in problems(p, no_done))
    late = copy.deepcopy(good)
    late.events.insert(-1, {"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": None}]})
    assert any("after its finish_reason" in x for x in problems(p, late))
    no_role = copy.deepcopy(good)
    no_role.events.pop(0)
    assert any("before the role's" in x for x in problems(p, no_role))
    extra = copy.deepcopy(good)  # a choice the plan did not ask for
    extra.events.insert(1, {"choices": [{"index": 1, "delta": {"role": "assistant", "content": ""}}]})
    assert any("choice 1 of n = 1" in x for x in problems(p, extra))


def test_refusals_must_name_the_field_and_endings_their_status() -> None:
    p = plan()
    p.adversarial = "bias_outside"
    refused = HttpOutcome(400, {}, {"error": {"message": "token id -3", "type": "invalid_request_error",
                                              "param": "logit_bias[-3]"}})
    assert problems(p, refused) == []
    other = copy.deepcopy(refused)
    other.body["error"]["param"] = "messages"
    assert any("names fields ('messages',)" in x for x in problems(p, other))
    assert any("expected INVALID_ARGUMENT" in x for x in problems(p, whole(p, [["a", EOT]], ["a"], ["stop"])))
    busy = HttpOutcome(429, {"retry-after": "1"}, {"error": {"message": "busy", "type": "rate_limit_error"}})
    assert any("not sized to fill the queue" in x for x in problems(plan(), busy))
    sized = RunContext(CTX.eog_ids, 1024, fills_queue=True, eog_pieces=CTX.eog_pieces)
    assert check_call(to_record(plan(), busy), sized) == []
    assert check_call(to_record(plan(), HttpOutcome(429, {}, busy.body)), sized) == [
        "RESOURCE_EXHAUSTED 'busy' without RetryInfo"]
    gone = plan(stream=True, ending="disconnect")
    dropped = sse(gone, ["Hi", " there"], ["Hi", " there"], "length")
    dropped.events, dropped.done, dropped.acted = dropped.events[:2], False, True
    assert problems(gone, dropped) == []
    assert any("expected OK" in x for x in problems(plan(), HttpOutcome(500, {}, {"error": {"message": "bug"}})))


def test_every_drawn_http_plan_has_a_body_and_unexpressible_configs_are_refused() -> None:
    plans = draw_plans(300, seed=11, surface="http")
    for p in plans:
        route, body = request(p)
        assert route == ("/v1/chat/completions" if p.chat else "/v1/completions")
        assert body.get("stream", False) == p.stream and p.turns == 1 and not p.config.session_id
    kinds = {next(k for k in ("grammar", "regex", "choice", "response_format", "") if k in request(p)[1] or not k)
             for p in plans}
    assert kinds == {"grammar", "regex", "choice", "response_format", ""}
    stop_ids = plan()
    stop_ids.config.stopping.stop_token_ids.append(5)
    with pytest.raises(ValueError, match="no HTTP form"):
        request(stop_ids)
    mixed = draw_plans(200, seed=11, surface="mixed")
    assert {p.surface for p in mixed} == {"grpc", "http"}
    assert all(p.turns == 1 for p in mixed if p.surface == "http")
    assert check_run([to_record(p, HttpOutcome(client_error="x")) for p in plans[:3]], CTX).findings != []
