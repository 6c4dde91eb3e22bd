"""OpenAI's response shapes, built from the engine's events (plain dicts for json.dumps).

Finish reasons: STOP and STOP_SEQUENCE → "stop"; LENGTH and CONTEXT_FULL → "length" (cut
by a limit: max_tokens, or the slot's context); DEADLINE → "length" too (cut by the
request's time limit); CANCELLED → "stop" (over HTTP a turn is cancelled only when its
client has gone, so nobody reads it). ERROR never gets here: it becomes an error.
"""

from __future__ import annotations

from collections.abc import Callable

from ..domain.events import FinishReason, TokenEvent, TurnEndEvent

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


def usage(ends: dict[int, TurnEndEvent]) -> dict[str, object]:
    """All samples' completion tokens; the prompt (shared by the samples) once."""
    first = ends[min(ends)]
    completion = sum(end.completion_tokens for end in ends.values())
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


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
