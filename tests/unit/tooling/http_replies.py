"""OpenAI-compatible replies as a correct server sends them, whole and as server-sent events,
and the oracle's verdict on them (tests/soak/http_translate.py's record of a call): what the
HTTP oracle's unit tests break one thing of at a time."""

from __future__ import annotations

from typing import Any

from llmserve.client import pb

from tests.soak.http_translate import HttpOutcome, to_record
from tests.soak.oracle import RunContext, check_call
from tests.soak.plans import Plan

EOT = "<end_of_turn>"
CTX = RunContext(eog_ids=frozenset({106}), n_ctx_per_slot=1024, fills_queue=False, eog_pieces=frozenset({EOT}))
HEADERS = {"x-request-id": "r1"}


def plan(*, chat: bool = True, stream: bool = False, n: int = 1, max_tokens: int = 8, stop: tuple[str, ...] = (),
         top: int | None = None, ignore_eos: bool = False, min_tokens: int | None = None, schema: str = "",
         ending: str = "close") -> Plan:
    c = pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=max_tokens, stop=list(stop), ignore_eos=ignore_eos))
    if min_tokens is not None:
        c.stopping.min_tokens = min_tokens
    if n > 1:
        c.n = n
    if top is not None:
        c.output.top_logprobs = top
    if schema:
        c.constraint.json_schema = schema
    return Plan(0, c, chat=chat, prompts=["Hi"], ending=ending, surface="http", stream=stream)


def entries(tokens: list[str], top: int) -> list[dict[str, Any]]:
    alt = [{"token": f"alt{j}", "logprob": -2.0, "bytes": []} for j in range(top)]
    return [{"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": alt} for t in tokens]


def whole(p: Plan, tokens: list[list[str]], texts: list[str], finishes: list[str], cached: int = 0) -> HttpOutcome:
    """A whole chat reply: choice i's tokens (logprobs: every HTTP plan asks for them), text and finish."""
    top = p.config.output.top_logprobs if p.config.output.HasField("top_logprobs") else 0
    choices = [{"index": i, "message": {"role": "assistant", "content": text},
                "logprobs": {"content": entries(toks, top)}, "finish_reason": finish}
               for i, (toks, text, finish) in enumerate(zip(tokens, texts, finishes, strict=True))]
    usage = {"prompt_tokens": 5, "completion_tokens": sum(map(len, tokens)), "prompt_tokens_details": {"cached_tokens": cached}}
    return HttpOutcome(200, HEADERS, {"choices": choices, "usage": usage})


def sse(p: Plan, tokens: list[str], text_of: list[str], finish: str) -> HttpOutcome:
    """One choice streamed: the role, a delta per token (its shown text), the finish, usage, [DONE]."""
    top = p.config.output.top_logprobs if p.config.output.HasField("top_logprobs") else 0
    events: list[Any] = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    for token, shown in zip(tokens, text_of, strict=True):
        events.append({"choices": [{"index": 0, "delta": {"content": shown}, "finish_reason": None,
                                    "logprobs": {"content": entries([token], top)}}]})
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    events.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(tokens)}})
    return HttpOutcome(200, HEADERS, events=events, done=True)


def problems(p: Plan, out: HttpOutcome) -> list[str]:
    return check_call(to_record(p, out), CTX)
