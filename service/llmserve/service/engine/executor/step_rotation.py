"""Which sessions the next generation step runs (executor thread only).

Two things keep sessions out of one decode. llama.cpp applies LoRA adapters to a whole
context (`llama_set_adapters_lora`), so one decode runs under one adapter set; and a
deterministic session decodes alone (canonical_chunks.py). The demands so fall into groups:
one per adapter set for the sessions that share decodes, one per deterministic session.
The groups take turns: round robin, one step each, over those with work, in a fixed order
(sorted by key: the base set first, the shared group before the lone ones). A group with
work waits at most (groups - 1) steps: none starves, and a group's gap between tokens is
about (groups) x (step + switch), whatever their loads.

While groups take turns a stream's gap between tokens spans one step of every group, so
the turn says how many groups share the steps and whether others decode: a group's prompt
chunks are then paced even when none of its own sessions decode (else one adapter's prompt,
prefilled whole, would stall every other group's streams), the pacer's gap bound split over
the groups (`PrefillPacer.budget`).

An adapter switch costs a graph reservation inside llama.cpp on the next decode (measured:
4.5 ms at 4 slots, 8 ms at 16, beside 13-31 ms steps; docs/adapters.md). Longer turns
would spend less on switching but stretch every other group's gap by whole steps; one step
per turn keeps the gap bound tightest (measured in docs/benchmarks.md, "LoRA adapters").
With one group (no adapters in use, no deterministic session: the usual case) nothing
switches and nothing is filtered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...domain.requests import AdapterSet
from .scheduler import SeqDemand

GroupKey = tuple[AdapterSet, int]  # (adapter set, the session's key if it decodes alone, else -1)


def group_of(demand: SeqDemand) -> GroupKey:
    return demand.adapters, demand.key if demand.alone else -1


@dataclass(frozen=True)
class GroupTurn:
    """The group the next generation step runs and what its step may hold."""

    group: GroupKey
    demands: list[SeqDemand]  # the group's (all demands when only one group has work)
    num_groups: int = 1  # groups with work, taking turns
    others_decode: bool = False  # another group's sessions wait to decode: pace this group's prompts


@dataclass
class StepRotation:
    """The group the last generation step ran; `choose` reads it, `record` is its one writer."""

    current: GroupKey = ((), -1)

    def choose(self, demands: Sequence[SeqDemand]) -> GroupTurn:
        """The group the next step runs (the next after the current one, in order, that has
        work) and its demands (reads only)."""
        groups = sorted({group_of(d) for d in demands if d.decode_token or d.num_prefill})
        if len(groups) <= 1:
            return GroupTurn(groups[0] if groups else self.current, list(demands))
        chosen = next((g for g in groups if g > self.current), groups[0])
        mine = [d for d in demands if group_of(d) == chosen]
        # A lone session's prompt goes in its canonical chunks (one ubatch each), never paced.
        others_decode = chosen[1] == -1 and any(d.decode_token for d in demands if group_of(d) != chosen)
        return GroupTurn(chosen, mine, len(groups), others_decode)

    def record(self, group: GroupKey) -> None:
        """A generation step ran `group`."""
        self.current = group
