"""LoRA adapters in the executor, on the fake runner: one adapter set per decode, turns that
rotate fairly, a prefix cache keyed by adapter (the fake's KV remembers the set each
sequence's cells were computed under and fails a decode that mixes them), loads and
unloads in queue order with the sessions."""

from __future__ import annotations

import json
from dataclasses import replace

from llmserve.service.config import PrefillSettings
from llmserve.service.domain.errors import FailureKind
from llmserve.service.domain.events import SessionFailed, TurnEndEvent
from llmserve.service.domain.requests import AdapterSet, adapter_set
from llmserve.service.domain.snapshots import SavedSession
from llmserve.service.engine.commands import LoadAdapter, UnloadAdapter
from llmserve.service.engine.executor.adapter_residency import AdapterResidency
from llmserve.service.engine.executor.scheduler import SeqDemand
from llmserve.service.engine.executor.step_rotation import GroupTurn, StepRotation

from .engine_harness import (
    SERVER_PREFILL,
    ListSink,
    ReaderSink,
    assert_kv_mirrors_slots,
    make,
    params,
    run_until,
    steps,
    turn_ends,
)
from .fake_runner import BOS

A: AdapterSet = (("a", 1.0),)
B: AdapterSet = (("b", 0.5),)


def _loaded(*names: str, prefill: PrefillSettings = SERVER_PREFILL):  # type: ignore[no-untyped-def]
    executor, runner = make(n_parallel=8, prefill=prefill)
    results: list[object] = []
    for name in names:
        executor.adapter_command(LoadAdapter(name, f"/adapters/{name}", results.append))
    executor.drain(block=False)
    assert all(not isinstance(r, Exception) for r in results), results
    return executor, runner


def _open(executor, adapters: AdapterSet, prompt: tuple[int, ...], max_tokens: int = 6) -> ListSink:  # type: ignore[no-untyped-def]
    sink = ListSink()
    key = executor.open_session(replace(params(max_tokens=max_tokens), adapters=adapters), sink)
    executor.add_input(key, prompt, True)
    return sink


def test_adapter_set_is_one_spelling() -> None:
    assert adapter_set([("b", 1), ("a", 0.5), ("c", 0.0)]) == (("a", 0.5), ("b", 1.0))
    assert adapter_set([("a", 0.0)]) == ()  # scale 0 computes what the base does


def test_sessions_under_different_adapters_never_share_a_decode() -> None:
    """Three sets (the base among them) decode side by side: every decode runs one set (the
    fake fails a row beside cells of another set), each session ends its turn, and each
    set's output is what it gives alone (the fake's model ignores adapters)."""
    executor, runner = _loaded("a", "b")
    sinks = {adapters: [_open(executor, adapters, (BOS, 10 + i)) for i in range(2)] for adapters in ((), A, B)}
    run_until(executor, lambda: all(turn_ends(s)() for group in sinks.values() for s in group))
    for group in sinks.values():
        for s in group:
            assert not s.of(SessionFailed)
            assert s.token_ids() == list(range(int(s.token_ids()[0]), int(s.token_ids()[0]) + 6))
    assert runner.num_adapter_switches >= 3
    assert_kv_mirrors_slots(executor, runner)


def test_a_prefix_cached_under_one_adapter_is_not_reused_under_another() -> None:
    executor, runner = _loaded("a")
    prompt = (BOS, *range(3, 30))
    first = _open(executor, A, prompt, max_tokens=2)
    run_until(executor, turn_ends(first))
    executor.close(1)  # its slot goes idle, caching the prompt under A
    base = _open(executor, (), prompt, max_tokens=2)  # the fake fails the decode if A's cells were reused
    run_until(executor, turn_ends(base))
    assert base.of(TurnEndEvent)[0].cached_tokens == 0
    executor.close(2)  # the base session ends: its slot caches the prompt, under the base
    again = _open(executor, (), prompt, max_tokens=2)
    run_until(executor, turn_ends(again))
    assert again.of(TurnEndEvent)[0].cached_tokens > 0  # under the same set it is reused
    assert_kv_mirrors_slots(executor, runner)


def test_unknown_or_unloading_adapters_are_refused_and_unload_waits_for_the_running() -> None:
    executor, runner = _loaded("a")
    unknown = _open(executor, B, (BOS, 5))
    running = _open(executor, A, (BOS, 5), max_tokens=20)
    steps(executor, 2)
    assert "not loaded" in unknown.of(SessionFailed)[0].message
    answers: list[object] = []
    freed: list[str] = []
    executor.adapter_command(UnloadAdapter("a", answers.append, freed.append))
    late = _open(executor, A, (BOS, 6))
    steps(executor, 1)
    assert answers == [False] and not freed
    assert "being unloaded" in late.of(SessionFailed)[0].message
    run_until(executor, turn_ends(running))
    assert not running.of(SessionFailed)
    executor.close(1 + 1)  # the running session's stream ends (keys count from 1: unknown, running)
    run_until(executor, lambda: bool(freed))
    assert freed == ["a"] and "a" not in runner.loaded_adapters


