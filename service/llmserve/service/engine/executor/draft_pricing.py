"""What a draft is worth: how many draft rows pay for themselves, priced by the runner's
cost model (`runner_api.StepCosts`). Pure; the scheduler asks (scheduler._grant_drafts)."""

from __future__ import annotations

from ..runner_api import StepCosts


def best_draft_length(costs: StepCosts, odds: float, max_len: int, num_seqs: int = 1) -> int:
    """The draft length k, the same for each of `num_seqs` decoding sequences whose rows
    share one ubatch, that yields the most tokens per unit of step time: a k-th draft
    token lands with probability about odds**k (each after all before it), so a step of
    num_seqs * (1 + k) rows yields num_seqs * (1 + odds + ... + odds**k) tokens. 0: no
    draft beats the decode rows alone."""
    q = min(max(odds, 0.0), 0.999)
    best, best_rate, expected = 0, 1.0 / costs.step_cost(num_seqs), 1.0
    for k in range(1, max_len + 1):
        expected += q**k
        rate = expected / costs.step_cost(num_seqs * (1 + k))
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def worth_drafting(costs: StepCosts, acceptance: float, num_decoding: int, max_rows: int, extra_ubatch: bool) -> int:
    """How many draft rows pay for themselves (0: none), by the linear view of a step's cost:
    a step of c decode rows costs base_rows + c and yields c tokens, so an accepted token is
    worth (base_rows + c) / c rows; the k-th draft row lands with probability about
    acceptance**k (the per-token odds; the accepted share undercounts them, so with it
    this errs short) and costs one row, and with `extra_ubatch` (per-slot streams and
    others decoding: the drafting sequence's rows become a ubatch of their own) the draft
    costs another base_rows. The k with the largest expected gain, if positive."""
    base = costs.base_rows
    worth = (base + num_decoding) / num_decoding
    q = min(max(acceptance, 0.0), 0.999)
    best, best_gain, expected = 0, 0.0, 0.0
    for k in range(1, max_rows + 1):
        expected += q**k
        gain = expected * worth - k - (base if extra_ubatch else 0.0)
        if gain > best_gain:
            best, best_gain = k, gain
    return best
