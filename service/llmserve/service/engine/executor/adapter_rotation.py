"""Which LoRA adapter set the next generation step runs (executor thread only).

llama.cpp applies adapters to a whole context (`llama_set_adapters_lora`), so one decode
runs under one adapter set, and sessions under different sets take turns. The policy:
round robin over the sets that have work, in a fixed order (sorted by set, the base
first), each keeping the step for up to `quantum` consecutive steps while it has work.
A set with work so waits at most (number of sets - 1) x quantum steps: none starves, and
a set's longest gap grows with the number of sets, not with their load.

A switch costs something: llama.cpp reserves its compute graphs again on the next decode
after the set changes. The rotation measures it as it runs (the extra time of a step
right after a switch over the moving average of steps without one) and takes the
fewest steps per turn that keep switches within MAX_SWITCH_SHARE of a set's time:
quantum = ceil(switch / (MAX_SWITCH_SHARE x step)), at most MAX_QUANTUM. With one set
(no adapters in use, the usual case) nothing switches and nothing is filtered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...domain.requests import AdapterSet
from .scheduler import SeqDemand

MAX_SWITCH_SHARE = 0.25  # of a set's turn, at most this much goes to switching into it
MAX_QUANTUM = 4  # steps per turn at most: a set's gap stays within (sets - 1) x 4 steps
_EMA_WEIGHT = 0.2


@dataclass
class AdapterRotation:
    """The set now in the context and how long it has had the steps; `choose` reads it,
    `record` (after each generation step) is its one writer."""

    current: AdapterSet = ()
    steps_on_current: int = 0
    step_s: float | None = None  # a step without a switch, moving average
    switch_s: float = 0.0  # what a switch adds to the step after it, moving average
    num_switches: int = 0

    @property
    def quantum(self) -> int:
        if not self.step_s or self.switch_s <= 0.0:
            return 1
        return max(1, min(MAX_QUANTUM, math.ceil(self.switch_s / (MAX_SWITCH_SHARE * self.step_s))))

    def choose(self, demands: Sequence[SeqDemand]) -> tuple[AdapterSet, list[SeqDemand]]:
        """The set the next step runs and the demands of its sessions (reads only)."""
        sets = sorted({d.adapters for d in demands if d.decode_token or d.num_prefill})
        if len(sets) <= 1:
            return (sets[0] if sets else self.current), list(demands)
        if self.current in sets and self.steps_on_current < self.quantum:
            chosen = self.current
        else:
            chosen = next((s for s in sets if s > self.current), sets[0])
        return chosen, [d for d in demands if d.adapters == chosen]

    def record(self, adapters: AdapterSet, elapsed_s: float) -> None:
        """A generation step ran under `adapters` in `elapsed_s`."""
        if adapters == self.current:
            self.steps_on_current += 1
            self.step_s = _ema(self.step_s, elapsed_s)
            return
        if self.step_s is not None:
            self.switch_s = _ema(self.switch_s if self.num_switches else None, max(elapsed_s - self.step_s, 0.0))
        self.current, self.steps_on_current = adapters, 1
        self.num_switches += 1


def _ema(current: float | None, value: float) -> float:
    return value if current is None else (1 - _EMA_WEIGHT) * current + _EMA_WEIGHT * value
