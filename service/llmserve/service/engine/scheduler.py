"""Step scheduler: decides what one `llama_decode` call contains (pure decisions).

Per generation step: one decode token for every generating sequence first (so
streams never stall behind long prompts), then prompt chunks, round-robin across
prefilling sequences, until `n_batch` tokens. Embedding inputs run in steps of
their own (never mixed with generation in one decode): several inputs packed into
one ubatch, alternating fairly with generation steps when both are waiting.

The executor feeds it `SeqDemand`s and the sizes of the queued embedding inputs;
tests feed it the same from a fake runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SeqDemand:
    """What one session could put in this step."""

    key: int
    decode_token: bool  # a sampled token waits to be decoded
    num_prefill: int  # prompt tokens ready to prefill now


@dataclass(frozen=True)
class StepPlan:
    decode: tuple[int, ...] = ()
    prefill: tuple[tuple[int, int], ...] = ()  # (key, num_tokens)
    num_embed: int = 0  # how many queued embedding inputs (from the front) to run

    @property
    def is_empty(self) -> bool:
        return not (self.decode or self.prefill or self.num_embed)

    @property
    def is_embedding(self) -> bool:
        return self.num_embed > 0

    @property
    def num_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.prefill)


class Scheduler:
    def __init__(self, n_batch: int, n_ubatch: int, max_embed_seqs: int) -> None:
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.max_embed_seqs = max_embed_seqs
        self._last_prefill_key = -1
        self._last_was_embedding = False

    def plan(self, demands: Sequence[SeqDemand], embed_sizes: Sequence[int]) -> StepPlan:
        """Plan one step. `embed_sizes` are the token counts of queued embedding inputs."""
        wants_generation = any(d.decode_token or d.num_prefill for d in demands)
        wants_embedding = bool(embed_sizes)
        if wants_embedding and (not wants_generation or not self._last_was_embedding):
            self._last_was_embedding = True
            return StepPlan(num_embed=self._pack_embeddings(embed_sizes))
        self._last_was_embedding = False
        if not wants_generation:
            return StepPlan()
        return self._plan_generation(demands)

    def _pack_embeddings(self, sizes: Sequence[int]) -> int:
        used = count = 0
        for size in sizes:
            if count == self.max_embed_seqs or used + size > self.n_ubatch:
                break
            used += size
            count += 1
        return max(count, 1)  # inputs are validated to fit one ubatch

    def _plan_generation(self, demands: Sequence[SeqDemand]) -> StepPlan:
        decode = tuple(d.key for d in demands if d.decode_token)
        budget = self.n_batch - len(decode)
        waiting = sorted((d for d in demands if d.num_prefill > 0), key=lambda d: d.key)
        # Round-robin: start after the sequence that started last step.
        start = next((i for i, d in enumerate(waiting) if d.key > self._last_prefill_key), 0)
        prefill: list[tuple[int, int]] = []
        for d in waiting[start:] + waiting[:start]:
            if budget <= 0:
                break
            n = min(d.num_prefill, budget)
            prefill.append((d.key, n))
            budget -= n
        if prefill:
            self._last_prefill_key = prefill[0][0]
        return StepPlan(decode=decode, prefill=tuple(prefill))
