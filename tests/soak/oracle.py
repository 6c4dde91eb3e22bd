"""The combination fuzzer's oracle for one call: pure checks of a recorded call against its plan.

A `CallRecord` is everything the client saw: the plan, every response, the final
status with its google.rpc details, what the client did (`acted`: the in-band cancel,
the call cancel or the disconnect its ending asks for), and the server's Detokenize of
each sample's token ids. `check_call` predicts what a correct server sends for that
plan and returns one line per difference. Nothing here touches the network, so
tests/unit/tooling/test_oracle.py can feed it the outcomes of broken servers.

The prediction, in short:
- the status: an adversarial value is INVALID_ARGUMENT naming its field (or the
  deadline, when its plan ends by one); a valid plan ends OK or with the status its
  ending implies (CANCELLED once the client cancelled or disconnected, DEADLINE_EXCEEDED,
  FAILED_PRECONDITION "a turn is already queued" for the extra end_of_turn); a named
  session may be refused FAILED_PRECONDITION only with its reason and RetryInfo;
  RESOURCE_EXHAUSTED only in a run sized to fill the queue, with RetryInfo;
- on OK, every planned turn of every sample, each with exactly one turn end;
- in every turn: finish reasons the plan can cause, max/min_tokens, no stop string in
  the text, the matched stop named, one logprob with `top_logprobs` alternatives per
  token, the ids decode to the text, grammar/schema output valid when it ended STOP,
  `cached_tokens` growing over the turns.
An HTTP call (translated by tests/soak/http_translate.py) shows no ids and coarser finish
reasons: its turns are checked from what it does show (tests/soak/oracle_http.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmserve.client import pb

from tests.soak.oracle_http import HttpFacts, check_http_call, check_http_sample_turn
from tests.soak.plans import Plan

FR = pb.FinishReason
NAMED_SESSION_REFUSALS = (  # FAILED_PRECONDITION reasons a named session may meet
    re.compile(r"session '.*' is open on another stream"),
    re.compile(r"session '.*' is still being saved by the stream that used it; retry"),
    re.compile(r"session '.*' is open on another server that shares --session-dir; retry"),
)
TURN_QUEUED = "a turn is already queued behind the running one"
GRAMMAR_COMPLETE = "the grammar is complete"
NOTHING_ALLOWED = "no token is allowed"
ENDING_STATUS = {"close": "OK", "early_turn": "OK", "cancel_in_band": "OK", "cancel_call": "CANCELLED",
                 "disconnect": "CANCELLED", "deadline": "DEADLINE_EXCEEDED", "extra_end_of_turn": "FAILED_PRECONDITION"}


@dataclass(frozen=True)
class Status:
    """The call's final status; `fields` from its BadRequest, `retry_after_s` from its RetryInfo."""

    code: str
    message: str = ""
    fields: tuple[str, ...] = ()
    retry_after_s: float | None = None


@dataclass(frozen=True)
class RunContext:
    """What the oracle needs to know about the server and the run."""

    eog_ids: frozenset[int]
    n_ctx_per_slot: int
    fills_queue: bool  # as many callers as slots + --max-queue: RESOURCE_EXHAUSTED may happen
    # Request ids of streams the server logged `session_preempted` for: their slot went to a
    # waiting caller between turns, so a later turn may prefill the history again.
    preempted: frozenset[str] = frozenset()
    # Of them, those that were still without a slot when they closed: a named one is saved
    # without its KV, and the next stream on the id prefills the history again.
    closed_preempted: frozenset[str] = frozenset()
    eog_pieces: frozenset[str] = frozenset()  # the end-of-generation tokens' texts (HTTP logprobs show them)


@dataclass
class CallRecord:
    plan: Plan
    responses: list[pb.GenerateResponse]
    status: Status
    acted: bool = False  # the client did what its ending asks (in-band cancel, call cancel, disconnect)
    # (turn, sample) -> Detokenize of its ids, and of all its ids but the last
    decoded: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    t_start: float = 0.0
    t_end: float = 0.0
    http: HttpFacts | None = None  # an HTTP call's: what its reply showed beyond the responses it translates to