def test_a_load_the_runner_refuses_is_an_answer_not_a_fault() -> None:
    executor, runner = make()
    answers: list[object] = []
    executor.adapter_command(LoadAdapter("x", "/adapters/bad.gguf", answers.append))
    executor.drain(block=False)
    assert isinstance(answers[0], ValueError) and "x" not in runner.loaded_adapters


def test_a_saved_session_under_another_adapter_prefills_again() -> None:
    """A named session's KV is reused only under the adapters it was computed under."""
    executor, runner = _loaded("a")
    history = (BOS, *range(10, 20))
    state = json.dumps({"tokens": list(history), "min": 0, "adapters": [["a", 1.0]]}).encode()
    sink = ListSink()
    saved = SavedSession("s", history, (), None, state, A)
    key = executor.open_session(replace(params(max_tokens=2), session_id="s"), sink, restore=saved)
    executor.add_input(key, (21,), True)
    run_until(executor, turn_ends(sink))  # under the base: the fake fails a decode beside A's cells
    assert not sink.of(SessionFailed)
    assert_kv_mirrors_slots(executor, runner)


def _demand(key: int, adapters: AdapterSet) -> SeqDemand:
    return SeqDemand(key, True, 0, adapters=adapters)


def test_rotation_serves_every_set_within_its_bound() -> None:
    """Round robin, one step each: with three sets a set waits two steps at most."""
    rotation = StepRotation()
    demands = [_demand(1, ()), _demand(2, A), _demand(3, A), _demand(4, B)]
    waits = {(): 0, A: 0, B: 0}
    longest = dict(waits)
    for _ in range(30):
        turn = rotation.choose(demands)
        assert {d.adapters for d in turn.demands} == {turn.group[0]}
        assert (turn.num_groups, turn.others_decode) == (3, True)
        rotation.record(turn.group)
        for s in waits:
            waits[s] = 0 if s == turn.group[0] else waits[s] + 1
            longest[s] = max(longest[s], waits[s])
    assert max(longest.values()) == 2
    one = [_demand(1, A), _demand(2, A)]
    assert rotation.choose(one) == GroupTurn((A, -1), one)  # one set: nothing filtered, nobody else decodes
    prompt_only = SeqDemand(5, False, 40, adapters=B)
    assert rotation.choose([prompt_only, SeqDemand(6, False, 40)]).others_decode is False  # nobody decodes


def test_an_adapters_prompt_is_paced_while_other_sets_decode() -> None:
    """A long prompt under an adapter while base sessions decode: each of its steps carries
    at most the prefill budget (as a prompt beside decoding sessions of its own set would),
    not the whole batch, which would stall the base's streams for its whole prefill."""
    executor, runner = _loaded("a", prefill=PrefillSettings(prefill_budget=16))
    base = [_open(executor, (), (BOS, 10 + i), max_tokens=120) for i in range(2)]
    run_until(executor, lambda: all(s.token_ids() for s in base))
    long = _open(executor, A, (BOS, *range(20, 220)), max_tokens=2)
    chunks: list[int] = []
    while not turn_ends(long)():
        placed = len(runner.placed)
        steps(executor, 1)
        chunk = [cell for cell in runner.placed[placed:] if cell[2] == A]
        chunks += [len(chunk)] if chunk else []
    assert not any(turn_ends(s)() for s in base)  # the base decoded all along
    assert max(chunks) <= 16 and sum(chunks) >= 200, chunks


def test_sets_beyond_max_loras_per_batch_wait_and_none_starves() -> None:
    """--max-loras-per-batch 2: one adapter at three scales (three sets) and the base. The
    third set's session waits until one of the first two has nothing left to run, so no
    step ever runs beside more than two sets; a later session of a running set queued
    behind it waits too (else a busy set could hold the bound forever); the base goes on;
    every session ends its turn."""
    executor, _ = _loaded("a")
    executor.table.admission.max_sets = 2
    sets = [(("a", 1.0),), (("a", 0.5),), (("a", 0.25),)]
    first = [_open(executor, s, (BOS, 10 + i), max_tokens=4) for i, s in enumerate(sets)]
    base = _open(executor, (), (BOS, 20), max_tokens=4)
    late = _open(executor, sets[0], (BOS, 30), max_tokens=4)
    sinks = (*first, base, late)
    running: list[set[AdapterSet]] = []
    seated: dict[int, int] = {}  # session key (1-5, in open order) -> the step it got a slot
    for step in range(200):
        executor.drain(block=False)
        if all(turn_ends(s)() for s in sinks):
            break
        executor.step()
        running.append(executor.table.admission.running_sets())
        seated.update({k: step for k, s in executor.table.sessions.items() if s.main.slot is not None and k not in seated})
    assert all(not s.of(SessionFailed) and len(s.token_ids()) == 4 for s in sinks)
    assert max(len(r) for r in running) == 2
    assert seated[1] == seated[2] == seated[4] == 0  # two sets and the base at once
    assert seated[3] > 0  # the third set waited
    assert seated[5] >= seated[3]  # the running set's later session did not pass it


