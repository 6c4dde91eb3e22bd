"""Which LoRA adapter set the next generation step runs (executor thread only).

llama.cpp applies adapters to a whole context (`llama_set_adapters_lora`), so one decode
runs under one adapter set, and sessions under different sets take turns: round robin, one
step each, over the sets that have work, in a fixed order (sorted by set, the base first).
A set with work so waits at most (number of sets - 1) steps: none starves, and a set's
gap between tokens is about (sets) x (step + switch), whatever their loads.

A switch costs a graph reservation inside llama.cpp on the next decode (measured: 4.5 ms
at 4 slots, 8 ms at 16, beside 13-31 ms steps; docs/adapters.md). Longer turns would
spend less on switching but stretch every other set's gap by whole steps; one step per
turn keeps the gap bound tightest (measured in docs/benchmarks.md, "LoRA adapters"). With
one set (no adapters in use, the usual case) nothing switches and nothing is filtered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...domain.requests import AdapterSet
from .scheduler import SeqDemand


@dataclass
class AdapterRotation:
    """The set the last generation step ran; `choose` reads it, `record` is its one writer."""

    current: AdapterSet = ()

    def choose(self, demands: Sequence[SeqDemand]) -> tuple[AdapterSet, list[SeqDemand]]:
        """The set the next step runs (the next after the current one, in order, that has
        work) and the demands of its sessions (reads only)."""
        sets = sorted({d.adapters for d in demands if d.decode_token or d.num_prefill})
        if len(sets) <= 1:
            return (sets[0] if sets else self.current), list(demands)
        chosen = next((s for s in sets if s > self.current), sets[0])
        return chosen, [d for d in demands if d.adapters == chosen]

    def record(self, adapters: AdapterSet) -> None:
        """A generation step ran under `adapters`."""
        self.current = adapters
