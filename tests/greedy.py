"""Comparing greedy replies computed in different batch shapes, KV layouts or CPUs.

llama.cpp's kernels round differently with the batch shape (how many rows, which
ubatch), where the KV cells sit, and the CPU's vector width (AVX2 vs AVX-512): the
same prompt gets logits that differ in the last digits. Greedy decoding turns such a
difference into another token wherever two candidates are nearly tied, and from there
the texts part. So two such replies are not compared as text. What is guaranteed, and
what a real bug (a stale KV cell, a wrong position, a lost token) breaks:

- while the two replies agree, each token's logprob agrees within `tol`;
- where they first part, both tokens were near-tied in both runs: each run's pick beat
  the other run's pick by at most `2 * tol`. Where the other pick is not among a run's top
  alternatives, its logprob is at most the lowest one shown; when even that one is within
  `2 * tol` of the run's pick (a flat distribution: several candidates within a few tenths
  of a nat), the tie cannot be measured and is taken as near; when it is further below, the
  other pick is too, and the replies are not a near tie.

The replies must have been asked with `top_logprobs >= 2` (so the other pick shows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Measured (docs/reliability.md, "Numerics"; AVX2, gemma-3-270m, a 302-token prompt, 16
# greedy tokens): against a cold server, the same tokens' logprobs moved by up to 0.064
# nats when the prompt's first 300 tokens came from the prefix cache (per-slot KV), and by
# up to 0.083 when a -kvu prefix was dropped and prefilled again; a second cold server
# gave the same digits. On an Intel AVX-512 machine, draft rows verified in multi-row
# batches (speculation, on by default) moved them by up to 0.242 nats against llama-cpp-python
# decoding one row at a time (16 prompts x 32 tokens; 0.0 with --spec-type none). 0.35 leaves
# room above that. Dropping the prefix instead of prefilling it again (a real bug, tried on
# purpose) moved them by whole nats.
LOGPROB_TOL = 0.35


def _alternatives(lp: Any) -> dict[int, float]:
    return {top.token_id: top.logprob for top in lp.top} | {lp.token_id: lp.logprob}


def parting(a: Sequence[Any], b: Sequence[Any], tol: float = LOGPROB_TOL) -> int | None:
    """Check two greedy replies' per-token logprobs (`TokenLogprob`s) as the module says;
    returns the index where they part, None if one is a prefix of the other. Raises
    AssertionError naming the token when the guarantee does not hold."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x.token_id == y.token_id:
            assert abs(x.logprob - y.logprob) <= tol, (
                f"token {i} ({x.token_id}): logprob {x.logprob:.4f} vs {y.logprob:.4f} (tolerance {tol})")
            continue
        for name, run, mine, theirs in (("first", x, x.token_id, y.token_id), ("second", y, y.token_id, x.token_id)):
            alternatives = _alternatives(run)
            if theirs not in alternatives:  # it is at most the lowest shown: a gap of at least this
                least = alternatives[mine] - min(alternatives.values())
                assert least <= 2 * tol, (
                    f"token {i}: the {name} reply picked {mine}; the other's pick {theirs} is not among its top "
                    f"alternatives {sorted(alternatives)}, which end {least:.4f} nats below its pick: not a near tie")
                continue
            gap = alternatives[mine] - alternatives[theirs]
            assert gap <= 2 * tol, f"token {i}: the {name} reply's pick beat the other's by {gap:.4f} nats (> {2 * tol})"
        return i
    return None
