"""The chaos run's checks of the server's side (tests/soak/chaos.py), beyond each call's status.

- A call the client cancelled or dropped mid-turn must end on the server: its turn logged
  `turn_end` with finish reason CANCELLED under the call's request id (a call cancelled
  before its first token may have been waiting for a slot: no turn, or a CANCELLED one), and
  the metrics count at least those turns and RPCs as CANCELLED. Its slot coming back is what
  `wait_until_idle` sees after the run (the calls overlap, so no one slot is theirs alone).
- Valid calls are served: each kind that can succeed has a success, and a refusal
  (RESOURCE_EXHAUSTED) while the client had no more calls in flight than the server admits
  (slots + --max-queue) is rare: the bursts overfill the server on purpose, and what they
  cause is the server's right; a refusal with room is not (a cancelled call's slot may come
  back a moment after its client counts it gone, hence a small allowance).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OK = "OK"
REFUSED = "RESOURCE_EXHAUSTED"
MAX_REFUSED = 0.01  # of the Generate calls, refused while the server had room
# Kinds that must end OK at least once (the commonest). No share of them can be asked: the mix
# overfills the server on purpose, and on a loaded machine a refusal (instant) is far more common
# than an answer (seen: 4 of 56 turns, 1 of 16 multi-turn streams OK on a 2-core machine at load 10).
MUST_SUCCEED = ("turn", "embed")
NOT_ADMITTED = frozenset({"embed", "embed_oversize"})  # Embed answers; a hostile Generate is admitted, then refused


@dataclass(frozen=True)
class Outcome:
    kind: str
    status: str


@dataclass(frozen=True)
class CancelledCall:
    """A call the client cancelled (or whose connection it closed) after reading `responses_read`."""

    kind: str
    request_id: str
    responses_read: int


@dataclass(frozen=True)
class ChaosRun:
    outcomes: Counter[Outcome]
    cancelled: list[CancelledCall]  # the calls the client cancelled or dropped, for the server's side
    refused_with_room: list[str]  # kinds of the calls refused while no more calls than it admits were in flight


@dataclass(frozen=True)
class CancelCounts:
    """The server's CANCELLED counters, read before and after a run."""

    turns: float  # llmserve_turns_total{finish_reason="CANCELLED"}
    rpcs: float  # llmserve_requests_total{rpc="Generate", code="CANCELLED"}


def cancel_counts(port: int) -> CancelCounts:
    from harness.metrics import counted

    return CancelCounts(counted(port, "llmserve_turns_total", finish_reason="CANCELLED"),
                        counted(port, "llmserve_requests_total", rpc="Generate", code="CANCELLED"))


def cancel_findings(cancelled: list[CancelledCall], log_lines: list[dict[str, Any]], before: CancelCounts,
                    after: CancelCounts) -> list[str]:
    """Each cancelled call's turn ended CANCELLED on the server, and its metrics counted them."""
    ends: dict[str, list[str]] = {}
    for line in log_lines:
        if line.get("event") == "turn_end" and line.get("request_id"):
            ends.setdefault(line["request_id"], []).append(str(line.get("finish_reason")))
    problems = []
    for call in cancelled:
        got = ends.get(call.request_id, [])
        if got and set(got) != {"CANCELLED"}:
            problems.append(f"{call.kind} {call.request_id}: cancelled by its client, its turn ended {got}")
        elif not got and call.responses_read:
            problems.append(f"{call.kind} {call.request_id}: cancelled after {call.responses_read} responses, "
                            "and the server logged no turn end")
    started = sum(c.responses_read > 0 for c in cancelled)
    if after.turns - before.turns < started:
        problems.append(f"{started} turns cancelled mid-turn, the metrics counted {after.turns - before.turns:.0f} "
                        "turns CANCELLED")
    if after.rpcs - before.rpcs < started:
        problems.append(f"{started} calls cancelled mid-turn, the metrics counted {after.rpcs - before.rpcs:.0f} "
                        "Generate RPCs CANCELLED")
    return problems


def service_findings(outcomes: Counter[Outcome], refused_with_room: list[str]) -> list[str]:
    """A server that refuses (or fails) the valid calls must not pass: successes where the kind
    can succeed, and at most MAX_REFUSED of the Generate calls refused with room."""
    problems = []
    for kind in MUST_SUCCEED:
        calls = sum(n for o, n in outcomes.items() if o.kind == kind)
        if calls and not outcomes.get(Outcome(kind, OK)):
            problems.append(f"{kind}: none of {calls} calls OK")
    calls = sum(n for o, n in outcomes.items() if o.kind not in NOT_ADMITTED)
    if len(refused_with_room) > MAX_REFUSED * calls:
        problems.append(f"{len(refused_with_room)} of {calls} Generate calls were {REFUSED} with room "
                        f"(no more calls in flight than the server admits; at most {MAX_REFUSED:.0%}): "
                        f"{dict(Counter(refused_with_room))}")
    return problems


def server_findings(run: ChaosRun, log_path: Path, metrics_port: int, before: CancelCounts) -> list[str]:
    """After `wait_until_idle`: the cancels as the server saw them, and the valid calls served.
    `before`: `cancel_counts(metrics_port)` read before the run."""
    from harness.server import server_log_lines

    after = cancel_counts(metrics_port)
    return (cancel_findings(run.cancelled, server_log_lines(log_path), before, after)
            + service_findings(run.outcomes, run.refused_with_room))
