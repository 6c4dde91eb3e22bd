"""A plan for OpenAI's Responses API (`POST /v1/responses`) as its request, and its reply
as the oracle's choices (pure), beside chat's (http_translate.py, which calls these).

`request(plan)`: the one user message as `input`, `max_output_tokens`, `temperature`,
`text.format` for a JSON schema or object, `store: false`, and always
`include: ["message.output_text.logprobs"]` (with the plan's `top_logprobs`), so that each
token's text is known, as chat's translation asks for logprobs. `read`: the reply's
message text and logprobs as one choice; `completed` is chat's `stop` and `incomplete` its
`length`; `usage` in chat's names. A stream is Responses' named events: every
`sequence_number` one more than the last, the final response's text and logprobs those of
the `response.output_text.delta`s; it ends with
`response.completed` / `response.incomplete` (chat's `[DONE]`) or an `error` event.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.soak.http_choices import ERROR_TYPES, Choice, add_choice
from tests.soak.oracle import CallRecord, Status
from tests.soak.plans import Plan

if TYPE_CHECKING:
    from tests.soak.http_translate import HttpOutcome

ROUTE = "/v1/responses"
FINISH = {"completed": "stop", "incomplete": "length"}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def request(plan: Plan) -> tuple[str, dict[str, Any]]:
    c = plan.config
    body: dict[str, Any] = {"input": plan.prompts[0], "store": False, "include": ["message.output_text.logprobs"]}
    if c.sampling.HasField("temperature"):
        body["temperature"] = c.sampling.temperature
    if c.stopping.HasField("max_tokens"):
        body["max_output_tokens"] = c.stopping.max_tokens
    if c.output.HasField("top_logprobs"):
        body["top_logprobs"] = c.output.top_logprobs
    kind = c.constraint.WhichOneof("kind")
    if kind == "json_schema":
        body["text"] = {"format": {"type": "json_schema", "name": "plan", "schema": json.loads(c.constraint.json_schema)}}
    elif kind == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    if plan.stream:
        body["stream"] = True
    return ROUTE, body


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Responses' usage in chat's names, which the oracle's facts read."""
    if usage is None:
        return None
    return {"prompt_tokens": usage.get("input_tokens", 0), "completion_tokens": usage.get("output_tokens"),
            "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)}}


def read(plan: Plan, out: HttpOutcome, rec: CallRecord, choices: dict[int, Choice]) -> dict[str, Any] | None:
    """The reply into `choices[0]` (and `rec.status` for an error event); its usage in chat's names."""
    assert rec.http is not None
    ch = choices.setdefault(0, Choice())
    if not plan.stream:
        final = out.body
    else:
        final = _stream(plan, out, rec, ch)
        if final is None:
            return None
    text, logprobs = _message(final, rec)
    if not plan.stream:
        add_choice(plan, ch, {"index": 0}, text, {"content": logprobs}, rec.http)
    else:
        streamed = "".join(r.chunk.text for r in ch.events if r.HasField("chunk"))
        if text != streamed or len(logprobs) != ch.logprobs:
            rec.http.problems.append(f"the final response ({text!r}, {len(logprobs)} logprobs) is not its deltas' "
                                     f"({streamed!r}, {ch.logprobs})")
    if final.get("status") not in FINISH:
        rec.http.problems.append(f"status {final.get('status')!r} of a response that was served")
    add_choice(plan, ch, {"index": 0, "finish_reason": FINISH.get(final.get("status"), "stop")}, "", None, rec.http)
    return chat_usage(final.get("usage"))


def _message(final: dict[str, Any], rec: CallRecord) -> tuple[str, list[dict[str, Any]]]:
    """The one message item's text and logprobs (a reply with no tools has exactly one)."""
    assert rec.http is not None
    items = final.get("output") or []
    if len(items) != 1 or items[0].get("type") != "message" or len(items[0].get("content") or []) != 1:
        rec.http.problems.append(f"output {items}: not one message with one part")
        return "", []
    part = items[0]["content"][0]
    return part.get("text", ""), part.get("logprobs") or []


def _stream(plan: Plan, out: HttpOutcome, rec: CallRecord, ch: Choice) -> dict[str, Any] | None:
    """The deltas into `ch`; the final response (None: an error event ended it, or none came)."""
    assert rec.http is not None
    final, number = None, -1
    for event in out.events:
        if event.get("sequence_number") != number + 1:
            rec.http.problems.append(f"sequence_number {event.get('sequence_number')} after {number}")
        number = event.get("sequence_number", number)
        kind = event.get("type")
        if kind == "error":
            rec.status = Status(ERROR_TYPES.get(event.get("code"), "INTERNAL"), str(event.get("message")),
                                (event["param"],) if event.get("param") else ())
        elif kind == "response.output_text.delta":
            add_choice(plan, ch, {"index": 0}, event.get("delta", ""), {"content": event.get("logprobs") or []},
                       rec.http)
        elif kind in TERMINAL:
            final = event["response"]
    return final
