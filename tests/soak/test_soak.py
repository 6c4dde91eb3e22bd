"""Short chaos soak in `make test`: ~200 calls, then the server must be clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llmserve.client import Client

from harness.metrics import metric
from harness.server import RunningServer, num_threads, start_server, stop_server
from tests.soak import chaos
from tests.soak.server_state import kv_leaks, wait_until_idle


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(chaos.SERVER_ARGS, tmp_path_factory.mktemp("soak") / "server.log", metrics=True)
    yield running
    assert stop_server(running) == 0


def test_short_chaos_run_leaves_the_server_clean(soak_server: RunningServer) -> None:
    pid = soak_server.process.pid
    with Client(soak_server.address, timeout=120) as client:
        # The grammar-compile and heavy-unary pools (one thread each) start on first use:
        # start them before counting, so that what is counted after is a leak.
        client.generate("Say yes:", max_tokens=2, grammar='root ::= "yes"')
        client.tokenize("warm " * 5000)  # over 16 KiB: the heavy-unary thread
    threads_before = num_threads(pid)
    before = chaos.cancel_counts(soak_server.metrics_port)
    run = chaos.run_chaos(soak_server.address, calls=200, seed=11)
    info = wait_until_idle(soak_server.address)
    findings = chaos.server_findings(run, soak_server.log_path, soak_server.metrics_port, before)
    mid_turn = sum(c.responses_read > 0 for c in run.cancelled)
    print(chaos.report(run.outcomes, 200, 11, [f"{len(run.cancelled)} calls cancelled or dropped by the client "
                                                 f"({mid_turn} mid-turn), {len(run.refused_with_room)} refused with room",
                                                 f"the server's side: {findings or 'clean'}"]))
    assert chaos.unexpected(run.outcomes) == {}
    assert sum(run.outcomes.values()) >= 200
    # the server's side: each cancel ended CANCELLED there; the valid calls were served, not refused
    assert findings == []
    assert mid_turn >= 1  # a mid-turn cancel was made, and checked (under load most calls are refused)
    assert soak_server.process.poll() is None
    assert kv_leaks(info) == []
    assert metric(soak_server.metrics_port, "llmserve_sessions") == 0
    assert num_threads(pid) <= threads_before + 2
    log = Path(soak_server.log_path).read_text()
    assert "rpc_internal_error" not in log and "executor_step_failed" not in log
