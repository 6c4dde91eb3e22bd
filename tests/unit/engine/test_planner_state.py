"""The step's planning keeps nothing hidden (issue 40): `Scheduler.plan` only reads, and what
it keeps from one step to the next is the `PlannerState` it returns in `StepPlan.next_state`;
the backend's cost model is the runner's (`Runner.costs`), not the engine's."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

from llmserve.service.engine.executor.scheduler import PlannerState, Scheduler, SeqDemand

from .fake_runner import FakeRunner

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "service" / "llmserve").is_dir())
ENGINE = ROOT / "service" / "llmserve" / "service" / "engine"


def test_plan_reads_only_and_returns_what_it_keeps() -> None:
    scheduler = Scheduler(64, 64, 4, prefill_budget=16, max_draft_rows=8, costs=FakeRunner.costs)
    demands = [SeqDemand(1, True, 0, 4, draft_odds=0.9), SeqDemand(2, False, 100), SeqDemand(3, False, 30)]
    before = copy.copy(vars(scheduler))
    first = scheduler.plan(demands, [8, 8])
    assert vars(scheduler) == before  # nothing kept on the scheduler
    assert first.is_embedding and first.next_state.last_was_embedding
    again = scheduler.plan(demands, [8, 8], state=first.next_state)
    assert not again.is_embedding and again.prefill  # generation's turn, as the state tells
    assert again == scheduler.plan(demands, [8, 8], state=first.next_state)  # the same inputs, the same plan
    assert dict(again.next_state.prefill_since) == {2: 1, 3: 1} and again.next_state.num_plans == 1
    later = scheduler.plan([SeqDemand(4, False, 5), SeqDemand(3, False, 20)], [], state=again.next_state)
    assert dict(later.next_state.prefill_since) == {3: 1, 4: 2}  # prompt 3 waits since the first plan
    assert PlannerState() == PlannerState(False, 0, {})


def test_drafts_need_the_runners_costs() -> None:
    try:
        Scheduler(64, 64, 4, max_draft_rows=8)
    except ValueError:
        pass
    else:
        raise AssertionError("a scheduler that drafts must be given the runner's step costs")
    assert Scheduler(64, 64, 4).plan([SeqDemand(1, True, 0, 4)], []).drafts == ()  # no drafts, no costs


def test_the_engine_holds_no_backend_cost_model() -> None:
    """step costs, the linear base and the ubatch split live behind Runner (model/)."""
    banned = {"step_cost", "num_ubatches", "STEP_BASE_ROWS", "SMALL_STEPS"}
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module-level constants
            if isinstance(node, ast.Assign):
                found += [f"{path.name}: {t.id}" for t in node.targets if isinstance(t, ast.Name) and t.id in banned]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in banned and path.name != "runner_api.py":
                found.append(f"{path.name}: {node.name}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith(("step_costs", "ubatches")):
                found.append(f"{path.name} imports {node.module}")
    assert not found, found
