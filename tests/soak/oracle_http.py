"""The oracle's checks of one sample's turn for an HTTP call (tests/soak/oracle.py calls them).

An HTTP reply shows less than a gRPC stream: no token ids, and a finish reason that
folds several engine reasons into one (`stop`: end of generation, a stop string, a
complete constraint; `length`: max_tokens, a full context). So the translation
(tests/soak/http_translate.py) hands the oracle what it does show, `HttpFacts`, and the
gRPC checks are made from that:

| gRPC check | over HTTP |
|---|---|
| the ids decode to the text | each token's text joins into the text, then the stop string or the end-of-generation token |
| tokens <= max_tokens, `length` only at max_tokens (or a deadline) | the same, the tokens counted from the logprobs; usage's total <= n * max_tokens |
| min_tokens: no end id among the first | no end-of-generation token among the first |
| ignore_eos | a `stop` is a stop string or a complete constraint, never the end token |
| one logprob per token, top_logprobs alternatives | the same |
| no stop string in the text; the constraint | the same; complete only when `stop` is not a stop string |

Every HTTP call asks for logprobs (tests/soak/http_translate.py), so each token's text is
known. A token's text alone cannot show a character whose UTF-8 bytes are split over
tokens: the server gives it as U+FFFD (and `bytes` as U+FFFD's, not the token's own). So
where the tokens' texts hold U+FFFD, the text is compared with them run by run: each run of
characters outside ASCII on either side stands for "some characters outside ASCII", and
everything else must be equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmserve.client import pb

if TYPE_CHECKING:
    from tests.soak.oracle import CallRecord, RunContext, SampleTurn

FR = pb.FinishReason
NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")


def token_texts_say(pieces: list[str], text: str) -> tuple[str, str]:
    """(what the tokens' texts say, the text) to compare: as they are, or where a token's text
    holds U+FFFD (a character split over tokens), with each run of non-ASCII characters in
    both replaced by one U+FFFD."""
    joined = "".join(pieces)
    if "\ufffd" not in joined:
        return joined, text
    return NON_ASCII_RUN.sub("\ufffd", joined), NON_ASCII_RUN.sub("\ufffd", text)


@dataclass
class HttpFacts:
    """What an HTTP reply showed that the translated responses cannot carry."""

    pieces: dict[int, list[str]] = field(default_factory=dict)  # choice -> each token's text (its logprobs)
    counts: dict[int, int] = field(default_factory=dict)  # choice -> its tokens (its logprobs)
    completion_tokens: int | None = None  # usage's total over the choices (None: no usage came)
    problems: list[str] = field(default_factory=list)  # the reply broke OpenAI's format
    tokens_shown: bool = True  # False: an API with no logprobs (Anthropic's): counts from usage, no token texts
    stop_sequence: str | None = None  # the stop string the reply names as its end (Anthropic's `stop_sequence`)


def check_http_sample_turn(rec: CallRecord, k: int, i: int, st: SampleTurn, ctx: RunContext) -> list[str]:
    assert rec.http is not None
    plan, facts, problems = rec.plan, rec.http, []
    stopping, output = plan.config.stopping, plan.config.output
    pieces, n = facts.pieces.get(i), facts.counts.get(i)
    if not facts.tokens_shown:
        return _check_untokened(rec, st, facts.completion_tokens or 0, ctx)
    if pieces is None or n is None:
        if st.text or (st.end is not None and st.end.finish_reason == FR.FINISH_REASON_STOP):
            return [f"no logprobs for choice {i}: they were asked (each token's text)"]
        pieces, n = [], 0  # no token came (a deadline before the first)
    if n > stopping.max_tokens:
        problems.append(f"{n} tokens, max_tokens {stopping.max_tokens}")
    problems += [f"the stop string {s!r} in the text {st.text!r}" for s in stopping.stop if s in st.text]
    early = [p for p in pieces[: stopping.min_tokens] if p in ctx.eog_pieces]
    if early:
        problems.append(f"end tokens {early} among the first {stopping.min_tokens} (min_tokens)")
    if output.HasField("top_logprobs"):
        if len(st.logprobs) != n:
            problems.append(f"{len(st.logprobs)} logprobs for {n} tokens")
        tops = {len(lp.top) for lp in st.logprobs} - {output.top_logprobs}
        if tops:
            problems.append(f"{sorted(tops)} alternatives, top_logprobs {output.top_logprobs}")
    elif st.logprobs:
        problems.append("logprobs that were not asked for")
    if st.end is None:  # the client dropped the stream
        said, text = token_texts_say(pieces, st.text)
        if not said.startswith(text):
            problems.append(f"the text {st.text!r} is not how its tokens begin {''.join(pieces)!r}")
        return problems + plan.constraint_problems(st.text, complete=False)
    return problems + _check_finish(rec, st, pieces, n, ctx)


def _check_finish(rec: CallRecord, st: SampleTurn, pieces: list[str], n: int, ctx: RunContext) -> list[str]:
    """`stop` or `length` is one the plan can cause, and the text is what its tokens imply."""
    assert st.end is not None
    plan, text, end = rec.plan, st.text, st.end
    stopping, constrained = plan.config.stopping, bool(plan.config.constraint.WhichOneof("kind"))
    context_full = end.usage.cached_tokens + end.usage.prompt_tokens + n + 1 >= ctx.n_ctx_per_slot
    if end.finish_reason == FR.FINISH_REASON_LENGTH:
        if n != stopping.max_tokens and not context_full and plan.ending != "deadline":
            return [f"finish length after {n} tokens (max_tokens {stopping.max_tokens})"]
        said, shown = token_texts_say(pieces, text)
        if said != shown:
            return [f"the text {text!r}, its tokens say {''.join(pieces)!r}"]
        return plan.constraint_problems(text, complete=False)
    if end.finish_reason != FR.FINISH_REASON_STOP:
        return [f"finish {FR.Name(end.finish_reason)}"]
    by_stop = any(_begins(pieces, text + s) for s in stopping.stop)
    by_eog = (bool(pieces) and pieces[-1] in ctx.eog_pieces and not stopping.ignore_eos
              and len(pieces) >= stopping.min_tokens and _equal(pieces[:-1], text))
    by_constraint = constrained and _equal(pieces, text)
    if not (by_stop or by_eog or by_constraint):
        return [f"finish stop after {len(pieces)} tokens {pieces[-3:]}: the text {text!r} is not the tokens' "
                f"{''.join(pieces)!r} up to a stop string {list(stopping.stop)} or an end token"]
    return plan.constraint_problems(text, complete=not by_stop)


def _check_untokened(rec: CallRecord, st: SampleTurn, n: int, ctx: RunContext) -> list[str]:
    """A reply that shows no tokens (one sample): usage's count against max_tokens, no stop
    string in the text, `length` only at the limit, a named stop string one of the plan's."""
    plan, facts, problems = rec.plan, rec.http, []
    assert facts is not None
    stopping = plan.config.stopping
    if n > stopping.max_tokens:
        problems.append(f"{n} tokens, max_tokens {stopping.max_tokens}")
    problems += [f"the stop string {s!r} in the text {st.text!r}" for s in stopping.stop if s in st.text]
    if st.end is None:
        return problems
    context_full = st.end.usage.cached_tokens + st.end.usage.prompt_tokens + n + 1 >= ctx.n_ctx_per_slot
    if st.end.finish_reason == FR.FINISH_REASON_LENGTH and n != stopping.max_tokens and not context_full \
            and plan.ending != "deadline":
        problems.append(f"finish length after {n} tokens (max_tokens {stopping.max_tokens})")
    if facts.stop_sequence is not None and facts.stop_sequence not in stopping.stop:
        problems.append(f"stop_sequence {facts.stop_sequence!r}, not one of {list(stopping.stop)}")
    return problems


def _equal(pieces: list[str], text: str) -> bool:
    said, shown = token_texts_say(pieces, text)
    return said == shown


def _begins(pieces: list[str], text: str) -> bool:
    said, shown = token_texts_say(pieces, text)
    return said.startswith(shown)


def check_http_call(rec: CallRecord, turns: dict[tuple[int, int], SampleTurn]) -> list[str]:
    """The reply's format, and its usage against the choices' tokens."""
    assert rec.http is not None
    facts, plan = rec.http, rec.plan
    problems = list(facts.problems)
    if rec.status.code != "OK":
        return problems
    if facts.completion_tokens is None:
        return problems + ["OK, but no usage"]
    if facts.completion_tokens > plan.num_samples * plan.config.stopping.max_tokens:
        problems.append(f"usage completion_tokens {facts.completion_tokens} over n {plan.num_samples} x "
                        f"max_tokens {plan.config.stopping.max_tokens}")
    if len(facts.counts) == plan.num_samples and sum(facts.counts.values()) != facts.completion_tokens:
        problems.append(f"usage completion_tokens {facts.completion_tokens}, the choices show "
                        f"{sum(facts.counts.values())} tokens")
    lengths = sum(st.end is not None and st.end.finish_reason == FR.FINISH_REASON_LENGTH for st in turns.values())
    if facts.completion_tokens < lengths * plan.config.stopping.max_tokens and plan.ending != "deadline":
        problems.append(f"usage completion_tokens {facts.completion_tokens}: {lengths} choices ended by length")
    return problems
