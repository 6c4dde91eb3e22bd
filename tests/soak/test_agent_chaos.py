"""Short agent chaos in `make test` (tests/soak/agent_chaos.py): 150 seeded Responses and
Messages calls from 6 threads (stored chains, deletes, background responses polled or
cancelled, dropped streams, deadlines, bad bodies), then the server must be idle and clean,
answer every stored response it acknowledged, and answer them all again after a restart,
continuing one from its saved KV."""

from __future__ import annotations

from pathlib import Path

from tests.soak import agent_chaos

CALLS, SEED = 150, 3


def test_agent_chaos_loses_no_stored_response(tmp_path: Path) -> None:
    run, findings = agent_chaos.chaos_and_restart(tmp_path, CALLS, SEED)
    print(agent_chaos.report(run, CALLS, SEED, findings))
    assert run.unexpected() == {}
    assert findings == []
    assert sum(run.statuses.values()) == CALLS
    assert len(run.acknowledged) - len(run.deleted) >= 10  # enough stored ones to lose
    assert run.statuses[("continue", 200)] >= 3 and run.statuses[("background", 200)] >= 3
