"""bench.targets' plain rows apply issue 41's goals to alternating rounds (pure: no servers):
a median of at least 1.0x with no round below 0.9x, under each workload."""

from __future__ import annotations


def _rows(ours: list[float], peer: list[float], ttft_ours: list[float], ttft_peer: list[float],
          workload: str = "rounds") -> dict[str, tuple[str, bool]]:
    from bench.targets import PLAIN_LEVELS, plain_rows

    tps = {"a": dict.fromkeys(PLAIN_LEVELS, ours), "b": dict.fromkeys(PLAIN_LEVELS, peer)}
    ttft = {"a": dict.fromkeys(PLAIN_LEVELS, ttft_ours), "b": dict.fromkeys(PLAIN_LEVELS, ttft_peer)}
    return {target: (measured, met) for target, measured, _, met in plain_rows(tps, ttft, "a", "b", workload)
            if "c=4" in target}


def test_a_round_below_090_fails_the_row_whatever_the_median() -> None:
    rows = _rows([110.0, 120.0, 89.0], [100.0] * 3, [50.0] * 3, [50.0] * 3)
    assert rows["plain (rounds) c=4 tokens/s"] == ("median 1.10x, lowest 0.89x (1.10, 1.20, 0.89)", False)
    assert rows["plain (rounds) c=4 TTFT p50"] == ("median 1.00x (1.00, 1.00, 1.00)", True)


def test_the_median_and_lowest_round_both_meet_the_goal() -> None:
    rows = _rows([101.0, 91.0, 130.0], [100.0] * 3, [40.0, 60.0, 55.0], [50.0] * 3, "pool")
    assert rows["plain (pool) c=4 tokens/s"][1] is True
    assert rows["plain (pool) c=4 TTFT p50"] == ("median 1.10x (0.80, 1.20, 1.10)", False)
    assert _rows([99.0] * 3, [100.0] * 3, [1.0] * 3, [1.0] * 3)["plain (rounds) c=4 tokens/s"][1] is False
