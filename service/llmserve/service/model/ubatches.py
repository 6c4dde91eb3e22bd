"""How many ubatches llama.cpp splits one decode's batch into: each is a graph run over
every layer's weights, so a step's cost grows with their number, not only its tokens.

A unified KV cache splits simply: `n_ubatch` tokens each. With one KV stream per slot
llama.cpp uses `split_equal(sequential=true)` (llama-batch.cpp): one ubatch takes a run of
sequences with consecutive ids (in batch order), the same number of tokens from each.
This mirrors it, for the step profile (`step_costs.LlamaCpuCosts.num_ubatches`).
"""

from __future__ import annotations

from collections.abc import Sequence


def num_ubatches(rows: Sequence[tuple[int, int]], n_ubatch: int, per_slot_streams: bool) -> int:
    """`rows`: (sequence id, tokens) in batch order, one row per sequence."""
    total = sum(n for _, n in rows)
    if not per_slot_streams:
        return -(-total // n_ubatch)
    remaining = [[seq, n] for seq, n in rows if n > 0]
    count = 0
    while remaining:
        run = [remaining[0]]
        for row in remaining[1:]:
            if row[0] == run[-1][0] + 1 and len(run) <= n_ubatch:
                run.append(row)
        each = min(min(n for _, n in run), max(n_ubatch // len(run), 1))
        for row in run:
            row[1] -= each
        remaining = [row for row in remaining if row[1] > 0]
        count += 1
    return count
