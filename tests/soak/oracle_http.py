"""The oracle's checks of one sample's turn for an HTTP call (tests/soak/oracle.py calls them).

An HTTP reply shows less than a gRPC stream: no token ids, and a finish reason that
folds several engine reasons into one (`stop`: end of generation, a stop string, a
complete constraint; `length`: max_tokens, a full context). So the translation
(tests/soak/http_translate.py) hands the oracle what it does show, `HttpFacts`, and the
gRPC checks are made from that:

| gRPC check | over HTTP |
|---|---|
| the ids decode to the text | each token's text (logprobs asked) joins into the text, then the stop string or the end-of-generation token |
| tokens <= max_tokens, `length` only at max_tokens (or a deadline) | the token count where the reply shows it (logprobs, or usage with n = 1); usage's total <= n * max_tokens |
| min_tokens: no end id among the first | no end-of-generation token among the first (logprobs); else a `stop` before min_tokens needs a stop string or a constraint |
| ignore_eos | a `stop` needs a stop string or a constraint |
| one logprob per token, top_logprobs alternatives | the same, against the count above |
| no stop string in the text; the constraint | the same; complete only when `stop` cannot be a stop string |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmserve.client import pb

if TYPE_CHECKING:
    from tests.soak.oracle import CallRecord, RunContext, SampleTurn

FR = pb.FinishReason


@dataclass
class HttpFacts:
    """What an HTTP reply showed that the translated responses cannot carry."""

    pieces: dict[int, list[str]] = field(default_factory=dict)  # choice -> each token's text (logprobs asked)
    counts: dict[int, int] = field(default_factory=dict)  # choice -> its tokens, where the reply shows them
    completion_tokens: int | None = None  # usage's total over the choices (None: no usage came)
    problems: list[str] = field(default_factory=list)  # the reply broke OpenAI's format


def check_http_sample_turn(rec: CallRecord, k: int, i: int, st: SampleTurn, ctx: RunContext) -> list[str]:
    assert rec.http is not None
    plan, facts, problems = rec.plan, rec.http, []
    stopping, output = plan.config.stopping, plan.config.output
    pieces, n = facts.pieces.get(i), facts.counts.get(i)
    if n is not None and n > stopping.max_tokens:
        problems.append(f"{n} tokens, max_tokens {stopping.max_tokens}")
    problems += [f"the stop string {s!r} in the text {st.text!r}" for s in stopping.stop if s in st.text]
    if pieces is not None:
        early = [p for p in pieces[: stopping.min_tokens] if p in ctx.eog_pieces]
        if early:
            problems.append(f"end tokens {early} among the first {stopping.min_tokens} (min_tokens)")
    if output.HasField("top_logprobs"):
        if n is not None and len(st.logprobs) != n:
            problems.append(f"{len(st.logprobs)} logprobs for {n} tokens")
        tops = {len(lp.top) for lp in st.logprobs} - {output.top_logprobs}
        if tops:
            problems.append(f"{sorted(tops)} alternatives, top_logprobs {output.top_logprobs}")
    elif st.logprobs:
        problems.append("logprobs that were not asked for")
    decoded = "".join(pieces or [])
    if st.end is None:  # the client dropped the stream
        if pieces is not None and not decoded.startswith(st.text) and "\ufffd" not in decoded:
            problems.append(f"the text {st.text!r} is not how its tokens begin {decoded!r}")
        return problems + plan.constraint_problems(st.text, complete=False)
    return problems + _check_finish(rec, st, pieces, n, ctx)


def _check_finish(rec: CallRecord, st: SampleTurn, pieces: list[str] | None, n: int | None,
                  ctx: RunContext) -> list[str]:
    """`stop` or `length` is one the plan can cause, and the text is what it implies."""
    assert st.end is not None
    plan, text, end = rec.plan, st.text, st.end
    stopping, constrained = plan.config.stopping, bool(plan.config.constraint.WhichOneof("kind"))
    context_full = n is not None and end.usage.cached_tokens + end.usage.prompt_tokens + n + 1 >= ctx.n_ctx_per_slot
    if end.finish_reason == FR.FINISH_REASON_LENGTH:
        if n is not None and n != stopping.max_tokens and not context_full and plan.ending != "deadline":
            return [f"finish length after {n} tokens (max_tokens {stopping.max_tokens})"]
        if pieces is not None and "".join(pieces) != text and "\ufffd" not in "".join(pieces):
            return [f"the text {text!r}, its tokens say {''.join(pieces)!r}"]
        return plan.constraint_problems(text, complete=False)
    if end.finish_reason != FR.FINISH_REASON_STOP:
        return [f"finish {FR.Name(end.finish_reason)}"]
    if pieces is None:  # `stop` without the tokens: the plan must allow some way to stop
        by_stop = bool(stopping.stop)
        by_eog = not stopping.ignore_eos and (n is None or n >= stopping.min_tokens)
        if not (by_stop or by_eog or constrained):
            return [f"finish stop after {n} tokens: no stop string, no constraint, ignore_eos "
                    f"{stopping.ignore_eos}, min_tokens {stopping.min_tokens}"]
        return plan.constraint_problems(text, complete=not by_stop)
    decoded = "".join(pieces)
    by_stop = any(decoded.startswith(text + s) for s in stopping.stop)
    by_eog = (bool(pieces) and pieces[-1] in ctx.eog_pieces and not stopping.ignore_eos
              and len(pieces) >= stopping.min_tokens and "".join(pieces[:-1]) == text)
    by_constraint = constrained and decoded == text
    if not (by_stop or by_eog or by_constraint) and "\ufffd" not in decoded:
        return [f"finish stop after {len(pieces)} tokens {pieces[-3:]}: the text {text!r} is not the tokens' "
                f"{decoded!r} up to a stop string {list(stopping.stop)} or an end token"]
    return plan.constraint_problems(text, complete=not by_stop)


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
