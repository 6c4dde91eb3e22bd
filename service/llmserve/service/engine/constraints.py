"""Compiled constraints (GBNF grammars, JSON schemas), kept by content.

Every tool-calling request repeats its tools' schemas, so `ConstraintCache` keeps the
compiled grammar of a (kind, text) in an LRU (by count and by bytes): a repeated
constraint compiles once. Identical texts that arrive while one compiles share that
compile. A refusal of the text itself (`GrammarError`: it does not parse, or it needs
more than the worker's CPU or memory budget) is kept too, so a pathological text costs
the grammar worker once; `Overloaded` (the machine was busy) is never kept.

Compiles run in two lanes, each an `OffloadPool` of one thread with a grammar worker of
its own: texts up to `SMALL_TEXT_CHARS` in one, larger ones in the other, so a flood of
large schemas never holds up a small constraint (it waits only for other small ones). In
each lane at most `max_waiting` distinct texts wait, more are `Overloaded` with a retry
hint, never blamed on the request. Each caller gets a future of its own: a caller that leaves
cancels it, and a compile nobody waits for any more is dropped if it has not started
(one that runs finishes within the worker's CPU budget, and is kept).
`llmserve_constraint_cache_total{result}` counts hit, shared, miss and refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError

from ..domain.errors import GrammarError, Overloaded
from ..metrics import Metrics
from ..model.grammar_compiler import CompilerBusy, GrammarCompiler
from .offload import OffloadPool

Key = tuple[str, str]
Compiled = tuple[str, object]  # (GBNF, the parsed grammar samplers clone)


SMALL_TEXT_CHARS = 4096


class _Compile:
    """A compile in progress and how many callers still wait for it (under the cache's lock)."""

    def __init__(self, future: Future[Compiled]) -> None:
        self.future = future
        self.num_waiting = 0


class ConstraintCache:
    def __init__(
        self, compiler: GrammarCompiler, metrics: Metrics, max_entries: int = 256, max_bytes: int = 64 << 20,
        max_waiting: int = 64, small_compiler: GrammarCompiler | None = None,
    ) -> None:
        """`small_compiler`: the small texts' lane's worker (None: one lane, `compiler`'s)."""
        self.metrics = metrics
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._compilers = (compiler, small_compiler or compiler)
        self._pools = (OffloadPool("grammar compile", 1, max_waiting),)
        if small_compiler is not None:
            self._pools += (OffloadPool("small grammar compile", 1, max_waiting),)
        self._lock = threading.Lock()
        self._kept: OrderedDict[Key, Compiled | GrammarError] = OrderedDict()
        self._num_bytes = 0
        self._running: dict[Key, _Compile] = {}
        for result in ("hit", "shared", "miss", "refused"):
            metrics.constraint_cache.labels(result)  # exported at 0 from the start

    def get(self, kind: str, text: str) -> Future[Compiled]:
        """The compiled constraint, when ready: at once if kept. Overloaded now if too many
        compiles wait in its lane (the future too, when the grammar worker found the machine
        too busy). The future is the caller's own: cancel it when the caller leaves."""
        key = (kind, text)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self.metrics.constraint_cache.labels("hit").inc()
                return _resolved(kept)
            running = self._running.get(key)
            if running is not None:
                self.metrics.constraint_cache.labels("shared").inc()
            else:
                small = len(text) <= SMALL_TEXT_CHARS and len(self._pools) > 1
                try:
                    running = _Compile(self._pools[small].submit(self._compile, key, self._compilers[small]))
                except Overloaded:
                    self.metrics.constraint_cache.labels("refused").inc()
                    raise
                self._running[key] = running
                self.metrics.constraint_cache.labels("miss").inc()
            running.num_waiting += 1
        return self._follow(key, running)

    def _follow(self, key: Key, running: _Compile) -> Future[Compiled]:
        """A caller's future that completes with the shared compile."""
        mine: Future[Compiled] = Future()

        def settle(shared: Future[Compiled]) -> None:
            try:
                if shared.cancelled():
                    mine.cancel()
                elif (error := shared.exception()) is not None:
                    mine.set_exception(error)
                else:
                    mine.set_result(shared.result())
            except InvalidStateError:  # the caller left first
                pass

        def left(f: Future[Compiled]) -> None:
            if f.cancelled():
                self._leave(key, running)

        mine.add_done_callback(left)
        running.future.add_done_callback(settle)
        return mine

    def _leave(self, key: Key, running: _Compile) -> None:
        """A caller left: with nobody else waiting, a compile that has not started is dropped."""
        with self._lock:
            running.num_waiting -= 1
            if running.num_waiting == 0 and self._running.get(key) is running and running.future.cancel():
                del self._running[key]

    def _compile(self, key: Key, compiler: GrammarCompiler) -> Compiled:
        try:
            compiled = compiler.compile(*key)
        except GrammarError as exc:
            self._finish(key, GrammarError(str(exc), exc.field))
            raise
        except CompilerBusy as exc:
            self._finish(key, None)
            raise Overloaded(str(exc), exc.retry_after_s) from None
        except BaseException:
            self._finish(key, None)
            raise
        result = (compiled.gbnf, compiled)
        self._finish(key, result)
        return result

    def _finish(self, key: Key, outcome: Compiled | GrammarError | None) -> None:
        """`key` compiled (or refused for its text); None: nothing to keep."""
        with self._lock:
            self._running.pop(key, None)
            if outcome is None:
                return
            size = len(key[1]) + (len(outcome[0]) if isinstance(outcome, tuple) else 0)
            if size > self.max_bytes:
                return
            self._kept[key] = outcome
            self._num_bytes += size
            while len(self._kept) > self.max_entries or self._num_bytes > self.max_bytes:
                old_key, old = self._kept.popitem(last=False)
                self._num_bytes -= len(old_key[1]) + (len(old[0]) if isinstance(old, tuple) else 0)

    def close(self) -> None:
        """Stop the grammar workers (a compile in progress ends Overloaded) and drop the queues."""
        for compiler in set(self._compilers):
            compiler.close()
        for pool in self._pools:
            pool.close()


def _resolved(outcome: Compiled | GrammarError) -> Future[Compiled]:
    future: Future[Compiled] = Future()
    if isinstance(outcome, GrammarError):  # a new one each time: a raised one grows its traceback
        future.set_exception(GrammarError(str(outcome), outcome.field))
    else:
        future.set_result(outcome)
    return future
