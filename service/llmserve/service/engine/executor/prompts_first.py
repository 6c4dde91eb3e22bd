"""Prompts first: a step that finishes prompts may leave its decode rows to the next step.

With one KV stream per slot llama.cpp splits a batch into ubatches of consecutive sequence
ids with equal tokens each (`StepCosts.num_ubatches`), and every ubatch is a pass over every
weight. Decode rows are one token each, so beside prompt chunks they cost a ubatch of their
own (or cut the adjacent prompts' first tokens into one): a burst of three 20-token prompts
beside one decode row is four ubatches, without it three. The decode rows' next token then
comes after this shorter step and the next one (where they run beside the new samples' first
decode rows, usually one ubatch) instead of after this longer step: about the same time, and
the prompts' first tokens come a ubatch sooner. Never twice in a row, and only when the step
finishes every prompt that is waiting: a prompt left for the next step would make that step
long too, and the held rows would wait for both (a long prompt's last chunk while another
arrives, as in the mixed load). Ubatches are counted on the rows as the step will run them:
the prompts whose slots hold none of their history seated by length
(`GenerationStep.seat_by_length`), the rest in their slots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..runner_api import StepCosts

# Only a step of at most this many ubatches leaves its decode rows: in a larger burst the one
# saved is a small share of the step, and the held streams fall in step with the burst, so
# their callers' next requests arrive as one larger burst too (measured on the pool workload
# at 16 callers: slower first tokens when any step could, none at this bound).
MAX_STEP_UBATCHES = 5


def decode_rows_wait(
    slots: Mapping[int, tuple[int, int, bool]], decode: Sequence[int], drafts: Sequence[tuple[int, int]],
    prefill: Sequence[tuple[int, int]], costs: StepCosts, n_ubatch: int,
) -> bool:
    """True when the step's prompt chunks (`prefill`: key, tokens; every waiting prompt's last)
    run in fewer ubatches without the decode and draft rows than with them, in a step of at
    most `MAX_STEP_UBATCHES`. `slots`: key -> (sequence id, prompt tokens ready, whether
    `seat_by_length` may trade its slot) of every session the step could serve."""
    if not decode or not prefill:
        return False
    chunks = dict(prefill)
    if any(ready > chunks.get(key, 0) for key, (_, ready, _) in slots.items()):
        return False  # a prompt goes on, or waits, next step: the held rows would wait beside it too
    granted = dict(drafts)
    prompt_rows = seated([(slots[key][0], slots[key][2], num_tokens) for key, num_tokens in prefill])
    decode_rows = [(slots[key][0], 1 + granted.get(key, 0)) for key in decode]
    num_with = costs.num_ubatches(sorted(decode_rows + prompt_rows), n_ubatch, True)
    return num_with <= MAX_STEP_UBATCHES and costs.num_ubatches(sorted(prompt_rows), n_ubatch, True) < num_with


def seated(prompt_rows: Sequence[tuple[int, bool, int]]) -> list[tuple[int, int]]:
    """(sequence id, tokens) of prompt chunks (sequence id, may trade its slot, tokens) as
    `GenerationStep.seat_by_length` leaves them: the tradable ones' slots go longest chunk
    first to the lowest id (a step runs under one adapter set, step_rotation.py: one group)."""
    ids = sorted(seq_id for seq_id, tradable, _ in prompt_rows if tradable)
    lengths = sorted((n for _, tradable, n in prompt_rows if tradable), reverse=True)
    return [(seq_id, n) for seq_id, tradable, n in prompt_rows if not tradable] + list(zip(ids, lengths))
