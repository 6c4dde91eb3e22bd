"""Activated LoRA (aLoRA) in the executor, on the fake runner: the context before the start of
the invocation's last occurrence is computed under the base, the rest and the reply under the
adapter, as llama-server does; without an invocation the turn runs on the base. The fake
records the adapter set each cell was decoded under and refuses any other mix of sets."""

from __future__ import annotations

from dataclasses import replace

from llmserve.service.domain.events import SessionFailed, TurnEndEvent
from llmserve.service.domain.requests import AdapterSet
from llmserve.service.engine.commands import LoadAdapter
from llmserve.service.engine.executor.alora import invocation_start
from llmserve.service.engine.executor.executor import Executor

from .engine_harness import ListSink, make, params, run_until, steps, turn_ends
from .fake_runner import BOS, FakeRunner

ACT: AdapterSet = (("act", 1.0),)
INVOCATION = (7, 8)


def _server() -> tuple[Executor, FakeRunner]:
    executor, runner = make(n_parallel=4)
    answers: list[object] = []
    executor.adapter_command(LoadAdapter("act", "/adapters/act-alora", answers.append))
    executor.drain(block=False)
    assert runner.alora_adapters == {"act"} and not [a for a in answers if isinstance(a, Exception)]
    return executor, runner


def _open(executor: Executor, prompt: tuple[int, ...], end: bool = True, num_samples: int = 1,
          adapters: AdapterSet = ACT) -> ListSink:
    sink = ListSink()
    session_params = replace(params(max_tokens=3), adapters=adapters, num_samples=num_samples,
                             alora_invocation=INVOCATION if adapters else ())
    key = executor.open_session(session_params, sink)
    executor.add_input(key, prompt, end)
    return sink


def _sets_by_position(runner: FakeRunner) -> dict[int, list[AdapterSet]]:
    """seq -> the adapter set of each of its cells, by position."""
    placed: dict[int, list[AdapterSet]] = {}
    for seq, pos, adapters in runner.placed:
        placed.setdefault(seq, [])[pos:] = [adapters]
    return placed


def test_the_invocation_s_last_occurrence_starts_the_adapter() -> None:
    assert invocation_start(None, [BOS, 7, 8, 5, 7, 8, 9], INVOCATION) == 4
    assert invocation_start(None, [BOS, 5, 7, 9], INVOCATION) is None
    assert invocation_start(None, [BOS, 5], ()) is None


def test_the_context_before_the_invocation_runs_on_the_base_and_the_rest_under_the_alora() -> None:
    executor, runner = _server()
    sink = _open(executor, (BOS, 5, 6, 7, 8, 9))
    run_until(executor, turn_ends(sink))
    assert not sink.of(SessionFailed) and len(sink.token_ids()) == 3
    (cells,) = _sets_by_position(runner).values()
    assert cells[:3] == [()] * 3  # BOS 5 6: the base's
    assert cells[3:] == [ACT] * (len(cells) - 3)  # the invocation, 9 and the reply's decoded tokens: the aLoRA's
    assert len(cells) == 6 + 2  # 3 tokens replied, the last never enters the KV


def test_without_the_invocation_the_whole_turn_runs_on_the_base() -> None:
    executor, runner = _server()
    sink = _open(executor, (BOS, 5, 6, 7, 9))
    run_until(executor, turn_ends(sink))
    (cells,) = _sets_by_position(runner).values()
    assert not sink.of(SessionFailed) and cells == [()] * len(cells) and len(cells) == 7


def test_nothing_is_prefilled_before_the_input_ends_and_no_prefix_of_another_session_is_reused() -> None:
    executor, runner = _server()
    base = _open(executor, (BOS, 5, 6, 7, 8, 9), adapters=())
    run_until(executor, turn_ends(base))
    executor.close(1)
    runner.placed.clear()
    sink = _open(executor, (BOS, 5, 6, 7, 8), end=False)  # the same head the idle slot caches, streamed
    steps(executor, 3)
    assert runner.placed == []  # where the invocation's last occurrence starts is not known yet
    executor.add_input(2, (9,), True)
    run_until(executor, turn_ends(sink))
    (cells,) = _sets_by_position(runner).values()
    assert cells[:3] == [()] * 3 and cells[3:6] == [ACT] * 3  # computed again from position 0: no reuse


def test_every_sample_of_the_turn_decodes_under_the_alora() -> None:
    executor, runner = _server()
    sink = _open(executor, (BOS, 5, 7, 8, 9), num_samples=2)
    run_until(executor, turn_ends(sink))
    assert not sink.of(SessionFailed)
    main, forked = sorted(_sets_by_position(runner).values(), key=len, reverse=True)
    assert main[:2] == [()] * 2 and set(main[2:]) == {ACT}
    assert forked and set(forked) == {ACT}  # its cells were copied from the main's; it decodes its reply under the aLoRA


def _placed_from(runner: FakeRunner) -> tuple[int, list[AdapterSet]]:
    """(the first position decoded, the set of each cell decoded) of the one sequence decoded."""
    (seq,) = {seq for seq, _, _ in runner.placed}
    positions = [(pos, adapters) for s, pos, adapters in runner.placed if s == seq]
    return positions[0][0], [adapters for _, adapters in positions]


def test_the_base_s_cells_before_an_invocation_are_reused_and_the_alora_s_never() -> None:
    """A session under the aLoRA reuses the cells another one left before that one's invocation
    (computed under the base), not those after it, up to its own invocation; a base session
    sending the same prompt then reuses the cells before that invocation, never the aLoRA's."""
    executor, runner = _server()
    head = (BOS, *range(20, 60))
    first = _open(executor, (*head, 7, 8, 9))  # the adapter from position 41
    run_until(executor, turn_ends(first))
    executor.close(1)
    runner.placed.clear()
    second = _open(executor, (*head, 7, 8, 6, 7, 8, 9))  # the adapter from position 44
    run_until(executor, turn_ends(second))
    start, cells = _placed_from(runner)
    assert not second.of(SessionFailed) and second.of(TurnEndEvent)[0].cached_tokens == 41
    assert start == 41 and cells[:3] == [()] * 3 and set(cells[3:]) == {ACT}
    executor.close(2)
    runner.placed.clear()
    base = _open(executor, (*head, 7, 8, 6, 7, 8, 9), adapters=())  # the second's prompt, on the base
    run_until(executor, turn_ends(base))
    start, cells = _placed_from(runner)
    assert base.of(TurnEndEvent)[0].cached_tokens == 44 and start == 44 and set(cells) == {()}
