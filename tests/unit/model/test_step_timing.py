"""The step-cost table measured on the machine (model/step_timing.py, step_costs.MeasuredCosts):
how it prices steps between and past the sizes it timed, its linear view, and its cache."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from llmserve.service.model import step_timing
from llmserve.service.model.batch_arrays import BatchArrays
from llmserve.service.model.runner_config import RunnerConfig
from llmserve.service.model.step_costs import MAX_BASE_ROWS, MeasuredCosts

LINE = tuple((n, 10.0 + 4.0 * n) for n in (1, 2, 4, 8, 16))  # 10 ms + 4 ms a row: base_rows 2.5


def test_costs_are_in_one_row_steps_interpolated_and_extended() -> None:
    costs = MeasuredCosts(((1, 10.0), (4, 40.0), (8, 40.0)), ((1, 10.0), (64, 30.0)))
    assert costs.step_cost(1) == 1.0 and costs.step_cost(4) == 4.0
    assert costs.step_cost(2) == pytest.approx(2.0)  # between 1 and 4
    assert costs.step_cost(6) == pytest.approx(4.0)  # 4 and 8 cost the same: so does 6
    assert costs.step_cost(12) == pytest.approx(4.0)  # past the last: the last two's slope (0)
    assert costs.prefill_cost(64) == pytest.approx(3.0)  # prompt chunks by their own table, in the same unit
    assert costs.prefill_cost(128) == pytest.approx(30.0 / 10 + 20.0 / 63 * 64 / 10)


def test_the_linear_view_is_the_line_through_one_eight_and_sixteen_rows() -> None:
    costs = MeasuredCosts(LINE, LINE)
    assert costs.base_rows == pytest.approx(2.5)
    # the gemv-shaped sizes in between do not move it
    bumpy = MeasuredCosts(tuple(sorted(LINE + ((3, 60.0), (5, 90.0)))), LINE)
    assert bumpy.base_rows == pytest.approx(2.5)
    flat = MeasuredCosts(((1, 10.0), (8, 10.0), (16, 9.0)), LINE)  # noise, not a machine
    assert flat.base_rows == MAX_BASE_ROWS


@pytest.mark.parametrize("table", [(), ((2, 5.0),), ((1, 5.0), (1, 6.0)), ((1, 5.0), (4, 0.0))])
def test_a_table_that_is_not_one_is_refused(table: tuple[tuple[int, float], ...]) -> None:
    with pytest.raises(ValueError, match="ascending row counts from 1"):
        MeasuredCosts(table, LINE)


class _TimedRunner:
    """The runner's surface `measure` uses, with a decode that takes 1 ms + 0.2 ms a row."""

    def __init__(self, capacity: int = 256) -> None:
        self.batch = BatchArrays(capacity)  # add() raises past it, as the runner's batch does
        self.num_decodes = 0
        self.cells_left = 0

    def decode(self) -> int:
        self.num_decodes += 1
        self.cells_left = int(self.batch.pos[self.batch.num_tokens - 1]) + 1
        time.sleep(0.001 + 0.0002 * self.batch.num_tokens)
        return 0

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        assert seq_id == 0 and p1 == -1
        self.cells_left = min(self.cells_left, p0)
        return True


def _config(tmp_path: Path, n_ubatch: int = 512) -> RunnerConfig:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return RunnerConfig(model, n_ctx=4096, n_parallel=4, n_batch=2048, n_ubatch=n_ubatch, n_threads=2, embeddings=False)


def test_measured_once_then_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_CACHE_DIR", str(tmp_path / "cache"))
    runner = _TimedRunner()
    costs = step_timing.load_or_measure(runner, _config(tmp_path))  # type: ignore[arg-type]
    sizes = len(step_timing.DECODE_ROWS) + len(step_timing.PREFILL_ROWS)
    assert runner.num_decodes == 1 + step_timing.REPEATS * sizes and runner.cells_left == 0  # a history, then steps
    assert [n for n, _ in costs.decode_ms] == list(step_timing.DECODE_ROWS)
    assert costs.step_cost(32) > costs.step_cost(8) > 1.0  # the fake's time grows with the rows
    (saved,) = (tmp_path / "cache" / "step-costs").glob("*.json")
    assert json.loads(saved.read_text())["key"]["threads"] == 2

    again = step_timing.load_or_measure(runner, _config(tmp_path))  # type: ignore[arg-type]
    assert again == costs and runner.num_decodes == 1 + step_timing.REPEATS * sizes  # read, not measured


def test_another_configuration_or_a_damaged_file_measures_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_CACHE_DIR", str(tmp_path / "cache"))
    runner = _TimedRunner()
    small = step_timing.load_or_measure(runner, _config(tmp_path, n_ubatch=8))  # type: ignore[arg-type]
    assert max(n for n, _ in small.decode_ms) == 8 and [n for n, _ in small.prefill_ms] == [1]  # nothing past a ubatch
    tiny = step_timing.measure(runner, 512, 40)  # type: ignore[arg-type]
    assert max(n for n, _ in tiny.decode_ms) == 17 and runner.cells_left == 0  # 20 cells of history, 20 for a step
    narrow_runner = _TimedRunner(capacity=7)  # -ub 7 with --embeddings: a batch of 7 rows
    narrow = step_timing.measure(narrow_runner, 7, 4096)  # type: ignore[arg-type]
    assert max(n for n, _ in narrow.decode_ms) == 7 and narrow_runner.num_decodes == -(-256 // 7) + 3 * 8
    before = runner.num_decodes
    step_timing.load_or_measure(runner, _config(tmp_path))  # type: ignore[arg-type]
    assert runner.num_decodes > before  # another n_ubatch: another key
    for path in (tmp_path / "cache" / "step-costs").glob("*.json"):
        path.write_text("{not json")
    before = runner.num_decodes
    step_timing.load_or_measure(runner, _config(tmp_path))  # type: ignore[arg-type]
    assert runner.num_decodes > before
