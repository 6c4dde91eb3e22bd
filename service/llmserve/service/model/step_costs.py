"""What a decode step costs llama.cpp on the CPU by its rows and ubatches: the cost model
`LlamaRunner.costs` gives the engine (`runner_api.StepCosts`). The server measures it at
start-up on the machine it runs on (`MeasuredCosts`, from `step_timing.py`, cached per
model, CPU and threads); `REPACK_SHAPE` below is the fallback (`--step-costs builtin`) and
the unit tests' model: the shape llama.cpp's repack kernels give a step, whose numbers were
read on one 2-core machine for gemma-3-270m Q4_K_M.

llama.cpp's CPU kernels for repacked weights (`ggml-cpu/repack.cpp`: the Q4_K and Q4_0
tensors of a Q4_K_M model on x86 and ARM) multiply a ubatch's rows four at a time (a
gemm) and each row left over on its own (a gemv, one more pass over the weights). So a
step's time is not linear in its rows but steps up at every row past a multiple of four:
`llama-batched-bench -npp 16 -ntg 32 -t 2` (gemma-3-270m Q4_K_M, this 2-core machine,
2026-12-03, ms per step) 1 row 12-18, 2: 24-28, 3: 31-34, 4: 33-36, 5: 46-56, 6: 52-64,
7: 59-67, 8: 50-67, 12: 56-75, 16: 73-86, 17: 106-121, 24: 115-123, 32: 148-182. Eight
rows cost less than six; a draft of 3 tokens on a lone stream costs what one of 2 does,
and one of 4 half as much again. `step_cost` is that shape in units of a one-row step;
the ratios, not the absolute times, decide a draft, so a sequence's drafts stay
independent of the machine's speed and of other calls; but another CPU (another vector
width, core count or cache) has other ratios, hence the measuring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .ubatches import num_ubatches

SMALL_STEPS = (1.0, 2.1, 2.6)  # 1-3 rows: a gemv each
FIRST_GROUP = 2.7  # four rows: one gemm over every weight
NEXT_GROUP = 1.3  # each further four rows
LEFTOVER = (0.0, 1.35, 1.9, 2.2)  # rows past a multiple of four: gemvs
# The linear view: a decode step costs about STEP_BASE_ROWS rows' worth plus one per row
# (gemma-3-270m, 2 threads: ~14 ms + ~6.8 ms per row, llama-batched-bench S_TG at 1/8/16 streams).
STEP_BASE_ROWS = 2.0


def step_cost(num_rows: int) -> float:
    """A one-ubatch step of `num_rows` rows, in one-row steps."""
    if num_rows < 4:
        return SMALL_STEPS[max(num_rows, 1) - 1]
    groups, leftover = divmod(num_rows, 4)
    return FIRST_GROUP + NEXT_GROUP * (groups - 1) + LEFTOVER[leftover]


class LlamaCpuCosts:
    """`runner_api.StepCosts` for llama.cpp on the CPU by the repack shape above."""

    base_rows = STEP_BASE_ROWS

    def step_cost(self, num_rows: int) -> float:
        return step_cost(num_rows)

    def prefill_cost(self, num_tokens: int) -> float:
        return step_cost(num_tokens)  # the shape does not tell output rows from the rest

    def num_ubatches(self, rows: Sequence[tuple[int, int]], n_ubatch: int, per_slot_streams: bool) -> int:
        return num_ubatches(rows, n_ubatch, per_slot_streams)


LLAMA_CPU_COSTS = LlamaCpuCosts()
MIN_BASE_ROWS, MAX_BASE_ROWS = 0.5, 8.0  # a linear fit outside this is noise, not a machine
LINEAR_FIT_ROWS = (1, 8, 16)  # the linear view's decode sizes (STEP_BASE_ROWS was read at 1/8/16 streams)


def _interpolated(points: tuple[tuple[int, float], ...], n: int) -> float:
    """Piecewise linear through `points` (ascending by their first element); past the last,
    extended by the slope of the last two."""
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n <= n1:
            return t0 + (t1 - t0) * (max(n, n0) - n0) / (n1 - n0)
    if len(points) == 1:
        return points[0][1] * n / points[0][0]
    (n0, t0), (n1, t1) = points[-2], points[-1]
    return t1 + max(t1 - t0, 0.0) / (n1 - n0) * (n - n1)


def _check_table(name: str, points: tuple[tuple[int, float], ...]) -> None:
    rows = [n for n, _ in points]
    if not rows or rows[0] != 1 or rows != sorted(set(rows)) or min(ms for _, ms in points) <= 0:
        raise ValueError(f"{name} needs ascending row counts from 1 and positive times: {points}")


@dataclass(frozen=True)
class MeasuredCosts:
    """`runner_api.StepCosts` from timed decodes on this machine (`step_timing.measure`), as
    (rows, milliseconds of a one-ubatch step) ascending by rows: `decode_ms` with logits on
    every row (decode and draft rows), `prefill_ms` with logits on the last (a prompt
    chunk; llama.cpp runs the output layer only for rows with logits, a large share of a
    small model's step). Between measured counts the time is interpolated."""

    decode_ms: tuple[tuple[int, float], ...]
    prefill_ms: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        _check_table("decode_ms", self.decode_ms)
        _check_table("prefill_ms", self.prefill_ms)

    def step_cost(self, num_rows: int) -> float:
        return _interpolated(self.decode_ms, max(num_rows, 1)) / self.decode_ms[0][1]

    def prefill_cost(self, num_tokens: int) -> float:
        return _interpolated(self.prefill_ms, max(num_tokens, 1)) / self.decode_ms[0][1]

    @property
    def base_rows(self) -> float:
        """The linear view's intercept over its slope, fitted (least squares) to the decode
        steps of LINEAR_FIT_ROWS rows (the sizes in between carry the gemv steps, which a
        line through them would read as a larger base); clamped, as a noisy fit must not
        turn drafting off."""
        points = [(n, ms) for n, ms in self.decode_ms if n in LINEAR_FIT_ROWS]
        if len(points) < 2:
            return STEP_BASE_ROWS
        mean_n = sum(n for n, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n, _ in points)
        if slope <= 0:
            return MAX_BASE_ROWS
        return min(max((mean_t - slope * mean_n) / slope, MIN_BASE_ROWS), MAX_BASE_ROWS)

    def num_ubatches(self, rows: Sequence[tuple[int, int]], n_ubatch: int, per_slot_streams: bool) -> int:
        return num_ubatches(rows, n_ubatch, per_slot_streams)
