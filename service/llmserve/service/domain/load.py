"""A replica's load as load balancers read it (ORCA reports, docs/deployment.md), and as
Prometheus shows it.

`utilization` is the load as a fraction of the replica's capacity:

    (running + waiting sessions) / slots  +  seconds of prefill queued / PREFILL_HORIZON_S

* The first term is 1.0 when every slot holds a session; sessions waiting for a slot
  push it past 1.0, as ORCA allows ("larger than 1.0 when the usage exceeds soft
  limits"). A replica that serves calls more slowly holds each longer, so at the same
  call rate it shows more busy slots (Little's law).
* The second term tells two replicas with the same sessions apart when one has long
  prompts to prefill: a new call's first token waits behind them. Seconds come from the
  replica's own measured cost of a prompt token, so a slower node (fewer threads, a
  slower CPU) reports more load for the same tokens. One second of queued prefill
  counts as much as a full set of slots.
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


def replica_load(snapshot: ExecutorSnapshot, num_cells: int) -> ReplicaLoad:
    num_slots = max(len(snapshot.slots), 1)
    running = snapshot.num_sessions - snapshot.num_waiting
    backlog_s = snapshot.num_prefill_tokens_waiting * (snapshot.prompt_token_s or DEFAULT_PROMPT_TOKEN_S)
    return ReplicaLoad(
        running_sessions=running,
        waiting_sessions=snapshot.num_waiting,
        prefill_tokens_waiting=snapshot.num_prefill_tokens_waiting,
        kv_cache_usage=snapshot.num_kv_tokens / num_cells if num_cells else 0.0,
        prefill_backlog_s=backlog_s,
        utilization=snapshot.num_sessions / num_slots + backlog_s / PREFILL_HORIZON_S,
    )
