"""A stream with n > 1 whose client stops reading gives up every slot it holds, its
forked samples' and its reserved ones, to a caller that waits; read again, it gets them
all back and each sample continues its reply token for token as without the preemption,
its sampler fed each token once (engine/executor/admission.py, on the fake runner).

Issue 39: an unread n = 4 stream held all 4 slots of a `-np 4` server; another caller
waited for `--reader-timeout` (forever with 0): preemption skipped sessions with n > 1.
Sits beside test_preemption_fake.py (the n = 1 cases), which is near the size limit."""

from __future__ import annotations

from dataclasses import replace

from llmserve.service.domain.events import FinishReason, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams, SessionParams, StoppingParams
from llmserve.service.engine.executor.executor import Executor

from .engine_harness import ReaderSink, assert_kv_mirrors_slots, make, run_until, steps, turn_ends
from .fake_runner import BOS, FakeRunner

N = 3
SEED = 11


def n_params(max_tokens: int = 24, ignore_eos: bool = True, n: int = N) -> SessionParams:
    return SessionParams("test", SamplingParams(temperature=0.8, seed=SEED), StoppingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
                         num_samples=n)


def waiter_params(max_tokens: int = 3) -> SessionParams:
    return SessionParams("test", SamplingParams(temperature=0.8, seed=99), StoppingParams(max_tokens=max_tokens, ignore_eos=True))


def replies(sink: ReaderSink, n: int = N) -> list[list[int]]:
    return [sink.token_ids(i) for i in range(n)]


def histories(runner: FakeRunner) -> dict[int, list[list[int]]]:
    """Each of the n-session's samplers' history, by seed (the waiter's seed is 99)."""
    by_seed: dict[int, list[list[int]]] = {}
    for sampler in runner.samplers:
        if sampler.params.seed != 99:
            by_seed.setdefault(sampler.params.seed, []).append(sampler.history)
    return by_seed


def reference(prompt: tuple[int, ...], p: SessionParams, turns: tuple[tuple[int, ...], ...] = ()) -> tuple[list[list[int]], dict]:  # type: ignore[type-arg]
    """Every sample's reply, and the samplers' histories, with nobody preempted."""
    executor, runner = make(n_parallel=N, idle_grace_s=0.0)
    sink = ReaderSink()
    key = executor.open_session(p, sink)
    executor.add_input(key, prompt, True)
    run_until(executor, turn_ends(sink))
    for i, more in enumerate(turns, start=2):
        executor.add_input(key, more, True)
        run_until(executor, turn_ends(sink, i))
    return replies(sink, p.num_samples), histories(runner)


def wait_and_serve(executor: Executor, max_tokens: int = 3) -> tuple[ReaderSink, int]:
    """Another caller with n = 1 comes and gets its reply; returns its sink and key."""
    waiter = ReaderSink()
    key = executor.open_session(waiter_params(max_tokens), waiter)
    executor.add_input(key, (BOS, 50, 51), True)
    run_until(executor, turn_ends(waiter), max_steps=50)
    assert waiter.of(TurnEndEvent)[0].finish_reason == FinishReason.LENGTH
    return waiter, key


def held(executor: Executor, key: int) -> int:
    return executor.table.sessions[key].num_slots_held


def preempt_and_read_again(executor: Executor, key: int, slow: ReaderSink) -> None:
    """The client stops reading; a waiter gets a slot, as the stream gives all of its up,
    and leaves; the stream waits without running until it is read again, then ends its turn."""
    slow.stop_reading()
    _, waiter_key = wait_and_serve(executor)
    session = executor.table.sessions[key]
    assert held(executor, key) == 0 and all(s.slot is None for s in session.samples) and not session.reserved
    assert executor.table.admission.num_preempted == 1
    executor.close(waiter_key)
    num_ends = len(slow.of(TurnEndEvent))
    steps(executor, 5)
    assert len(slow.of(TurnEndEvent)) == num_ends  # nobody reads it: it waits, it does not run
    slow.read_all()
    run_until(executor, turn_ends(slow))


PROMPT = (BOS, 5, 6, 7)


def test_an_unread_stream_of_n_samples_gives_every_slot_to_a_waiter_then_each_sample_finishes_its_reply() -> None:
    executor, runner = make(n_parallel=N, idle_grace_s=0.0)
    slow = ReaderSink()
    key = executor.open_session(n_params(), slow)
    executor.add_input(key, PROMPT, True)
    steps(executor, 6)  # prefill and fork, then a few tokens of each sample
    assert all(0 < len(r) < 24 for r in replies(slow)) and held(executor, key) == N
    preempt_and_read_again(executor, key, slow)
    ids, want = reference(PROMPT, n_params())
    assert replies(slow) == ids  # each sample's tokens continue: nothing lost, nothing twice
    assert histories(runner) == want
    ends = slow.of(TurnEndEvent)
    assert sorted(e.index for e in ends) == list(range(N)) and [e.final for e in ends].count(True) == 1
    assert all(e.completion_tokens == 24 and e.prompt_tokens == len(PROMPT) for e in ends)
    assert held(executor, key) == N  # the main slot and the reserved ones for the next turn
    assert_kv_mirrors_slots(executor, runner)


