"""One choice of an OpenAI reply as the oracle's responses (pure): its text and logprobs as
chunks, its finish as a turn end, what breaks OpenAI's format as the facts' problems. Used
by the chat and completions translation (http_translate.py) and the Responses one
(responses_translate.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmserve.client import pb

from tests.soak.oracle_http import HttpFacts
from tests.soak.plans import Plan

ERROR_TYPES = {"invalid_request_error": "INVALID_ARGUMENT", "rate_limit_error": "RESOURCE_EXHAUSTED",
               "timeout": "DEADLINE_EXCEEDED", "service_unavailable": "UNAVAILABLE", "server_error": "INTERNAL"}
FINISHES = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}


@dataclass
class Choice:
    events: list[pb.GenerateResponse] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    logprobs: int = 0  # entries seen
    finished: bool = False
    role: bool = False


def add_choice(plan: Plan, ch: Choice, c: dict[str, Any], text: str, logprobs: Any, facts: HttpFacts) -> None:
    """One choice object (whole or a chunk): its text and logprobs as a chunk, its finish as a turn end."""
    index, chunk = c.get("index", -1), pb.TokenChunk(text=text, index=c.get("index", -1))
    if not 0 <= index < plan.num_samples:
        facts.problems.append(f"choice {index} of n = {plan.num_samples}")
    if logprobs is not None:
        entries = _legacy(logprobs, len("".join(ch.pieces)), facts) if not plan.chat else [
            (e["token"], e["logprob"], {t["token"]: t["logprob"] for t in e["top_logprobs"]}, len(e["top_logprobs"]))
            for e in logprobs.get("content") or []]
        for token, logprob, top, num_top in entries:
            if plan.config.output.HasField("top_logprobs"):  # else asked for the oracle only (`request`)
                chunk.logprobs.append(pb.TokenLogprob(logprob=logprob, top=[
                    pb.TopLogprob(text=t, logprob=v) for t, v in top.items()] + [pb.TopLogprob()] * (num_top - len(top))))
            ch.pieces.append(token)
        ch.logprobs += len(entries)
    if text or chunk.logprobs:
        ch.events.append(pb.GenerateResponse(chunk=chunk))
    finish = c.get("finish_reason")
    if finish is not None:
        if finish not in FINISHES:
            facts.problems.append(f"choice {index}: finish_reason {finish!r}")
        ch.finished = True
        ch.events.append(pb.GenerateResponse(turn_end=pb.TurnEnd(index=index, finish_reason=FINISHES.get(finish, 0))))


def _legacy(lp: dict[str, Any], offset: int, facts: HttpFacts) -> list[tuple[str, float, dict[str, float], int]]:
    """/v1/completions' `{tokens, token_logprobs, top_logprobs, text_offset}` as entries;
    each offset must be where its token starts among the choice's tokens."""
    tokens, offsets = lp["tokens"], lp["text_offset"]
    starts = [offset + sum(map(len, tokens[:j])) for j in range(len(tokens))]
    if offsets != starts or not len(tokens) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]):
        facts.problems.append(f"legacy logprobs {lp}: offsets {offsets}, the tokens start at {starts}")
    return [(t, v, top or {}, len(top or {})) for t, v, top in zip(tokens, lp["token_logprobs"], lp["top_logprobs"], strict=False)]
