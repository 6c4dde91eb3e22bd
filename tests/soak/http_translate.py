"""An HTTP plan as OpenAI's request, and its reply as the oracle's outcome type (pure).

`request(plan)` is the route and JSON body that say what the plan's SessionConfig says
(a config field with no HTTP form is an error: such plans are drawn for gRPC only).
`to_record` turns what the client saw (`HttpOutcome`: a status, headers, a whole body
or a stream's events) into the `CallRecord` the gRPC fuzzer records: the status as a
gRPC code (400 INVALID_ARGUMENT with `param` as the field, 429 RESOURCE_EXHAUSTED with
Retry-After, ...), each choice's text and logprobs as chunks and its finish as a turn
end, and in `HttpFacts` what has no place there (each token's text, the token counts
the reply shows, usage, breaches of OpenAI's format). Every request asks for logprobs, so
that each token's text is known (shown as the plan's logprobs only when it asks for them).
tests/unit/tooling/test_http_translate.py
feeds broken replies through it to the oracle. A plan for /v1/responses or /v1/messages is
spelled and read by tests/soak/responses_translate.py or messages_translate.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmserve.client import pb

from tests.soak import messages_translate, responses_translate
from tests.soak.http_choices import ERROR_TYPES, Choice, add_choice
from tests.soak.oracle import CallRecord, Status
from tests.soak.oracle_http import HttpFacts
from tests.soak.plans import Plan

APIS = {"responses": responses_translate, "messages": messages_translate}  # each: request, read, TERMINAL
SAMPLING = ("temperature", "seed", "repeat_penalty", "presence_penalty")
STOPPING = ("max_tokens", "min_tokens", "ignore_eos", "stop")
CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED",
         413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def request(plan: Plan) -> tuple[str, dict[str, Any]]:
    """The route and body of the plan's one turn."""
    if plan.api != "openai":
        route, body = APIS[plan.api].request(plan)
        return route, body | ({"model": plan.config.model} if plan.config.model else {})
    c, prompt = plan.config, plan.prompts[0]
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]} if plan.chat else {"prompt": prompt}
    if c.model:  # a further model (combos --models)
        body["model"] = c.model
    body |= {name: getattr(c.sampling, name) for name in SAMPLING if c.sampling.HasField(name)}
    if c.sampling.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in sorted(c.sampling.logit_bias.items())}
    body |= {name: getattr(c.stopping, name) for name in ("max_tokens", "min_tokens") if c.stopping.HasField(name)}
    if c.stopping.ignore_eos:
        body["ignore_eos"] = True
    if c.stopping.stop:
        body["stop"] = list(c.stopping.stop)
    if c.HasField("n"):
        body["n"] = c.n
    if c.output.HasField("top_logprobs"):
        k = c.output.top_logprobs
        body |= {"logprobs": True, "top_logprobs": k} if plan.chat else {"logprobs": k}
    else:  # asked all the same: each token's text is what the oracle checks the reply by (not shown as logprobs)
        body |= {"logprobs": True} if plan.chat else {"logprobs": 0}
    body |= _constraint(c.constraint)
    if plan.stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    rest = pb.SessionConfig()
    rest.CopyFrom(c)
    for message, names in ((rest.sampling, (*SAMPLING, "logit_bias")), (rest.stopping, STOPPING),
                           (rest.output, ("top_logprobs",)), (rest, ("n", "constraint", "model"))):
        for name in names:
            message.ClearField(name)
    for name in ("sampling", "stopping", "output"):
        if not getattr(rest, name).ByteSize():
            rest.ClearField(name)
    if rest.ByteSize():
        raise ValueError(f"plan {plan.index}: {rest} has no HTTP form")
    return ("/v1/chat/completions" if plan.chat else "/v1/completions"), body


def _constraint(c: pb.Constraint) -> dict[str, Any]:
    kind = c.WhichOneof("kind")
    if kind in ("grammar", "regex"):
        return {kind: getattr(c, kind)}
    if kind == "choice":
        return {"choice": list(c.choice.values)}
    if kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "plan", "schema": json.loads(c.json_schema)}}}
    return {"response_format": {"type": "json_object"}} if kind == "json_object" else {}