def test_a_stream_paused_before_its_turn_forked_forks_once_it_has_its_slots_again() -> None:
    executor, runner = make(n_parallel=N, idle_grace_s=0.0)
    prompt = (BOS, *range(3, 63), *range(3, 63))  # longer than n_batch: the prompt takes steps
    slow = ReaderSink()
    key = executor.open_session(n_params(max_tokens=8), slow)
    executor.add_input(key, prompt, True)
    steps(executor, 1)
    session = executor.table.sessions[key]
    assert not session.forked and len(session.reserved) == N - 1
    preempt_and_read_again(executor, key, slow)
    ids, want = reference(prompt, n_params(max_tokens=8))
    assert replies(slow) == ids and histories(runner) == want
    assert_kv_mirrors_slots(executor, runner)


def test_a_stream_some_of_whose_samples_ended_gets_back_as_many_slots_as_it_has_samples() -> None:
    """Without ignore_eos the fake's samples reach EOG at different steps: an ended sample's
    slot is reserved for the next turn; preempted and back, the session holds n again."""
    executor, runner = make(n_parallel=N, idle_grace_s=0.0)
    p = n_params(max_tokens=40, ignore_eos=False)
    prompt = (BOS, 30)
    slow = ReaderSink()
    key = executor.open_session(p, slow)
    executor.add_input(key, prompt, True)
    executor.drain(block=False)
    session = executor.table.sessions[key]
    run_until(executor, lambda: session.forked and session.samples_open < N)
    assert 1 <= session.samples_open < N  # the test's premise: some samples ended, some not
    preempt_and_read_again(executor, key, slow)
    ids, _ = reference(prompt, p)
    assert replies(slow) == ids
    assert held(executor, key) == N and len(session.reserved) == N - 1
    executor.add_input(key, (20,), True)  # the next turn forks onto the slots it got back
    run_until(executor, turn_ends(slow, 2))
    assert sorted(e.index for e in slow.of(TurnEndEvent)) == sorted([*range(N)] * 2)
    assert_kv_mirrors_slots(executor, runner)


def test_a_stream_of_n_samples_idle_between_turns_gives_its_slots_up_and_its_next_turn_continues() -> None:
    executor, runner = make(n_parallel=N, idle_grace_s=0.0)
    slow = ReaderSink()
    p = n_params(max_tokens=5)
    key = executor.open_session(p, slow)
    executor.add_input(key, PROMPT, True)
    run_until(executor, turn_ends(slow))
    _, waiter_key = wait_and_serve(executor)  # the client still reads: idle, not paused
    assert held(executor, key) == 0 and executor.table.admission.num_preempted == 1
    executor.close(waiter_key)
    executor.add_input(key, (20, 21), True)
    run_until(executor, turn_ends(slow, 2))
    ids, _ = reference(PROMPT, p, turns=((20, 21),))
    assert replies(slow) == ids
    assert_kv_mirrors_slots(executor, runner)


def test_a_cancel_while_preempted_ends_every_sample_and_the_next_turn_has_all_its_slots() -> None:
    executor, runner = make(n_parallel=N, idle_grace_s=0.0)
    slow = ReaderSink()
    key = executor.open_session(n_params(max_tokens=30), slow)
    executor.add_input(key, PROMPT, True)
    steps(executor, 4)
    slow.stop_reading()
    _, waiter_key = wait_and_serve(executor)
    executor.cancel(key)
    executor.drain(block=False)
    ends = slow.of(TurnEndEvent)
    assert sorted(e.index for e in ends) == list(range(N)) and {e.finish_reason for e in ends} == {FinishReason.CANCELLED}
    executor.close(waiter_key)
    slow.read_all()
    executor.add_input(key, (20,), True)
    run_until(executor, turn_ends(slow, 2))
    second = slow.of(TurnEndEvent)[N:]
    assert sorted(e.index for e in second) == list(range(N)) and all(e.completion_tokens == 30 for e in second)
    assert held(executor, key) == N
    assert_kv_mirrors_slots(executor, runner)


def test_nobody_gives_a_slot_up_when_that_would_not_free_enough() -> None:
    """A waiter with n = 3 and only one paused stream beside a read one: preempting the
    paused one would not seat the waiter, so it keeps its slot."""
    executor, _ = make(n_parallel=2, idle_grace_s=0.0)
    paused, reading = ReaderSink(), ReaderSink()
    paused_key = executor.open_session(replace(n_params(max_tokens=200), num_samples=1), paused)
    executor.add_input(paused_key, PROMPT, True)
    reading_key = executor.open_session(replace(n_params(max_tokens=200), num_samples=1), reading)
    executor.add_input(reading_key, (BOS, 20), True)
    steps(executor, 3)
    paused.stop_reading()
    waiter = ReaderSink()
    executor.add_input(executor.open_session(replace(n_params(max_tokens=2), num_samples=2), waiter), (BOS, 40), True)
    steps(executor, 3)
    assert executor.table.admission.num_preempted == 0 and held(executor, paused_key) == 1

