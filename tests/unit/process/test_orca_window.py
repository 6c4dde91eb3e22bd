"""The windows behind ORCA's rps_fractional and application_utilization (load_report.py)."""

from __future__ import annotations

from llmserve.service.load_report import Window


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_counts_the_last_window_only() -> None:
    clock = Clock()
    window = Window(5.0, clock)
    clock.now += 10  # an old replica
    for _ in range(10):
        window.add()
    assert window.per_second() == 2.0  # 10 calls over 5 s
    clock.now += 6
    assert window.per_second() == 0.0


def test_a_young_window_divides_by_its_life_so_far() -> None:
    clock = Clock()
    window = Window(5.0, clock)
    clock.now += 2
    window.add()
    window.add()
    assert window.per_second() == 1.0


def test_mean_of_samples_in_the_window() -> None:
    clock = Clock()
    window = Window(5.0, clock)
    for value in (0.0, 1.0, 2.0):
        window.add(value)
        clock.now += 1
    assert window.mean() == 1.0
    clock.now += 3  # the first two samples have left the window
    assert window.mean() == 2.0
    clock.now += 5
    assert window.mean() == 0.0
