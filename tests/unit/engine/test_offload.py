"""OffloadPool (heavy unary work) and ConstraintCache (compiled grammars by content), and
the statuses their refusals become: RESOURCE_EXHAUSTED with RetryInfo, never INVALID_ARGUMENT."""

from __future__ import annotations

import os
import threading
from concurrent.futures import wait

import grpc
import pytest
from google.rpc import error_details_pb2
from llmserve.service.domain.errors import GrammarError, Overloaded, StorageFault
from llmserve.service.engine.constraints import ConstraintCache
from llmserve.service.engine.offload import OffloadPool
from llmserve.service.metrics import Metrics
from llmserve.service.model.grammar_compiler import CompilerBusy
from llmserve.service.transport.errors import from_domain


def test_offload_refuses_past_its_queue_with_a_retry_hint() -> None:
    pool = OffloadPool("test", num_threads=1, max_waiting=2)
    gate = threading.Event()
    running = [pool.submit(gate.wait, 10) for _ in range(3)]  # one runs, two wait
    with pytest.raises(Overloaded) as refused:
        pool.submit(gate.wait, 10)
    assert refused.value.retry_after_s > 0
    admitted = pool.submit(gate.wait, 10, may_refuse=False)  # a session's own input waits its turn
    gate.set()
    wait([*running, admitted], timeout=10)
    assert pool.num_pending == 0
    assert pool.submit(lambda: 7).result(timeout=10) == 7
    pool.close()


def test_offload_runs_the_smallest_waiting_job_first() -> None:
    pool = OffloadPool("test", num_threads=1, max_waiting=8)
    gate, order = threading.Event(), []
    running = pool.submit(gate.wait, 10)  # holds the thread
    jobs = [pool.submit(order.append, name, size=size) for name, size in (("large", 10**6), ("small", 10), ("mid", 10**3))]
    gate.set()
    wait([running, *jobs], timeout=10)
    assert order == ["small", "mid", "large"]
    pool.close()


def test_offload_threads_run_at_a_lower_priority() -> None:
    pool = OffloadPool("test", num_threads=1, max_waiting=1, nice=5)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    theirs = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result(timeout=10)
    assert theirs == min(19, mine + 5)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # only that thread
    pool.close()


class _Compiled:
    def __init__(self, gbnf: str) -> None:
        self.gbnf = gbnf


class _FakeCompiler:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def compile(self, kind: str, text: str) -> _Compiled:
        self.calls.append(text)
        self.gate.wait(10)
        if text == "bad":
            raise GrammarError("the grammar does not parse")
        if text == "busy":
            raise CompilerBusy("busy", retry_after_s=1.0)
        return _Compiled(f"root ::= {text}")

    def close(self) -> None:
        pass


def _count(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("llmserve_constraint_cache_total", {"result": result}) or 0.0


def test_constraint_cache_compiles_a_text_once() -> None:
    compiler, metrics = _FakeCompiler(), Metrics()
    cache = ConstraintCache(compiler, metrics, max_entries=2)  # type: ignore[arg-type]
    compiler.gate.clear()
    first, joined = cache.get("grammar", "a"), cache.get("grammar", "a")  # the second joins the first
    compiler.gate.set()
    assert first.result(10)[0] == joined.result(10)[0] == "root ::= a"
    assert cache.get("grammar", "a").result(10)[1] is first.result()[1]  # kept
    assert compiler.calls == ["a"]
    assert (_count(metrics, "miss"), _count(metrics, "shared"), _count(metrics, "hit")) == (1, 1, 1)
    for _ in range(2):  # a refusal of the text is kept too; overload never is
        with pytest.raises(GrammarError):
            cache.get("grammar", "bad").result(10)
        with pytest.raises(Overloaded):
            cache.get("grammar", "busy").result(10)
    assert compiler.calls == ["a", "bad", "busy", "busy"]
    cache.get("grammar", "b").result(10)
    cache.get("grammar", "c").result(10)  # LRU of 2 entries: "a" is out
    cache.get("grammar", "a").result(10)
    assert compiler.calls.count("a") == 2
    cache.close()


def test_constraint_cache_refuses_past_its_queue() -> None:
    compiler = _FakeCompiler()
    cache = ConstraintCache(compiler, Metrics(), max_waiting=1)  # type: ignore[arg-type]
    compiler.gate.clear()
    cache.get("grammar", "x1")
    cache.get("grammar", "x2")
    with pytest.raises(Overloaded):
        cache.get("grammar", "x3")
    cache.get("grammar", "x1")  # an identical text joins: not refused
    compiler.gate.set()
    cache.close()


def test_refusals_map_to_statuses_that_say_whose_fault() -> None:
    busy = from_domain(Overloaded("busy", retry_after_s=2.0)).to_status()
    assert busy.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(busy.trailing_metadata)["grpc-retry-pushback-ms"] == "2000"
    storage = from_domain(StorageFault("--session-dir '/x' is unusable", "/x", retry_after_s=5.0)).to_status()
    assert storage.code == grpc.StatusCode.FAILED_PRECONDITION
    status = dict(storage.trailing_metadata)["grpc-status-details-bin"]
    from google.rpc import status_pb2

    details = status_pb2.Status.FromString(status).details
    failure = error_details_pb2.PreconditionFailure()
    assert details[0].Unpack(failure) and failure.violations[0].subject == "/x"
    assert not any(d.type_url.endswith("BadRequest") for d in details)  # not the request's fault


def test_a_compile_nobody_waits_for_is_dropped_before_it_starts() -> None:
    compiler = _FakeCompiler()
    cache = ConstraintCache(compiler, Metrics())  # type: ignore[arg-type]
    compiler.gate.clear()
    running = cache.get("grammar", "first")  # holds the worker
    left, stays = cache.get("grammar", "gone"), cache.get("grammar", "kept")
    joined = cache.get("grammar", "gone")  # a second caller of the same text
    left.cancel()
    assert not joined.cancelled()  # the other caller still waits: the compile stays queued
    joined.cancel()
    compiler.gate.set()
    assert running.result(10)[0] == "root ::= first" and stays.result(10)[0] == "root ::= kept"
    assert compiler.calls == ["first", "kept"]  # "gone" never ran: its callers had all left
    cache.close()


def test_a_small_constraint_never_waits_behind_large_ones() -> None:
    large, small = _FakeCompiler(), _FakeCompiler()
    cache = ConstraintCache(large, Metrics(), small_compiler=small)  # type: ignore[arg-type]
    large.gate.clear()  # a large compile runs and more wait behind it
    queued = [cache.get("json_schema", "x" * 5000 + str(i)) for i in range(3)]
    assert cache.get("choice", "yes").result(10)[0] == "root ::= yes"
    assert small.calls == ["yes"] and not any(f.done() for f in queued)
    large.gate.set()
    assert all(f.result(10) for f in queued)
    cache.close()