@dataclass
class HttpOutcome:
    """What the client saw of one request."""

    status: int = 0  # the HTTP status (0: none came)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: Any = None  # a whole reply's JSON, or an error's
    events: list[Any] = field(default_factory=list)  # a stream's `data:` values, parsed, in order
    done: bool = False  # the stream ended with `data: [DONE]`
    acted: bool = False  # the client dropped the stream (its plan ends by disconnect)
    client_error: str = ""  # the client failed: no response, a body that is not JSON


def to_record(plan: Plan, out: HttpOutcome, t_start: float = 0.0, t_end: float = 0.0) -> CallRecord:
    facts = HttpFacts()
    rec = CallRecord(plan, [], Status("OK"), acted=out.acted, t_start=t_start, t_end=t_end, http=facts)
    if out.client_error:
        rec.status = Status("CLIENT-ERROR", out.client_error)
        return rec
    if out.status != 200:
        error = out.body.get("error", {}) if isinstance(out.body, dict) else {}
        retry = out.headers.get("retry-after")
        param = error.get("param") or (messages_translate.error_field(str(error.get("message", "")))
                                       if plan.api == "messages" else None)  # Anthropic's object has no param
        rec.status = Status(CODES.get(out.status, f"HTTP {out.status}"), str(error.get("message", out.body)),
                            (param,) if param else (), float(retry) if retry else None)
        return rec
    rid = out.headers.get("x-request-id", "")
    choices: dict[int, Choice] = {}
    if plan.api != "openai":
        usage = APIS[plan.api].read(plan, out, rec, choices)
    else:
        usage = _stream(plan, out, rec, choices) if plan.stream else _whole(plan, out.body, choices, facts)
    if plan.stream and not out.done and not out.acted and rec.status.code == "OK":
        facts.problems.append("the stream ended without data: [DONE]" if plan.api == "openai" else
                              f"the stream ended without any of {APIS[plan.api].TERMINAL}")
    if out.acted:
        rec.status = Status("CANCELLED", "the client dropped the stream")
    for i, ch in choices.items():
        if ch.logprobs:  # else none came: the oracle says so
            facts.pieces[i], facts.counts[i] = ch.pieces, ch.logprobs
    if usage is not None:
        facts.completion_tokens = usage.get("completion_tokens")
        if usage.get("prompt_tokens_details", {}).get("cached_tokens", 0) > usage.get("prompt_tokens", 0):
            facts.problems.append(f"usage {usage}: more cached tokens than prompt tokens")
    for i, ch in sorted(choices.items()):
        for r in ch.events:
            r.request_id = rid
            if r.HasField("turn_end") and usage is not None:
                r.turn_end.usage.CopyFrom(pb.Usage(
                    prompt_tokens=usage.get("prompt_tokens", 0), completion_tokens=facts.counts.get(i, 0),
                    cached_tokens=usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)))
        rec.responses += ch.events
    return rec


def _whole(plan: Plan, body: Any, choices: dict[int, Choice], facts: HttpFacts) -> dict[str, Any] | None:
    for c in body.get("choices", []):
        ch = choices.setdefault(c.get("index", -1), Choice())
        text = c["message"].get("content") if plan.chat else c.get("text")
        add_choice(plan, ch, c, text or "", c.get("logprobs"), facts)
    return body.get("usage")


def _stream(plan: Plan, out: HttpOutcome, rec: CallRecord, choices: dict[int, Choice]) -> dict[str, Any] | None:
    assert rec.http is not None
    facts, usage = rec.http, None
    for event in out.events:
        if "error" in event:  # after the headers an error is an event, the stream's last
            error = event["error"]
            rec.status = Status(ERROR_TYPES.get(error.get("type"), "INTERNAL"), str(error.get("message")),
                                (error["param"],) if error.get("param") else ())
            continue
        if event.get("usage") is not None:
            if event.get("choices") or usage is not None:
                facts.problems.append(f"usage in a chunk with choices, or twice: {event}")
            usage = event["usage"]
        for c in event.get("choices", []):
            ch = choices.setdefault(c.get("index", -1), Choice())
            if ch.finished:
                facts.problems.append(f"choice {c.get('index')}: a chunk after its finish_reason: {c}")
            delta = c.get("delta", {}) if plan.chat else {"content": c.get("text")}
            if plan.chat and delta.get("role") == "assistant":
                ch.role = True
            elif plan.chat and not ch.role:
                facts.problems.append(f"choice {c.get('index')}: a delta before the role's: {c}")
            add_choice(plan, ch, c, delta.get("content") or "", c.get("logprobs"), facts)
    return usage