def test_a_stream_nobody_reads_does_not_hold_its_set_against_others() -> None:
    """--max-loras-per-batch 1: a session under one set whose client stopped reading takes
    no steps, so a session under another set is seated beside it and runs."""
    executor, _ = _loaded("a")
    executor.table.admission.max_sets = 1
    unread = ReaderSink()
    key = executor.open_session(replace(params(max_tokens=50), adapters=(("a", 1.0),)), unread)
    executor.add_input(key, (BOS, 10), True)
    run_until(executor, lambda: len(unread.token_ids()) >= 2)
    unread.stop_reading()
    other = _open(executor, (("a", 0.5),), (BOS, 11), max_tokens=4)
    run_until(executor, turn_ends(other), max_steps=100)
    assert len(other.token_ids()) == 4 and not other.of(SessionFailed)


def test_beyond_max_loras_the_least_recently_named_idle_adapter_is_evicted() -> None:
    """--max-loras 2 with three adapters: a third load evicts the idle one named longest ago,
    which loads again when a session names it; never more than two resident."""
    executor, runner = make(n_parallel=4)
    executor.table.adapters.max_loras = 2
    results: list[object] = []
    for name in ("a", "b"):
        executor.adapter_command(LoadAdapter(name, f"/adapters/{name}", results.append))
    executor.drain(block=False)
    run_until(executor, turn_ends(_open(executor, B, (BOS, 5), max_tokens=2)))
    run_until(executor, turn_ends(_open(executor, A, (BOS, 5), max_tokens=2)))  # a named last
    executor.close(1)
    executor.close(2)  # both idle
    executor.adapter_command(LoadAdapter("c", "/adapters/c", results.append))
    executor.drain(block=False)
    assert runner.loaded_adapters == {"a", "c"}  # b evicted: named least recently
    again = _open(executor, B, (BOS, 6), max_tokens=2)
    run_until(executor, turn_ends(again))
    assert not again.of(SessionFailed) and "b" in runner.loaded_adapters and len(runner.loaded_adapters) == 2
    assert not [r for r in results if isinstance(r, Exception)]


def test_with_every_resident_adapter_in_use_a_new_one_is_refused_busy() -> None:
    executor, runner = make(n_parallel=4)
    executor.table.adapters.max_loras = 1
    answers: list[object] = []
    executor.adapter_command(LoadAdapter("a", "/adapters/a", answers.append))
    executor.adapter_command(LoadAdapter("b", "/adapters/b", answers.append))  # no room: available
    executor.drain(block=False)
    running = _open(executor, A, (BOS, 5), max_tokens=30)
    steps(executor, 2)
    refused = _open(executor, (("b", 1.0),), (BOS, 6))
    steps(executor, 1)
    failure = refused.of(SessionFailed)[0]
    assert failure.kind == FailureKind.BUSY and "--max-loras" in failure.message
    run_until(executor, turn_ends(running))
    freed: list[str] = []
    executor.adapter_command(UnloadAdapter("b", answers.append, freed.append))  # available: freed at once
    executor.drain(block=False)
    assert freed == ["b"] and runner.loaded_adapters == {"a"}


def test_lora_adapters_beyond_max_loras_at_start_are_available_and_load_when_named() -> None:
    """--lora a --lora b --lora c with --max-loras 1: the runner loaded all three at start;
    the first stays resident, the other two are unloaded (available, their checked files
    kept) and load when a session names them, evicting the idle resident one."""
    executor, runner = make(n_parallel=4)
    for name in ("a", "b", "c"):
        runner.load_adapter(name, f"/adapters/{name}")
    executor.table.adapters = AdapterResidency(runner, ("a", "b", "c"), max_loras=1)  # type: ignore[arg-type]
    assert runner.loaded_adapters == {"a"} and set(executor.table.adapters.available) == {"b", "c"}
    under_b = _open(executor, B, (BOS, 5), max_tokens=2)
    run_until(executor, turn_ends(under_b))
    assert not under_b.of(SessionFailed) and runner.loaded_adapters == {"b"}
    assert runner.adapter_files["b"] == "/adapters/b"  # the file checked at start, loaded again
