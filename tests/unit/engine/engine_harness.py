"""The harness of the fake-runner engine tests (tests/unit/engine/fake_runner.py): no model, no
threads, milliseconds per test. An `Executor` over a `FakeRunner`, driven by hand: `drain`
handles the queued commands, `step` runs one iteration of the loop; `ListSink` records the
events; after every scenario the slots' token mirrors must equal what the fake KV holds
(`assert_kv_mirrors_slots`)."""

from __future__ import annotations

from llmserve.service.config import ContextShiftSettings
from llmserve.service.domain.events import SessionFailed, TokenEvent, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams, SessionParams, StoppingParams
from llmserve.service.engine.executor import Executor, ExecutorConfig

from .fake_runner import FakeRunner

GREEDY = SamplingParams(temperature=0.0, seed=7)


class ListSink:
    backlog = 0

    def __init__(self) -> None:
        self.events: list[object] = []

    def put(self, event: object) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [e for e in self.events if isinstance(e, kind)]

    def text(self, index: int = 0) -> str:
        return "".join(e.text for e in self.of(TokenEvent) if e.index == index)

    def token_ids(self, index: int = 0) -> list[int]:
        return [t for e in self.of(TokenEvent) if e.index == index for t in e.token_ids]


NO_SHIFT = ContextShiftSettings()


def make(
    n_parallel: int = 2, n_ctx_per_slot: int = 256, context_shift: ContextShiftSettings = NO_SHIFT
) -> tuple[Executor, FakeRunner]:
    runner = FakeRunner(n_batch=64)
    config = ExecutorConfig(n_parallel, n_ctx_per_slot, 64, 64, max_embed_seqs=4, context_shift=context_shift)
    return Executor(runner, config), runner


def params(**stopping: object) -> SessionParams:
    return SessionParams("test", GREEDY, StoppingParams(**stopping))  # type: ignore[arg-type]


def run_until(executor: Executor, done, max_steps: int = 500) -> None:  # type: ignore[no-untyped-def]
    for _ in range(max_steps):
        executor.drain(block=False)
        if done():
            return
        executor.step()
    raise AssertionError("the scenario did not finish")


def turn_ends(sink: ListSink, n: int = 1):  # type: ignore[no-untyped-def]
    return lambda: len([e for e in sink.of(TurnEndEvent) if e.final]) >= n or sink.of(SessionFailed)


def assert_kv_mirrors_slots(executor: Executor, runner: FakeRunner) -> None:
    for slot, _ in executor.table.slot_states():
        assert runner.kv.get(slot.seq_id, []) == slot.tokens, f"slot {slot.seq_id}"


def one_turn(executor: Executor, prompt: tuple[int, ...], p: SessionParams) -> tuple[ListSink, int]:
    sink = ListSink()
    key = executor.open_session(p, sink)
    executor.add_input(key, prompt, True)
    run_until(executor, turn_ends(sink))
    return sink, key
