"""Compiled constraints (GBNF grammars, JSON schemas), kept by content.

Every tool-calling request repeats its tools' schemas, so `ConstraintCache` keeps the
compiled grammar of a (kind, text) in an LRU (by count and by bytes): a repeated
constraint compiles once. Identical texts that arrive while one compiles share that
compile. A refusal of the text itself (`GrammarError`: it does not parse, or it needs
more than the worker's CPU or memory budget) is kept too, so a pathological text costs
the grammar worker once; `Overloaded` (the machine was busy) is never kept.

Compiles run on an `OffloadPool` of one thread (the grammar worker answers one request
at a time): at most `max_waiting` distinct texts wait, more are `Overloaded` with a retry
hint, never INVALID_ARGUMENT. `llmserve_constraint_cache_total{result}` counts hit,
shared, miss and refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

from ..domain.errors import GrammarError
from ..metrics import Metrics
from ..model.grammar_compiler import CompilerBusy, GrammarCompiler
from .offload import OffloadPool, Overloaded

Key = tuple[str, str]
Compiled = tuple[str, object]  # (GBNF, the parsed grammar samplers clone)


class ConstraintCache:
    def __init__(
        self, compiler: GrammarCompiler, metrics: Metrics, max_entries: int = 256, max_bytes: int = 64 << 20,
        max_waiting: int = 64,
    ) -> None:
        self.compiler = compiler
        self.metrics = metrics
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._pool = OffloadPool("grammar compile", 1, max_waiting)
        self._lock = threading.Lock()
        self._kept: OrderedDict[Key, Compiled | GrammarError] = OrderedDict()
        self._num_bytes = 0
        self._running: dict[Key, Future[Compiled]] = {}
        for result in ("hit", "shared", "miss", "refused"):
            metrics.constraint_cache.labels(result)  # exported at 0 from the start

    def get(self, kind: str, text: str) -> Future[Compiled]:
        """The compiled constraint, when ready: at once if kept. Overloaded now if too many
        compiles wait (the future too, when the grammar worker found the machine too busy).
        The future is shared: do not cancel it (asyncio.shield)."""
        key = (kind, text)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self.metrics.constraint_cache.labels("hit").inc()
                return _resolved(kept)
            running = self._running.get(key)
            if running is not None and not running.cancelled():
                self.metrics.constraint_cache.labels("shared").inc()
                return running
            try:
                future = self._pool.submit(self._compile, key)
            except Overloaded:
                self.metrics.constraint_cache.labels("refused").inc()
                raise
            self._running[key] = future
            self.metrics.constraint_cache.labels("miss").inc()
        return future

    def _compile(self, key: Key) -> Compiled:
        try:
            compiled = self.compiler.compile(*key)
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
        """Stop the grammar worker (a compile in progress ends Overloaded) and drop the queue."""
        self.compiler.close()
        self._pool.close()


def _resolved(outcome: Compiled | GrammarError) -> Future[Compiled]:
    future: Future[Compiled] = Future()
    if isinstance(outcome, GrammarError):  # a new one each time: a raised one grows its traceback
        future.set_exception(GrammarError(str(outcome), outcome.field))
    else:
        future.set_result(outcome)
    return future
