"""The combination fuzzer's oracle over a whole run (pure, like tests/soak/oracle.py).

Beyond each call's own checks (`oracle.check_call`), a run must show that:
- refusals stay rare: over 5% of valid calls RESOURCE_EXHAUSTED fails the run;
- a named session's next stream continues from the history the last one saved:
  its first turn's `cached_tokens` >= that history - 1, checked wherever the calls'
  times prove which stream saved last (the one before it ended OK and no other
  stream on the id could have held it in between);
- an in-band cancel takes effect somewhere (a server that ignores cancels would
  otherwise pass, every turn ending by its length);
- the server's log has no error-level line and no `session_save_failed`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from llmserve.client import pb

from tests.soak.oracle import NAMED_SESSION_REFUSALS, CallRecord, RunContext, check_call, history_floor, sample_turns

MAX_REFUSED = 0.05  # of valid calls, RESOURCE_EXHAUSTED
BAD_EVENTS = ("session_save_failed", "rpc_internal_error", "executor_step_failed", "executor_died")


@dataclass(frozen=True)
class Finding:
    """A difference from the prediction; `index` is the plan's (None: the run's)."""

    index: int | None
    text: str
    request_id: str = ""


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (plan label, status) -> calls
    failed: Counter[str] = field(default_factory=Counter)  # plan label -> calls with findings
    num_valid: int = 0
    num_refused: int = 0
    sessions_checked: int = 0
    sessions_unknown: int = 0
    sessions_recomputed: int = 0  # text sessions whose stream before closed preempted: nothing to check
    cancels_sent: int = 0
    cancels_effective: int = 0
    num_preempted: int = 0  # calls whose stream the server preempted (cached_tokens not checked over turns)


def check_run(records: list[CallRecord], ctx: RunContext) -> Verdict:
    v = Verdict()
    for rec in records:
        v.statuses[(rec.plan.label, rec.status.code)] += 1
        problems = check_call(rec, ctx)
        rid = rec.responses[0].request_id if rec.responses else ""
        v.num_preempted += rid in ctx.preempted
        v.findings += [Finding(rec.plan.index, p, rid) for p in problems]
        if not rec.plan.adversarial:
            v.num_valid += 1
            v.num_refused += rec.status.code == "RESOURCE_EXHAUSTED"
        if rec.plan.ending == "cancel_in_band" and rec.acted and not rec.plan.adversarial:
            v.cancels_sent += 1
            v.cancels_effective += any(r.turn_end.finish_reason == pb.FINISH_REASON_CANCELLED
                                       for r in rec.responses if r.HasField("turn_end"))
    if v.num_refused > MAX_REFUSED * v.num_valid:
        v.findings.append(Finding(None, f"{v.num_refused} of {v.num_valid} valid calls were RESOURCE_EXHAUSTED "
                                        f"(at most {MAX_REFUSED:.0%})"))
    if v.cancels_sent >= 5 and v.cancels_effective == 0:
        v.findings.append(Finding(None, f"{v.cancels_sent} in-band cancels were sent and no turn ended CANCELLED"))
    check_named_sessions(records, v, ctx)
    labels = {rec.plan.index: rec.plan.label for rec in records}
    v.failed.update(labels[i] for i in {f.index for f in v.findings if f.index is not None})
    return v


def held(rec: CallRecord) -> bool | None:
    """Whether the call held its named session: False when refused before claiming it,
    None when it cannot be known (it ended early with nothing read)."""
    st = rec.status
    if st.code == "OK" or rec.responses:
        return True
    if st.code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"):
        return False  # admission and validation come before the claim
    if st.code == "FAILED_PRECONDITION" and any(r.search(st.message) for r in NAMED_SESSION_REFUSALS):
        return False
    return None


def first_ends(rec: CallRecord) -> list[pb.TurnEnd]:
    turns, _ = sample_turns(rec.responses, rec.plan.num_samples)
    ends = []
    for k in range(rec.plan.turns):
        st = turns.get((k, 0))
        if st is None or st.end is None:
            break
        ends.append(st.end)
    return ends


def check_named_sessions(records: list[CallRecord], v: Verdict, ctx: RunContext) -> None:
    by_id: dict[str, list[CallRecord]] = {}
    for rec in records:
        if rec.plan.config.session_id:
            by_id.setdefault(rec.plan.config.session_id, []).append(rec)
    for calls in by_id.values():
        for s in calls:
            ends = first_ends(s)
            if not ends:
                continue
            before = [p for p in calls if p is not s and p.t_end < s.t_start and held(p) is not False]
            if not before:
                continue  # the first stream on the id (or only refused ones before it)
            p = max(before, key=lambda r: r.t_end)
            others = [r for r in calls if r is not p and r is not s and r.t_start < s.t_start and r.t_end > p.t_start]
            p_ends = first_ends(p)
            if p.status.code != "OK" or len(p_ends) != p.plan.turns or any(held(r) is not False for r in others):
                v.sessions_unknown += 1
                continue
            if p.responses[0].request_id in ctx.closed_preempted:  # saved without KV: prefilled again
                if not s.plan.chat:
                    v.sessions_recomputed += 1  # the history is in the prompt, which usage does not show
                    continue
                v.sessions_checked += 1
                if ends[0].usage.prompt_tokens < p_ends[-1].usage.prompt_tokens:
                    v.findings.append(Finding(s.plan.index, (
                        f"named session {s.plan.config.session_id!r}: the first rendering has "
                        f"{ends[0].usage.prompt_tokens} tokens, the conversation before it (plan {p.plan.index}, "
                        f"request id {p.responses[0].request_id}) had {p_ends[-1].usage.prompt_tokens}"),
                        s.responses[0].request_id))
                continue
            v.sessions_checked += 1
            floor = history_floor(p.plan, p_ends)
            cached = ends[0].usage.cached_tokens
            if cached < floor - 1:
                v.findings.append(Finding(s.plan.index, (
                    f"named session {s.plan.config.session_id!r}: the first turn cached {cached} tokens, the stream "
                    f"before it (plan {p.plan.index}, request id {p.responses[0].request_id}, ended OK) left at least "
                    f"{floor}"), s.responses[0].request_id))


def _entries(text: str) -> list[dict]:  # type: ignore[type-arg]
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def preempted_requests(log_text: str, at_close: bool = False) -> frozenset[str]:
    """Request ids of the streams the server preempted (`session_preempted` in its log);
    `at_close`: only those whose last preemption no `session_resumed` followed."""
    slotless: dict[str, bool] = {}
    for e in _entries(log_text):
        if e.get("event") in ("session_preempted", "session_resumed"):
            slotless[e.get("request_id", "")] = e["event"] == "session_preempted"
    return frozenset(rid for rid, last in slotless.items() if last or not at_close)


def log_problems(text: str) -> list[str]:
    """Error-level lines, failed saves and tracebacks in the server's log (JSON lines)."""
    problems = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if "Traceback" in line or "error" in line.lower():
                problems.append(line[:300])
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("level") in ("error", "critical", "exception") or entry.get("event") in BAD_EVENTS:
            problems.append(line[:300])
    return problems
