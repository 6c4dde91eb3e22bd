"""What a decode step costs llama.cpp on the CPU by its rows and ubatches: the cost model
`LlamaRunner.costs` gives the engine (`runner_api.StepCosts`). Another model or backend
brings its own: these numbers were measured for gemma-3-270m Q4_K_M on a 2-core machine.

llama.cpp's CPU kernels for repacked weights (`ggml-cpu/repack.cpp`: the Q4_K and Q4_0
tensors of a Q4_K_M model on x86 and ARM) multiply a ubatch's rows four at a time (a
gemm) and each row left over on its own (a gemv, one more pass over the weights). So a
step's time is not linear in its rows but steps up at every row past a multiple of four:
`llama-batched-bench -npp 16 -ntg 32 -t 2` (gemma-3-270m Q4_K_M, this 2-core machine,
2026-12-03, ms per step) 1 row 12-18, 2: 24-28, 3: 31-34, 4: 33-36, 5: 46-56, 6: 52-64,
7: 59-67, 8: 50-67, 12: 56-75, 16: 73-86, 17: 106-121, 24: 115-123, 32: 148-182. Eight
rows cost less than six; a draft of 3 tokens on a lone stream costs what one of 2 does,
and one of 4 half as much again. `step_cost` is that shape in units of a one-row step;
the ratios, not the absolute times, decide a draft, so they need no measuring at run time
and a sequence's drafts stay independent of the machine's speed and of other calls.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    """`runner_api.StepCosts` for llama.cpp on the CPU (the measurements above)."""

    base_rows = STEP_BASE_ROWS

    def step_cost(self, num_rows: int) -> float:
        return step_cost(num_rows)

    def num_ubatches(self, rows: Sequence[tuple[int, int]], n_ubatch: int, per_slot_streams: bool) -> int:
        return num_ubatches(rows, n_ubatch, per_slot_streams)


LLAMA_CPU_COSTS = LlamaCpuCosts()
