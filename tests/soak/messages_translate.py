"""A plan for Anthropic's Messages API (`POST /v1/messages`) as its request, and its reply as
the oracle's choice (pure), beside chat's (http_translate.py, which calls these).

`request(plan)`: the one user message, `max_tokens` (required by the API), `temperature`,
`stop_sequences`. The API shows no logprobs, so the facts say `tokens_shown` False and the
oracle checks what it does show (oracle_http.py `_check_untokened`): usage's
`output_tokens` against max_tokens, no stop string in the text, `stop_reason` `max_tokens`
(chat's `length`) only at the limit, `stop_sequence` one of the plan's. `read`: the text
blocks as one choice; `end_turn` and `stop_sequence` are chat's `stop`. A stream is
Anthropic's named events: `message_start`, a text block's `content_block_start`, its
`text_delta`s, `content_block_stop`, `message_delta` (the stop reason and usage),
`message_stop` (chat's `[DONE]`), or an `error` event; the deltas must be in that order.
An error names no field (Anthropic's object has no `param`): the server's message names it
first, which is what the oracle reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.soak.http_choices import ERROR_TYPES, Choice, add_choice
from tests.soak.oracle import CallRecord, Status
from tests.soak.plans import Plan

if TYPE_CHECKING:
    from tests.soak.http_translate import HttpOutcome

ROUTE = "/v1/messages"
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
TERMINAL = ("message_stop",)
ORDER = ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
         "message_stop")


def request(plan: Plan) -> tuple[str, dict[str, Any]]:
    c = plan.config
    body: dict[str, Any] = {"max_tokens": c.stopping.max_tokens,  # no model: the served one
                            "messages": [{"role": "user", "content": plan.prompts[0]}]}
    if c.sampling.HasField("temperature"):
        body["temperature"] = c.sampling.temperature
    if c.stopping.stop:
        body["stop_sequences"] = list(c.stopping.stop)
    if plan.stream:
        body["stream"] = True
    return ROUTE, body


def error_field(message: str) -> str:
    """The field an error's message names first (the server's messages begin with it)."""
    return message.split(" ", 1)[0]


def read(plan: Plan, out: HttpOutcome, rec: CallRecord, choices: dict[int, Choice]) -> dict[str, Any] | None:
    """The reply into `choices[0]`; its usage in chat's names (the facts count from it)."""
    facts = rec.http
    assert facts is not None
    facts.tokens_shown = False
    ch = choices.setdefault(0, Choice())
    final = out.body if not plan.stream else _stream(plan, out, rec, ch)
    if final is None:
        return None
    if not plan.stream:
        text = "".join(block.get("text", "") for block in final.get("content", []) if block.get("type") == "text")
        add_choice(plan, ch, {"index": 0}, text, None, facts)
    reason = final.get("stop_reason")
    if reason not in FINISH:
        facts.problems.append(f"stop_reason {reason!r}")
    if (reason == "stop_sequence") != (final.get("stop_sequence") is not None):
        facts.problems.append(f"stop_reason {reason!r} with stop_sequence {final.get('stop_sequence')!r}")
    facts.stop_sequence = final.get("stop_sequence")
    add_choice(plan, ch, {"index": 0, "finish_reason": FINISH.get(reason, "stop")}, "", None, facts)
    usage = final.get("usage") or {}
    cached = usage.get("cache_read_input_tokens", 0)
    return {"prompt_tokens": usage.get("input_tokens", 0) + cached, "completion_tokens": usage.get("output_tokens"),
            "prompt_tokens_details": {"cached_tokens": cached}}


def _stream(plan: Plan, out: HttpOutcome, rec: CallRecord, ch: Choice) -> dict[str, Any] | None:
    """The text deltas into `ch`; the stop reason and usage as a whole message (None: an error ended it)."""
    facts = rec.http
    assert facts is not None
    final: dict[str, Any] = {}
    at = -1
    for event in out.events:
        kind = event.get("type")
        if kind == "error" or "error" in event:
            error = event.get("error", {})
            rec.status = Status(ERROR_TYPES.get(error.get("type"), "INTERNAL"), str(error.get("message")))
            return None
        if kind == "ping":
            continue
        if kind not in ORDER or ORDER.index(kind) < at or (ORDER.index(kind) == at and kind != "content_block_delta"):
            facts.problems.append(f"event {kind!r} after {ORDER[at] if at >= 0 else 'none'}")
        at = ORDER.index(kind) if kind in ORDER else at
        if kind == "message_start":
            final["usage"] = dict(event["message"].get("usage") or {})
        elif kind == "content_block_delta":
            add_choice(plan, ch, {"index": 0}, event["delta"].get("text", ""), None, facts)
        elif kind == "message_delta":
            final |= {"stop_reason": event["delta"].get("stop_reason"), "stop_sequence": event["delta"].get("stop_sequence")}
            final["usage"] = {**final.get("usage", {}), **(event.get("usage") or {})}
    return final if "stop_reason" in final else None
