"""tests/greedy.py: replies from different batch shapes agree up to a near tie, or fail."""

from __future__ import annotations

import pytest
from llmserve.client import pb

from tests.greedy import LOGPROB_TOL, parting


def lp(token: int, logprob: float, *alternatives: tuple[int, float]) -> pb.TokenLogprob:
    top = [pb.TopLogprob(token_id=t, logprob=v) for t, v in ((token, logprob), *alternatives)]
    return pb.TokenLogprob(token_id=token, logprob=logprob, top=top)


def test_the_same_tokens_within_the_tolerance_never_part() -> None:
    a = [lp(5, -0.50, (6, -2.0)), lp(7, -0.10, (8, -3.0))]
    b = [lp(5, -0.50 + LOGPROB_TOL / 2, (6, -2.1)), lp(7, -0.11, (8, -3.0))]
    assert parting(a, b) is None


def test_a_logprob_that_moved_past_the_tolerance_fails() -> None:
    with pytest.raises(AssertionError, match="token 1"):
        parting([lp(5, -0.5), lp(7, -0.1)], [lp(5, -0.5), lp(7, -0.1 - 3 * LOGPROB_TOL)])


def test_replies_may_part_at_a_near_tie() -> None:
    a = [lp(5, -0.5), lp(9, -1.50, (4, -1.55))]
    b = [lp(5, -0.5), lp(4, -1.52, (9, -1.56))]
    assert parting(a, b) == 1


def test_replies_that_part_where_one_pick_was_clearly_best_fail() -> None:
    a = [lp(9, -0.2, (4, -3.0))]
    b = [lp(4, -1.0, (9, -1.1))]
    with pytest.raises(AssertionError, match="beat the other's"):
        parting(a, b)


def test_a_pick_missing_from_the_other_runs_alternatives_fails() -> None:
    with pytest.raises(AssertionError, match="not a near tie"):
        parting([lp(9, -0.2, (4, -3.0))], [lp(7, -0.3, (9, -0.35))])


def test_a_pick_missing_from_alternatives_that_end_within_the_tolerance_is_a_near_tie() -> None:
    """A flat distribution (measured on an Intel AVX-512 machine: five candidates within 0.15
    nats, the other pick fifth): the other pick is at most the lowest shown, which is within
    the tolerance of this run's pick, so the tie may be near; it is not refused as one."""
    a = [lp(5, -2.77, (4, -2.79), (3, -2.89), (2, -2.95))]
    b = [lp(4, -2.75, (11, -2.90), (3, -2.90), (2, -2.95))]
    assert parting(a, b) == 0
