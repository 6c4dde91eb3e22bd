"""A short run of the combination fuzzer in `make test` (tests/soak/combos.py): 150 seeded
calls, each checked against the outcome its plan predicts (tests/soak/oracle.py); then the
server must be alive and clean. A finding prints its plan and the command that resends it.
Then its HTTP mode: 36 plans over the OpenAI API of the same server, judged by the same oracle;
and 36 cut to each of the Responses and Messages APIs. The server serves a further model
(harness/models.py), which the first runs leave idle; the last run draws each plan's model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llmserve.client import Client

from harness.metrics import total
from harness.models import OTHER_MODEL, two_model_flags
from harness.server import RunningServer, free_port, start_server, stop_server
from tests.soak import chaos, combos
from tests.soak.oracle_run import check_run
from tests.soak.plans import draw_plans

CALLS, SEED = 150, 23
HTTP_CALLS = 36
RESPONSES_CALLS = 36
MODELS_CALLS = 60


@pytest.fixture(scope="module")
def combo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    sessions = tmp_path_factory.mktemp("combo-sessions")
    args = [*combos.SERVER_ARGS, *two_model_flags(), "--session-dir", str(sessions)]
    running = start_server(args, tmp_path_factory.mktemp("combos") / "server.log", metrics=True, http_port=free_port())
    yield running
    assert stop_server(running) == 0


def test_feature_combinations_match_the_oracle(combo_server: RunningServer) -> None:
    plans = draw_plans(CALLS, SEED)
    records = combos.run_combos(combo_server.address, plans)
    info = chaos.wait_until_idle(combo_server.address)
    verdict = check_run(records, combos.run_context(info, combos.WORKERS, Path(combo_server.log_path)))
    print(combos.report(verdict, CALLS, SEED, combos.WORKERS, []))
    assert verdict.findings == [], combos.failure_text(verdict, plans, SEED)
    assert len(records) == CALLS
    assert verdict.num_valid - verdict.num_refused > CALLS // 2  # most calls were served, not refused
    assert combos.server_findings(combo_server, info) == []
    with Client(combo_server.address, timeout=30) as client:  # and it goes on serving
        assert client.generate("Hello", max_tokens=2).turn_end.usage.completion_tokens == 2


def test_http_plans_match_the_same_oracle(combo_server: RunningServer) -> None:
    plans = draw_plans(HTTP_CALLS, SEED, surface="http")
    records = combos.run_combos(combo_server.address, plans, http_url=f"http://127.0.0.1:{combo_server.http_port}")
    info = chaos.wait_until_idle(combo_server.address)
    ctx = combos.run_context(info, combos.WORKERS, Path(combo_server.log_path), combo_server.address)
    verdict = check_run(records, ctx)
    print(combos.report(verdict, HTTP_CALLS, SEED, combos.WORKERS, [], surface="http"))
    assert verdict.findings == [], combos.failure_text(verdict, plans, SEED, surface="http")
    assert sum(r.status.code == "OK" and r.http is not None for r in records) > HTTP_CALLS // 2
    assert combos.server_findings(combo_server, info) == []


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_agent_api_plans_match_the_same_oracle(combo_server: RunningServer, api: str) -> None:
    """Plans cut to what a `/v1/responses` or `/v1/messages` body says (tests/soak/plans.py
    `as_api`), whole and streamed, judged by the same oracle from the reply
    (responses_translate.py, messages_translate.py)."""
    plans = draw_plans(RESPONSES_CALLS, SEED, surface=api)
    records = combos.run_combos(combo_server.address, plans, http_url=f"http://127.0.0.1:{combo_server.http_port}")
    info = chaos.wait_until_idle(combo_server.address)
    verdict = check_run(records, combos.run_context(info, combos.WORKERS, Path(combo_server.log_path),
                                                    combo_server.address))
    print(combos.report(verdict, RESPONSES_CALLS, SEED, combos.WORKERS, [], surface=api))
    assert verdict.findings == [], combos.failure_text(verdict, plans, SEED, surface=api)
    assert sum(r.status.code == "OK" for r in records) > RESPONSES_CALLS // 2
    assert sum(p.adversarial != "" for p in plans) >= 1 and sum(p.stream for p in plans) >= 5
    assert combos.server_findings(combo_server, info) == []


def test_plans_over_two_models_match_the_same_oracle(combo_server: RunningServer) -> None:
    """Each plan's model drawn (the default or the further one) and its surface drawn (gRPC or
    HTTP): the same oracle, and afterwards both models' slots idle with their KV clean."""
    plans = draw_plans(MODELS_CALLS, SEED, surface="mixed", models=("", OTHER_MODEL))
    turns_before = total(combo_server.metrics_port, "llmserve_turns_total", model_name=OTHER_MODEL)
    records = combos.run_combos(combo_server.address, plans, http_url=f"http://127.0.0.1:{combo_server.http_port}")
    info, other = chaos.wait_until_idle(combo_server.address), chaos.wait_until_idle(combo_server.address, model=OTHER_MODEL)
    verdict = check_run(records, combos.run_context(info, combos.WORKERS, Path(combo_server.log_path),
                                                    combo_server.address))
    print(combos.report(verdict, MODELS_CALLS, SEED, combos.WORKERS, [], surface="mixed", models=True))
    assert verdict.findings == [], combos.failure_text(verdict, plans, SEED, surface="mixed", models=True)
    served = [r for r in records if r.status.code == "OK"]
    for model in ("", OTHER_MODEL):  # both models served calls over both surfaces
        assert {r.plan.surface for r in served if r.plan.config.model == model} == {"grpc", "http"}, model
    turns = total(combo_server.metrics_port, "llmserve_turns_total", model_name=OTHER_MODEL) - turns_before
    assert turns >= sum(r.plan.config.model == OTHER_MODEL for r in served)  # on the model they named
    assert combos.server_findings(combo_server, info, other) == []