@dataclass
class SampleTurn:
    """What one sample of one turn streamed."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    end: pb.TurnEnd | None = None


def sample_turns(responses: list[pb.GenerateResponse], num_samples: int,
                 ids_shown: bool = True) -> tuple[dict[tuple[int, int], SampleTurn], list[str]]:
    """Responses grouped by (turn, sample): a sample's turn is the number of its turn ends before
    (`ids_shown` False: an HTTP call's chunks, logprobs without ids)."""
    turns: dict[tuple[int, int], SampleTurn] = {}
    ends = [0] * num_samples
    problems: list[str] = []
    for r in responses:
        event = r.WhichOneof("event")
        if event not in ("chunk", "turn_end"):
            continue
        index = r.chunk.index if event == "chunk" else r.turn_end.index
        if not 0 <= index < num_samples:
            problems.append(f"a {event} for sample {index} of {num_samples}")
            continue
        st = turns.setdefault((ends[index], index), SampleTurn())
        if event == "chunk":
            st.text += r.chunk.text
            st.ids.extend(r.chunk.token_ids)
            st.logprobs.extend(r.chunk.logprobs)
            if ids_shown and r.chunk.logprobs and len(r.chunk.logprobs) != len(r.chunk.token_ids):
                problems.append(f"turn {ends[index]} sample {index}: a chunk of {len(r.chunk.token_ids)} ids "
                                f"carries {len(r.chunk.logprobs)} logprobs")
        else:
            st.end = r.turn_end
            ends[index] += 1
    return turns, problems


def check_status(rec: CallRecord, ctx: RunContext) -> list[str]:
    plan, st = rec.plan, rec.status
    got = f"{st.code} {st.message!r}"
    refused_late = [f"{got} after {len(rec.responses)} responses"] if rec.responses else []
    if st.code == "RESOURCE_EXHAUSTED":
        if not ctx.fills_queue:
            return [f"{got}: the run was not sized to fill the queue"]
        return refused_late + ([] if st.retry_after_s is not None else [f"{got} without RetryInfo"])
    if plan.adversarial:
        name = plan.refused_field
        problems = list(refused_late)
        if st.code == "INVALID_ARGUMENT":
            if not any(f == name or f.startswith((name + "[", name + ".")) for f in st.fields):
                problems.append(f"{got} names fields {st.fields}, not {name}")
        elif not (st.code == "DEADLINE_EXCEEDED" and plan.ending == "deadline"):
            problems.append(f"{got}, expected INVALID_ARGUMENT naming {name}")
        return problems
    if plan.surface == "http" and st.code == "INVALID_ARGUMENT" and st.message.startswith(NOTHING_ALLOWED) and (
            plan.config.constraint.WhichOneof("kind")):
        return []  # a turn ended ERROR: HTTP answers it as a 400 (streamed: an error event)
    if plan.config.session_id and st.code == "FAILED_PRECONDITION" and any(
            r.search(st.message) for r in NAMED_SESSION_REFUSALS):
        problems = refused_late + ([] if st.retry_after_s is not None else [f"{got} without RetryInfo"])
        return problems + ([] if "config.session_id" in st.fields else [f"{got} names fields {st.fields}"])
    expected = ENDING_STATUS[plan.ending]
    if plan.ending in ("cancel_call", "disconnect") and not rec.acted:
        expected = "OK"  # no chunk came, so the client never cancelled
    if st.code == "OK" and plan.ending == "deadline":
        return []  # the whole call fitted in its deadline
    if st.code != expected:
        return [f"{got}, expected {expected} (ends by {plan.ending})"]
    if expected == "FAILED_PRECONDITION" and not (st.message.startswith(TURN_QUEUED) and "end_of_turn" in st.fields):
        return [f"{got}, expected {TURN_QUEUED!r} on end_of_turn"]
    return []


def check_call(rec: CallRecord, ctx: RunContext) -> list[str]:
    """Every difference between what came back and what the plan predicts."""
    plan = rec.plan
    problems = check_status(rec, ctx)
    turns, parse_problems = sample_turns(rec.responses, plan.num_samples, ids_shown=rec.http is None)
    problems += parse_problems
    ids = {r.request_id for r in rec.responses}
    if len(ids) > 1 or "" in ids:
        problems.append(f"request ids {sorted(ids)}")
    if not plan.config.output.prompt_logprobs and any(r.HasField("prompt_logprobs") for r in rec.responses):
        problems.append("prompt logprobs that were not asked for")
    max_turns = plan.turns + (3 if plan.ending == "extra_end_of_turn" else 0)
    check_turn = check_sample_turn if rec.http is None else check_http_sample_turn
    for (k, i), st in sorted(turns.items()):
        if k >= max_turns:
            problems.append(f"turn {k} sample {i}: more turns than the {plan.turns} sent")
        problems += [f"turn {k} sample {i}: {p}" for p in check_turn(rec, k, i, st, ctx)]
    if rec.http is not None:
        problems += check_http_call(rec, turns)
    if rec.status.code == "OK":
        missing = [(k, i) for k in range(plan.turns) for i in range(plan.num_samples)
                   if (k, i) not in turns or turns[(k, i)].end is None]
        if missing:
            problems.append(f"OK, but no turn end for (turn, sample) {missing}")
    preempted = bool(rec.responses) and rec.responses[0].request_id in ctx.preempted
    problems += check_turn_sequence(plan, turns, ctx, check_cached=not preempted)
    return problems


def check_sample_turn(rec: CallRecord, k: int, i: int, st: SampleTurn, ctx: RunContext) -> list[str]:
    plan, problems = rec.plan, []
    stopping, output = plan.config.stopping, plan.config.output
    n = len(st.ids)
    if n > stopping.max_tokens:
        problems.append(f"{n} tokens, max_tokens {stopping.max_tokens}")
    problems += [f"the stop string {s!r} in the text {st.text!r}" for s in stopping.stop if s in st.text]
    banned = ctx.eog_ids | set(stopping.stop_token_ids)
    early = [t for t in st.ids[: stopping.min_tokens] if t in banned]
    if early:
        problems.append(f"end or stop ids {early} among the first {stopping.min_tokens} (min_tokens)")
    if output.HasField("top_logprobs"):
        if len(st.logprobs) != n or [lp.token_id for lp in st.logprobs] != st.ids:
            problems.append(f"{len(st.logprobs)} logprobs for {n} tokens")
        tops = {len(lp.top) for lp in st.logprobs} - {output.top_logprobs}
        if tops:
            problems.append(f"{sorted(tops)} alternatives, top_logprobs {output.top_logprobs}")
    elif st.logprobs:
        problems.append("logprobs that were not asked for")
    if n and (k, i) not in rec.decoded:
        problems.append("its ids were not detokenized")
    decoded, decoded_but_last = rec.decoded.get((k, i), ("", ""))
    end = st.end
    if end is None:
        if n and not decoded.startswith(st.text):
            problems.append(f"the text {st.text!r} is not how its ids begin {decoded!r}")
        return problems + plan.constraint_problems(st.text, complete=False)
    if end.usage.completion_tokens != n:
        problems.append(f"completion_tokens {end.usage.completion_tokens}, {n} ids streamed")
    problems += check_finish(plan, k, st, decoded, decoded_but_last, rec.acted, ctx)
    return problems


def check_finish(plan: Plan, k: int, st: SampleTurn, decoded: str, decoded_but_last: str, acted: bool,
                 ctx: RunContext) -> list[str]:
    """The turn's finish reason is one the plan can cause, and the text is what it implies."""
    assert st.end is not None
    end, c, n, text = st.end, plan.config, len(st.ids), st.text
    stopping, reason, problems = c.stopping, st.end.finish_reason, []
    constrained = bool(c.constraint.WhichOneof("kind"))
    by_stop_id = reason == FR.FINISH_REASON_STOP_SEQUENCE and end.HasField("matched_stop_token_id")
    expected_text = decoded_but_last if by_stop_id else decoded
    if reason == FR.FINISH_REASON_STOP_SEQUENCE and not by_stop_id:
        if end.matched_stop not in stopping.stop:
            problems.append(f"STOP_SEQUENCE names {end.matched_stop!r}, the plan's stops are {list(stopping.stop)}")
        if not (decoded.startswith(text) and decoded[len(text):].startswith(end.matched_stop)):
            problems.append(f"the text {text!r} and the stop {end.matched_stop!r} are not how {decoded!r} begins")
    elif text != expected_text:
        problems.append(f"the text {text!r}, its ids decode to {expected_text!r}")
    eog_end = bool(st.ids) and st.ids[-1] in ctx.eog_ids and not stopping.ignore_eos
    allowed = {
        FR.FINISH_REASON_STOP: (eog_end and n >= stopping.min_tokens)
        or (constrained and end.message.startswith(GRAMMAR_COMPLETE)),
        FR.FINISH_REASON_LENGTH: n == stopping.max_tokens,
        FR.FINISH_REASON_STOP_SEQUENCE: not by_stop_id or (
            end.matched_stop_token_id in stopping.stop_token_ids and st.ids[-1:] == [end.matched_stop_token_id]
            and n >= stopping.min_tokens),
        FR.FINISH_REASON_CANCELLED: plan.ending == "cancel_in_band" and k == 0 and acted,
        FR.FINISH_REASON_DEADLINE: plan.ending == "deadline",
        FR.FINISH_REASON_CONTEXT_FULL: end.usage.cached_tokens + end.usage.prompt_tokens + n + 1 >= ctx.n_ctx_per_slot,
        FR.FINISH_REASON_ERROR: constrained and end.message.startswith(NOTHING_ALLOWED),
    }
    if not allowed.get(reason, False):
        problems.append(f"finish {FR.Name(reason)} {end.message!r} after {n} tokens {st.ids[-3:]} "
                        f"(usage {end.usage.cached_tokens}+{end.usage.prompt_tokens})")
    return problems + plan.constraint_problems(text, complete=reason == FR.FINISH_REASON_STOP)


def history_floor(plan: Plan, ends: list[pb.TurnEnd]) -> int:
    """At least how many tokens the stream's KV held after these turns (sample 0's turn ends).
    A text turn adds its input and its reply; when `cached_tokens` exceeds the first input
    they were a restored session's history. A chat turn's input is the whole rendered
    conversation, of which the next rendering keeps at least everything but the reply."""
    if plan.chat:
        return ends[-1].usage.prompt_tokens
    first = ends[0].usage
    floor = first.cached_tokens if first.cached_tokens > first.prompt_tokens else 0
    return floor + sum(e.usage.prompt_tokens + e.usage.completion_tokens for e in ends)


def check_turn_sequence(plan: Plan, turns: dict[tuple[int, int], SampleTurn], ctx: RunContext,
                        check_cached: bool = True) -> list[str]:
    """Samples of a turn share its input; each turn starts from the history the last one left
    (unless `check_cached` is False: the stream was preempted)."""
    problems: list[str] = []
    ends: list[pb.TurnEnd] = []
    for k in range(max((t for t, _ in turns), default=-1) + 1):
        first = turns.get((k, 0))
        if first is None or first.end is None:
            break
        usage = first.end.usage
        for i in range(1, plan.num_samples):
            other = turns.get((k, i))
            if other is not None and other.end is not None and (
                    other.end.usage.prompt_tokens, other.end.usage.cached_tokens) != (usage.prompt_tokens, usage.cached_tokens):
                problems.append(f"turn {k}: sample {i}'s usage {other.end.usage} differs from sample 0's {usage}")
        full = any(e.finish_reason == FR.FINISH_REASON_CONTEXT_FULL for e in (*ends[-1:], first.end))
        if ends and not full and check_cached:
            floor = history_floor(plan, ends)
            # A chat reply is rendered again from its text (trimmed), so the KV may reuse none of it.
            # A turn whose whole input was cached and whose reply was one token (never decoded
            # into the KV) leaves nothing new to reuse.
            grew = (plan.chat or usage.cached_tokens > ends[-1].usage.cached_tokens
                    or ends[-1].usage.cached_tokens >= floor - 1)
            if usage.cached_tokens < floor - 1 or not grew:
                problems.append(f"turn {k}: cached_tokens {usage.cached_tokens}, the stream's history before it "
                                f"is at least {floor} (turn {k - 1} cached {ends[-1].usage.cached_tokens})")
        ends.append(first.end)
    return problems
