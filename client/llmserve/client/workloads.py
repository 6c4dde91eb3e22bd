"""What a load generator level sends and measures: the prompts, the two plain workloads
(`ROUNDS`, `POOL`), how callers take requests, and a level's result (`loadgen` drives them)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the ocean:",
    "def merge_sort(items):",
    "The three laws of thermodynamics are",
    "Once upon a time in a distant galaxy,",
    "A recipe for banana bread:",
    "The main causes of the French Revolution were",
    "In machine learning, overfitting means",
]
CORPUS = [
    f"Document {i}: the {w} quarterly report describes revenue, costs, hiring plans and the outlook for next year."
    for i, w in enumerate(["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"] * 32)
]


@dataclass
class LevelResult:
    concurrency: int
    wall_s: float = 0.0
    tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    def checked(self) -> LevelResult:
        """This result, or RuntimeError when calls failed: a rate over the calls that were
        left measures a lighter load than the one it is compared with."""
        if self.errors:
            raise RuntimeError(f"{self.errors} calls failed at concurrency {self.concurrency}: no figure from this level")
        return self

    def summary(self) -> dict[str, float]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "ttft_p50_ms": _pct(self.ttft_ms, 0.5),
            "ttft_p99_ms": _pct(self.ttft_ms, 0.99),
            "itl_p50_ms": _pct(self.itl_ms, 0.5),
            "itl_p99_ms": _pct(self.itl_ms, 0.99),
            "errors": float(self.errors),
        }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _prompt(level: int, worker: int, round_: int) -> str:
    """Every request differs at its end, so each one prefills for real on both servers
    (a repeated prompt would be served from a cache and flatter TTFT)."""
    return f"Request {level}.{worker}.{round_}. {PROMPTS[(worker + round_) % len(PROMPTS)]}"


class _Timer:
    """Collects TTFT and inter-token gaps for one request."""

    def __init__(self, result: LevelResult) -> None:
        self.result = result
        self.start = time.perf_counter()
        self.last: float | None = None

    def token(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_ms.append((now - self.start) * 1000)
        else:
            self.result.itl_ms.append((now - self.last) * 1000)
        self.last = now


PromptFn = Callable[[int, int, int], str]  # (level, caller, request) -> prompt


def _pool_prompt(level: int, caller: int, request: int) -> str:
    return f"{PROMPTS[request % len(PROMPTS)]} (#{level}.{request})"


@dataclass(frozen=True)
class Workload:
    """A plain load's shape: the prompt each request sends, how it samples, and whether the
    callers share one list of requests (`pool`) or each sends its own rounds."""

    name: str
    prompt: PromptFn
    temperature: float = 0.0
    top_k: int = 40
    pool: bool = False

    def with_prompt(self, prompt: PromptFn | None) -> Workload:
        return self if prompt is None else dataclasses.replace(self, prompt=prompt)


ROUNDS = Workload("rounds", _prompt)
POOL = Workload("pool", _pool_prompt, temperature=0.8, pool=True)
WORKLOADS = {w.name: w for w in (ROUNDS, POOL)}


async def _run_callers(concurrency: int, rounds: int, pool: bool, send: Callable[[int, int], Awaitable[None]]) -> float:
    """`send(caller, request)` for every request of a level; the level's wall time. Rounds:
    each caller sends requests 0..rounds-1; pool: each takes the next of rounds x concurrency."""
    requests = itertools.count()

    async def caller(c: int) -> None:
        if pool:
            while (i := next(requests)) < rounds * concurrency:
                await send(c, i)
        else:
            for r in range(rounds):
                await send(c, r)

    start = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(concurrency)))
    return time.perf_counter() - start
