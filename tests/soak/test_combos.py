"""A short run of the combination fuzzer in `make test` (tests/soak/combos.py): valid
features together plus adversarial values; then the server must be alive and clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningServer, start_server, stop_server
from tests.soak import chaos, combos


@pytest.fixture(scope="module")
def combo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    sessions = tmp_path_factory.mktemp("combo-sessions")
    args = [*combos.SERVER_ARGS, "--session-dir", str(sessions)]
    running = start_server(args, tmp_path_factory.mktemp("combos") / "server.log", metrics=True)
    yield running
    assert stop_server(running) == 0


def test_feature_combinations_never_crash_hang_or_leak(combo_server: RunningServer) -> None:
    lines: list[str] = []
    outcomes = combos.run_combos(combo_server.address, calls=150, seed=23, unexpected=lines)
    info = chaos.wait_until_idle(combo_server.address)
    print(combos.report(outcomes, 150, 23, []))
    unexpected = {o: n for o, n in outcomes.items() if not o.expected}
    assert unexpected == {}, "\n".join(lines)
    assert sum(outcomes.values()) == 150
    assert combo_server.process.poll() is None
    assert chaos.kv_leaks(info) == []
    assert chaos.metric(combo_server.metrics_port, "llmserve_sessions") == 0
    assert chaos.rss_kb(combo_server.process.pid) < combos.MAX_RSS_MIB * 1024
    log = Path(combo_server.log_path).read_text()
    assert "rpc_internal_error" not in log and "executor_step_failed" not in log and "executor_died" not in log
