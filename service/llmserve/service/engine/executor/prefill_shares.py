"""How a step's prompt budget is shared among the waiting prompts (executor thread).

`share_prefill` grants each waiting prompt its chunk; with one KV stream per slot
`equal_chunks` then trims the chunks so that their lengths do not multiply the step's
ubatches. `fair_shares` splits a budget in order (the drafts' rows). `SeqDemand` is what the
scheduler plans from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...domain.requests import AdapterSet
from ..runner_api import StepCosts


@dataclass(frozen=True)
class SeqDemand:
    """What one session could put in this step."""

    key: int
    decode_token: bool  # a sampled token waits to be decoded
    num_prefill: int  # prompt tokens ready to prefill now
    num_draft: int = 0  # draft tokens it would verify after its decode token
    seq_id: int = -1  # its slot's sequence id
    window_at_risk: bool = False  # long enough that a split draft could cost a sliding-window cell
    draft_acceptance: float = 0.5  # the accepted share of its drafts lately (SeqSpeculation.acceptance)
    draft_odds: float = 0.5  # its per-token draft odds lately (SeqSpeculation.odds)
    adapters: AdapterSet = ()  # the LoRA adapters it decodes under: one decode runs one set (StepRotation)
    alone: bool = False  # deterministic: its rows share no decode (canonical_chunks.py, StepRotation)


def share_prefill(waiting: list[SeqDemand], since: Mapping[int, int], budget: int,
                   max_prompts: int | None = None) -> list[tuple[int, int]]:
    """The oldest waiting prompt (`since`: the plan each showed up in) gets at least an equal
    share; the rest of the budget goes shortest-remaining first (ties: the older first), to
    `max_prompts` at most."""
    if not waiting or budget <= 0:
        return []
    oldest = min(waiting, key=lambda d: (since[d.key], d.key))
    granted = {oldest.key: min(oldest.num_prefill, max(budget // len(waiting), 1))}
    left = budget - granted[oldest.key]
    for d in sorted(waiting, key=lambda d: (d.num_prefill - granted.get(d.key, 0), since[d.key], d.key)):
        extra = min(d.num_prefill - granted.get(d.key, 0), left)
        if extra > 0 and (d.key in granted or max_prompts is None or len(granted) < max_prompts):
            granted[d.key] = granted.get(d.key, 0) + extra
            left -= extra
    return list(granted.items())


def equal_chunks(prefill: list[tuple[int, int]], demands: Sequence[SeqDemand], drafts: Mapping[int, int],
                 costs: StepCosts, n_ubatch: int) -> list[tuple[int, int]]:
    """`prefill`'s chunks, trimmed to one common length when that brings the prompts their
    first token sooner on average. With one KV stream per slot llama.cpp splits a batch into
    ubatches of equal tokens per sequence (`StepCosts.ubatch_sizes`), each a graph run over
    every weight: four prompts of 17 to 20 tokens prefilled together take four runs, three
    of them for one to three tokens; trimmed to 17 they take one, and the prompt tails ride
    the next steps beside the first decode rows. Each candidate length is priced by the
    runner's step costs: the prompts it completes get their first token after this step,
    the rest are taken to end in the next (a decode row for each completed one, the
    tails as they split). Ties keep the longer chunks; no trim takes more than half the
    step's prompt tokens (the oldest prompt's share, `share_prefill`, keeps moving)."""
    by_key = {d.key: d for d in demands}
    decode_rows = [(d.seq_id, 1 + drafts.get(d.key, 0)) for d in demands if d.decode_token]

    def priced(chunks: list[tuple[int, int]], num_new_decoding: int) -> float:
        rows = sorted(decode_rows + chunks)  # with per-slot streams rows go in sequence-id order
        num_logits = sum(n for _, n in decode_rows) + num_new_decoding  # decode and draft rows: logits on each
        chunk_cost = sum(costs.prefill_cost(n) for n in costs.ubatch_sizes(rows, n_ubatch, True))
        return chunk_cost + (costs.step_cost(num_logits) - costs.prefill_cost(num_logits) if num_logits else 0.0)

    def mean_first_token(length: int) -> float:
        now = [(key, min(n, length)) for key, n in prefill]
        this_step = priced([(by_key[key].seq_id, n) for key, n in now], 0)
        ended = [by_key[key].seq_id for key, n in now if n == by_key[key].num_prefill]
        rest = [(by_key[key].seq_id, by_key[key].num_prefill - n) for key, n in now if n < by_key[key].num_prefill]
        if not rest:
            return this_step
        next_step = priced(rest + [(seq, 1) for seq in ended], len(ended))
        return this_step + next_step * len(rest) / len(now)

    total = sum(n for _, n in prefill)  # trimmed by half at most: a long prompt keeps going beside short ones
    lengths = [k for k in sorted({n for _, n in prefill}, reverse=True) if 2 * sum(min(n, k) for _, n in prefill) >= total]
    best = min(lengths, key=mean_first_token)
    return [(key, min(n, best)) for key, n in prefill]


def fair_shares(wants: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """Split `budget` across (key, wanted) in order: equal shares, what one leaves goes to the
    next, the first in order gets the rounding."""
    shares: list[tuple[int, int]] = []
    for i, (key, wanted) in enumerate(wants):
        if budget <= 0:
            break
        left = len(wants) - i
        n = min(wanted, max(budget // left, 1) if i else max(budget - (budget // left) * (left - 1), 1))
        shares.append((key, n))
        budget -= n
    return shares
