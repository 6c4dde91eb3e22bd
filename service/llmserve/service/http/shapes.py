"""OpenAI's response shapes, built from the engine's events (plain dicts for json.dumps).

Finish reasons: STOP and STOP_SEQUENCE → "stop"; LENGTH and CONTEXT_FULL → "length" (cut
by a limit: max_tokens, or the slot's context); DEADLINE → "length" too (cut by the
request's time limit: where gRPC ends the call DEADLINE_EXCEEDED); CANCELLED → "stop"
(over HTTP a turn is cancelled only when its client has gone, so nobody reads it). ERROR
never gets here: it becomes an error (`call_events`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from ..domain.events import FinishReason, PromptLogprobsEvent, TokenEvent, TurnEndEvent
from ..engine.engine import Call, SessionEnded, Usage
from .errors import bad_request, from_failure

Event = TokenEvent | PromptLogprobsEvent | TurnEndEvent

FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CONTEXT_FULL: "length",
    FinishReason.DEADLINE: "length",
    FinishReason.CANCELLED: "stop",
    FinishReason.TOOL_CALLS: "tool_calls",
}

PieceOf = Callable[[int], str]  # a token id's text


def _entry(token: str, logprob: float) -> dict[str, object]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def token_logprobs(event: TokenEvent, piece_of: PieceOf) -> list[dict[str, object]]:
    """One `logprobs.content` entry per token of the event, with its top alternatives."""
    content = []
    for lp in event.logprobs:
        text = next((t for token_id, t, _ in lp.top if token_id == lp.token_id), None)
        entry = _entry(piece_of(lp.token_id) if text is None else text, lp.logprob)
        entry["top_logprobs"] = [_entry(t, value) for _, t, value in lp.top]
        content.append(entry)
    return content


def usage(counted: Usage) -> dict[str, object]:
    return {
        "prompt_tokens": counted.prompt_tokens,
        "completion_tokens": counted.completion_tokens,
        "total_tokens": counted.total_tokens,
        "prompt_tokens_details": {"cached_tokens": counted.cached_tokens},
    }


def finish(end: TurnEndEvent) -> str:
    return FINISH_REASONS.get(end.finish_reason, "stop")


async def call_events(call: Call, start: Callable[[Call], Awaitable[None]]) -> AsyncIterator[tuple[int, Event]]:
    """An HTTP request's call: `start` opens its sessions and sends their input, then each
    session event (`Call.events`), an errored turn as a 400. Use it in `aclosing`: leaving
    closes the call's sessions."""
    with call:
        await start(call)
        try:
            async for tag, event in call.events():
                assert tag is not None and isinstance(event, (TokenEvent, PromptLogprobsEvent, TurnEndEvent))
                if isinstance(event, TurnEndEvent) and event.finish_reason == FinishReason.ERROR:
                    raise bad_request(event.message or "the turn failed")
                yield tag, event
        except SessionEnded as exc:  # the executor's status
            raise from_failure(exc.kind, str(exc)) from None


class Envelope:
    """The fields every object of one completion shares."""

    def __init__(self, completion_id: str, created: int, model: str, fingerprint: str) -> None:
        self.head = {"id": completion_id, "created": created, "model": model, "system_fingerprint": fingerprint}

    def completion(self, choices: list[dict[str, object]], usage_: dict[str, object]) -> dict[str, object]:
        return {**self.head, "object": "chat.completion", "choices": choices, "usage": usage_}

    def chunk(self, choices: list[dict[str, object]], with_usage: bool,
              usage_: dict[str, object] | None = None) -> dict[str, object]:
        out = {**self.head, "object": "chat.completion.chunk", "choices": choices}
        if with_usage:  # stream_options.include_usage: null on every chunk but the last
            out["usage"] = usage_
        return out


def choice(index: int, text: str | None, finish: str | None, logprobs: list[dict[str, object]] | None,
           tool_calls: list[dict[str, object]] | None = None) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "index": index,
        "message": message,
        "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
        "finish_reason": finish,
    }


def delta(index: int, fields: dict[str, object], finish: str | None = None,
          logprobs: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {
        "index": index,
        "delta": fields,
        "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
        "finish_reason": finish,
    }
