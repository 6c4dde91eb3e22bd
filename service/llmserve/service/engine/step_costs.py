"""What a one-ubatch decode step costs by its number of rows, and the draft length that
makes the most of it.

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

SMALL_STEPS = (1.0, 2.1, 2.6)  # 1-3 rows: a gemv each
FIRST_GROUP = 2.7  # four rows: one gemm over every weight
NEXT_GROUP = 1.3  # each further four rows
LEFTOVER = (0.0, 1.35, 1.9, 2.2)  # rows past a multiple of four: gemvs


def step_cost(num_rows: int) -> float:
    """A one-ubatch step of `num_rows` rows, in one-row steps."""
    if num_rows < 4:
        return SMALL_STEPS[max(num_rows, 1) - 1]
    groups, leftover = divmod(num_rows, 4)
    return FIRST_GROUP + NEXT_GROUP * (groups - 1) + LEFTOVER[leftover]


def best_draft_length(odds: float, max_len: int, num_seqs: int = 1) -> int:
    """The draft length k, the same for each of `num_seqs` decoding sequences whose rows
    share one ubatch, that yields the most tokens per unit of step time: a k-th draft
    token lands with probability about odds**k (each after all before it), so a step of
    num_seqs * (1 + k) rows yields num_seqs * (1 + odds + ... + odds**k) tokens. 0: no
    draft beats the decode rows alone."""
    q = min(max(odds, 0.0), 0.999)
    best, best_rate, expected = 0, 1.0 / step_cost(num_seqs), 1.0
    for k in range(1, max_len + 1):
        expected += q**k
        rate = expected / step_cost(num_seqs * (1 + k))
        if rate > best_rate:
            best, best_rate = k, rate
    return best
