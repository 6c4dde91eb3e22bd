"""A replica's load as load balancers read it (ORCA reports, docs/deployment.md), and as
Prometheus shows it.

`utilization` is the load as a fraction of what the replica admits (its slots plus
`--max-queue` waiting sessions; past that it refuses calls):

    (sessions + seconds of prefill queued / PREFILL_HORIZON_S x slots) / (slots + max_queue)

* Sessions count running and waiting alike. A replica that serves calls more slowly
  holds each longer, so at the same call rate it shows more sessions (Little's law).
* The prefill term tells two replicas with the same sessions apart when one has long
  prompts to prefill: a new call's first token waits behind them. Seconds come from the
  replica's own measured cost of a prompt token, so a slower node (fewer threads, a
  slower CPU) reports more load for the same tokens. One second of queued prefill
  counts as much as a full set of busy slots.
* Over the admission limit rather than the slots: weighted round robin weights a
  replica by calls per second / utilization, and Envoy truncates that weight to an
  integer. At an LLM's call rates (about 1 call/s per replica) a per-slot utilization
  gave weights of 0 or 1 for every replica, plain round robin (bench.routing); the
  larger denominator keeps the same ratios with room for Envoy's integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .snapshots import ExecutorSnapshot

PREFILL_HORIZON_S = 1.0
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
    utilization: float


def replica_load(snapshot: ExecutorSnapshot, num_cells: int, max_queue: int) -> ReplicaLoad:
    num_slots = max(len(snapshot.slots), 1)
    running = snapshot.num_sessions - snapshot.num_waiting
    backlog_s = snapshot.num_prefill_tokens_waiting * (snapshot.prompt_token_s or DEFAULT_PROMPT_TOKEN_S)
    sessions = snapshot.num_sessions + backlog_s / PREFILL_HORIZON_S * num_slots
    return ReplicaLoad(
        running_sessions=running,
        waiting_sessions=snapshot.num_waiting,
        prefill_tokens_waiting=snapshot.num_prefill_tokens_waiting,
        kv_cache_usage=snapshot.num_kv_tokens / num_cells if num_cells else 0.0,
        prefill_backlog_s=backlog_s,
        utilization=sessions / (num_slots + max_queue),
    )
