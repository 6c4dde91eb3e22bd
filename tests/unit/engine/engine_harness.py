"""The harness of the fake-runner engine tests (tests/unit/engine/fake_runner.py): no model, no
threads, milliseconds per test. An `Executor` over a `FakeRunner`, driven by hand: `drain`
handles the queued commands, `step` runs one iteration of the loop; `ListSink` records the
events; after every scenario the slots' token mirrors must equal what the fake KV holds
(`assert_kv_mirrors_slots`)."""

from __future__ import annotations

from llmserve.service.config import ContextShiftSettings, PrefillSettings, SpeculationSettings
from llmserve.service.domain.events import SessionFailed, TokenEvent, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams, SessionParams, StoppingParams
from llmserve.service.engine.executor.executor import Executor, ExecutorConfig
from llmserve.service.engine.executor.session import MAX_BACKLOG

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
SERVER_PREFILL = PrefillSettings()
SERVER_SPECULATION = SpeculationSettings()  # n-gram drafts where they pay, as the server


class ReaderSink(ListSink):
    """A sink whose client can stop reading: `backlog` is what it has not read."""

    def __init__(self) -> None:
        super().__init__()
        self.backlog = 0

    def stop_reading(self) -> None:
        self.backlog = MAX_BACKLOG

    def read_all(self) -> None:
        self.backlog = 0


class RecordingStore:
    """The parts of SessionStore the executor calls."""

    def __init__(self) -> None:
        self.saved: list[object] = []
        self.settled: list[str] = []

    def save_async(self, record: object) -> None:
        self.saved.append(record)

    def settle(self, session_id: str) -> None:
        self.settled.append(session_id)


def make(
    n_parallel: int = 2,
    n_ctx_per_slot: int = 256,
    context_shift: ContextShiftSettings = NO_SHIFT,
    *,
    n_swa: int = 0,
    prefill: PrefillSettings = SERVER_PREFILL,
    speculation: SpeculationSettings = SERVER_SPECULATION,
    price_drafts: bool = True,
    reader_timeout_s: float | None = None,
    idle_grace_s: float | None = None,
    store: RecordingStore | None = None,
) -> tuple[Executor, FakeRunner]:
    """The one executor of the fake-runner tests: batches of 64, 4 embedding sequences, the
    server's defaults unless named. `n_swa`: the fake's sliding window; `price_drafts=False`:
    drafts granted whatever their rows cost (the draft mechanics alone); `idle_grace_s`: how
    long a paused session keeps its slot (None: admission's default); `store`: where named
    sessions are saved."""
    runner = FakeRunner(n_batch=64, n_swa=n_swa)
    config = ExecutorConfig(n_parallel, n_ctx_per_slot, 64, 64, max_embed_seqs=4, reader_timeout_s=reader_timeout_s,
                            prefill=prefill, speculation=speculation, context_shift=context_shift)
    executor = Executor(runner, config, store=store)  # type: ignore[arg-type]
    executor.scheduler.price_drafts = price_drafts
    if idle_grace_s is not None:
        executor.table.admission.idle_grace_s = idle_grace_s
    return executor, runner


def params(**stopping: object) -> SessionParams:
    return SessionParams("test", GREEDY, StoppingParams(**stopping))  # type: ignore[arg-type]


def run_until(executor: Executor, done, max_steps: int = 500) -> None:  # type: ignore[no-untyped-def]
    for _ in range(max_steps):
        executor.drain(block=False)
        if done():
            return
        executor.step()
    raise AssertionError("the scenario did not finish")


def steps(executor: Executor, n: int) -> None:
    """`n` iterations of the loop, whatever they bring."""
    for _ in range(n):
        executor.drain(block=False)
        executor.step()


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
