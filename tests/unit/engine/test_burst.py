"""A burst of requests prefilled together: the arrivals the surfaces count
(engine/arrivals.py) and the idle executor's bounded wait for them (executor/burst.py)."""

from __future__ import annotations

import threading
import time

from llmserve.service.domain.arrivals import Arrivals, opened
from llmserve.service.engine.executor import burst
from llmserve.service.engine.executor.burst import burst_wait_s

from .engine_harness import ListSink, make, params


def test_a_call_is_arriving_until_it_opens_a_session_or_ends() -> None:
    arrivals = Arrivals()
    assert not arrivals.recent(time.monotonic(), 1.0)
    with arrivals.arriving():
        assert arrivals.recent(time.monotonic(), 1.0)
        assert not arrivals.recent(time.monotonic() + 2.0, 1.0)  # older than the window: a slow client
        opened()
        assert not arrivals.recent(time.monotonic(), 1.0)
        opened()  # once is enough; again changes nothing
    with arrivals.arriving():
        pass
    assert not arrivals.recent(time.monotonic(), 1.0)
    opened()  # outside a call: nothing to do


def test_an_idle_executor_waits_only_while_calls_arrive_and_within_its_bound() -> None:
    executor, _ = make()
    arrivals = executor.arrivals
    now = time.monotonic()
    assert burst_wait_s(arrivals, [], now, 0.1) == 0.0  # a lone request: no wait
    with arrivals.arriving():
        wait = burst_wait_s(arrivals, [], now, 0.1)
        assert 0.0 < wait <= burst.GATHER_SHARE * 0.1
        assert burst_wait_s(arrivals, [], now - 1.0, 0.1) == 0.0  # the bound has passed
    key = executor.open_session(params(max_tokens=2), ListSink())
    executor.drain(block=False)
    sessions = executor.table.sessions.values()
    assert burst_wait_s(arrivals, sessions, time.monotonic(), 0.1) > 0.0  # opened, its input still coming
    executor.add_input(key, (5, 6, 7), True)
    executor.drain(block=False)
    assert burst_wait_s(arrivals, sessions, time.monotonic(), 0.1) == 0.0


def test_a_burst_arriving_while_the_first_prompt_waits_shares_its_step() -> None:
    """Three calls begin; the first one's input reaches the thread at once, the others
    a few milliseconds later: the first step prefills all three."""
    executor, runner = make(n_parallel=4)
    executor._step_s = 0.2  # a bound of 50 ms, far above the others' lateness
    arrivals = executor.arrivals
    sinks = [ListSink() for _ in range(3)]
    ready = threading.Event()

    def late_calls() -> None:
        with arrivals.arriving(), arrivals.arriving():
            ready.set()
            time.sleep(0.01)
            for sink, prompt in zip(sinks[1:], ((8, 9, 10), (11, 12, 13))):
                executor.add_input(executor.open_session(params(max_tokens=1), sink), prompt, True)
            time.sleep(0.05)

    first = executor.open_session(params(max_tokens=1), sinks[0])
    executor.add_input(first, (5, 6, 7), True)
    caller = threading.Thread(target=late_calls)
    caller.start()
    ready.wait()
    executor.drain(block=False)
    assert executor._gather_burst()
    executor.step()
    caller.join()
    assert runner.num_decodes == 1
    assert all(sink.token_ids() for sink in sinks), "each prompt got its first token from the first step"
