"""A replica's load as load balancers read it (ORCA reports, docs/deployment.md), and as
Prometheus shows it.

`utilization` is the load as a fraction of what the replica admits (its slots plus
`--max-queue` waiting sessions; past that it refuses calls):

    (sessions + (seconds of prefill queued + seconds until a slot frees) / HORIZON_S x slots)
        / (slots + max_queue)

* Sessions count running and waiting alike. A replica that serves calls more slowly
  holds each longer, so at the same call rate it shows more sessions (Little's law).
* The prefill term tells two replicas with the same sessions apart when one has long
  prompts to prefill: a new call's first token waits behind them. Seconds come from the
  replica's own measured cost of a prompt token, so a slower node (fewer threads, a
  slower CPU) reports more load for the same tokens. One second of queued prefill
  counts as much as a full set of busy slots.
* The slot term says that a new call would wait: with every slot generating, it gets
  the slot that frees first (after the waiting sessions ahead of it), when that turn
  has generated its last token as its limits tell (max_tokens, else the slot's room),
  at the replica's measured step time. Two replicas with all slots busy, one with
  replies about to end and one with long ones, then differ as their callers' first
  tokens will. An upper bound: a reply may stop early (a stop string, end of text).
* Over the admission limit rather than the slots: weighted round robin weights a
  replica by calls per second / utilization, and Envoy truncates that weight to an
  integer. At an LLM's call rates (about 1 call/s per replica) a per-slot utilization
  gave weights of 0 or 1 for every replica, plain round robin (bench.routing); the
  larger denominator keeps the same ratios with room for Envoy's integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .snapshots import ExecutorSnapshot

HORIZON_S = 1.0  # one second of waiting counts as a full set of busy slots
# A prompt token's prefill time until the replica has measured its own (gemma-3-270m,
# 2 threads on the 2-core development machine: 2-3.5 ms).
DEFAULT_PROMPT_TOKEN_S = 0.003


@dataclass(frozen=True)
class ReplicaLoad:
    running_sessions: int
    waiting_sessions: int
    prefill_tokens_waiting: int
    kv_cache_usage: float  # cached tokens / KV cells of all slots
    prefill_backlog_s: float
    slot_wait_s: float  # until a new call would get a slot (0: one is free)
    utilization: float


def replica_load(snapshot: ExecutorSnapshot, num_cells: int, max_queue: int) -> ReplicaLoad:
    num_slots = max(len(snapshot.slots), 1)
    running = snapshot.num_sessions - snapshot.num_waiting
    backlog_s = snapshot.num_prefill_tokens_waiting * (snapshot.prompt_token_s or DEFAULT_PROMPT_TOKEN_S)
    wait_s = slot_wait_s(snapshot)
    sessions = snapshot.num_sessions + (backlog_s + wait_s) / HORIZON_S * num_slots
    return ReplicaLoad(
        running_sessions=running,
        waiting_sessions=snapshot.num_waiting,
        prefill_tokens_waiting=snapshot.num_prefill_tokens_waiting,
        kv_cache_usage=snapshot.num_kv_tokens / num_cells if num_cells else 0.0,
        prefill_backlog_s=backlog_s,
        slot_wait_s=wait_s,
        utilization=sessions / (num_slots + max_queue),
    )


def slot_wait_s(snapshot: ExecutorSnapshot) -> float:
    """Seconds until a call arriving now would get a slot: 0 while a slot is free for it
    (idle, or held by a stream that admission would preempt: idle between turns, or not
    read); else until the k-th turn in progress ends (k: the sessions waiting ahead of it,
    + 1), at most as long as the longest one."""
    left = snapshot.turn_tokens_left
    ahead = snapshot.num_waiting - (len(snapshot.slots) - len(left))
    if ahead < 0 or not left:
        return 0.0
    return left[min(ahead, len(left) - 1)] * snapshot.step_s
