"""The HTTP oracle judges every reply by its tokens (tests/soak/oracle_http.py): each plan asks
for logprobs, a reply without them fails, and a character split over tokens (U+FFFD in each
token's text) no longer lets any text pass: the rest of the text must still be the tokens'."""

from __future__ import annotations

import copy

from tests.soak.http_translate import request
from tests.soak.oracle_http import token_texts_say

from .http_replies import EOT, plan, problems, sse, whole

SPLIT = ["caf", "\ufffd", "\ufffd", " ok"]  # "café ok" with é's two bytes in two tokens


def test_every_plan_asks_for_the_tokens() -> None:
    assert request(plan())[1]["logprobs"] is True
    assert request(plan(chat=False))[1]["logprobs"] == 0
    assert request(plan(top=3))[1]["top_logprobs"] == 3


def test_a_reply_without_its_tokens_fails() -> None:
    p = plan(stop=("x",))  # could stop by its stop string: once enough to let any `stop` pass
    out = whole(p, [["a", "b"]], ["ab"], ["stop"])
    out.body["choices"][0]["logprobs"] = None
    assert any("no logprobs for choice 0" in x for x in problems(p, out))


def test_a_stop_that_is_neither_end_token_nor_stop_string_fails() -> None:
    p = plan(stop=("x",))
    assert any("is not the tokens'" in x for x in problems(p, whole(p, [["a", "b"]], ["ab"], ["stop"])))
    assert problems(p, whole(p, [["a", "b", EOT]], ["ab"], ["stop"])) == []
    assert problems(p, whole(p, [["a", "bx"]], ["ab"], ["stop"])) == []


def test_split_characters_are_compared_run_by_run() -> None:
    assert token_texts_say(SPLIT, "café ok") == ("caf\ufffd ok", "caf\ufffd ok")
    p = plan(max_tokens=4)
    assert problems(p, whole(p, [SPLIT], ["café ok"], ["length"])) == []
    for wrong in ("cafe ok", "café no", "café", "caf ok"):
        assert any("its tokens say" in x for x in problems(p, whole(p, [SPLIT], [wrong], ["length"]))), wrong
    stop = plan(max_tokens=8)
    assert problems(stop, whole(stop, [[*SPLIT, EOT]], ["café ok"], ["stop"])) == []
    assert any("is not the tokens'" in x for x in problems(stop, whole(stop, [[*SPLIT, EOT]], ["café OK"], ["stop"])))


def test_a_dropped_stream_begins_as_its_tokens_do() -> None:
    p = plan(stream=True, ending="disconnect")
    good = sse(p, SPLIT, ["caf", "", "é", " ok"], "length")
    good.events = good.events[:4]  # the client left after "é"
    good.done, good.acted = False, True
    assert problems(p, good) == []
    bad = copy.deepcopy(good)
    bad.events[3]["choices"][0]["delta"]["content"] = "e"
    assert any("is not how its tokens begin" in x for x in problems(p, bad))
