"""Compiling a request's grammar or JSON schema safely: in the grammar worker.

`GrammarCompiler.compile` hands the text to a subprocess (grammar_worker.py). The
worker's budget is its own CPU time for the request (`cpu_budget_s`: read from /proc
while waiting, with RLIMIT_CPU in the worker as the kernel's backstop) and memory
(RLIMIT_DATA): a text that needs more kills the worker (here, by SIGXCPU, or a crash)
and is a `GrammarError` naming the budget. Time spent waiting for a busy machine's CPU is
not the text's cost, so it never makes a valid text invalid: when the reply takes longer
than `wall_cap_s` of wall-clock time while the worker is still within its CPU budget,
the compile is `CompilerBusy` (retry later). A dead or killed worker is replaced.

A grammar that passes is then parsed in the server process, by the same llama.cpp, on
the caller's thread (it is known to parse within the worker's smaller stack): the result
is a `CompiledGrammar` that samplers clone, so the executor never parses a grammar (a
large one takes seconds). Thread-safe (one request at a time per worker); blocks, so
call it off the event loop and off the executor thread (`engine/constraints.py`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import llama_cpp
import structlog

from ..domain.errors import GrammarError

log = structlog.get_logger("llmserve.grammar")

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CompilerBusy(Exception):
    """The machine was too busy to compile in time (or is shutting down): not the text's fault."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CompiledGrammar:
    """A parsed grammar (a llama.cpp grammar sampler at its start state), freed when
    the last reference goes. Samplers use clones of it; it is never used itself.

    `trigger_token`: a lazy grammar, which constrains nothing until that token is sampled
    and from it on holds the output (llama.cpp's lazy grammar, triggered by a token: the
    grammar must begin with the token's text, which it is fed whole, so a text trigger
    split across tokens, whose pieces the grammar might refuse, is never used)."""

    def __init__(self, gbnf: str, vocab: llama_cpp.llama_vocab_p, trigger_token: int | None = None) -> None:
        self.gbnf = gbnf
        if trigger_token is None:
            self.ptr = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        else:
            triggers = (llama_cpp.llama_token * 1)(trigger_token)
            self.ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, gbnf.encode(), b"root", None, 0,
                                                                          triggers, 1)
        if not self.ptr:
            raise GrammarError("the grammar does not parse")
        weakref.finalize(self, llama_cpp.llama_sampler_free, self.ptr)

    def clone(self) -> llama_cpp.llama_sampler_p:
        return llama_cpp.llama_sampler_clone(self.ptr)


def _spent(pid: int, before: float | None) -> float:
    """CPU seconds `pid` has used since it had used `before` (0 when unknown)."""
    now = cpu_seconds(pid)
    return now - before if now is not None and before is not None else 0.0


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a live process has used, from /proc (None if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


class GrammarCompiler:
    def __init__(
        self, model_path: Path, vocab: llama_cpp.llama_vocab_p, cpu_budget_s: float = 5.0,
        max_memory_bytes: int = 1 << 30, wall_cap_s: float | None = None,
    ) -> None:
        """`wall_cap_s`: how long one compile may take by the clock before the server counts
        itself overloaded (default: 12x the CPU budget, at least 60 s: the worker runs at
        nice 10, so next to a busy executor it gets about a tenth of a core)."""
        self.model_path = model_path
        self.vocab = vocab
        self.cpu_budget_s = cpu_budget_s
        self.max_memory_bytes = max_memory_bytes
        self.wall_cap_s = wall_cap_s if wall_cap_s is not None else max(60.0, 12 * cpu_budget_s)
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False

    def _start(self) -> subprocess.Popen[bytes]:
        """A worker that has loaded the vocabulary (its own CPU time before that is not a text's)."""
        # The worker's data limit: what it needs to hold the vocabulary, plus the budget.
        limit = self.max_memory_bytes + (512 << 20)
        process = subprocess.Popen(
            [sys.executable, "-m", "llmserve.service.model.grammar_worker", str(self.model_path), str(limit),
             str(self.cpu_budget_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        if self._read_line(process, time.monotonic() + self.wall_cap_s, None)[0] is None:
            self._kill(process)
            log.warning("grammar_worker_not_started", returncode=process.returncode)
            raise CompilerBusy(f"the grammar worker did not start within {self.wall_cap_s:g} s; retry", retry_after_s=5.0)
        return process

    def compile(self, kind: str, text: str) -> CompiledGrammar:
        """The parsed grammar of a constraint (grammar_sources.KINDS); GrammarError
        (the text's fault) or CompilerBusy (the machine's)."""
        return CompiledGrammar(self.to_gbnf(kind, text), self.vocab, self._trigger_token(kind, text))

    def _trigger_token(self, kind: str, text: str) -> int | None:
        """A "tool_frames" document's `trigger` as one token (the engine offers a trigger only
        when its text is one token); GrammarError when it is not."""
        trigger = json.loads(text).get("trigger") if kind == "tool_frames" else None
        if not trigger:
            return None
        data = trigger.encode()
        tokens = (llama_cpp.llama_token * 8)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, 8, False, True)
        if n != 1:
            raise GrammarError(f"the trigger {trigger!r} is not one token of this model's vocabulary")
        return int(tokens[0])

    def to_gbnf(self, kind: str, text: str) -> str:
        """GBNF for a constraint (grammar_sources.KINDS), proven to parse in the worker."""
        with self._lock:
            if self._closed:
                raise CompilerBusy("the server is shutting down", retry_after_s=1.0)
            if self._process is None or self._process.poll() is not None:
                self._process = self._start()
            process = self._process
            assert process.stdin is not None and process.stdout is not None
            started, cpu_before = time.monotonic(), cpu_seconds(process.pid)
            try:
                process.stdin.write((json.dumps({"kind": kind, "text": text}) + "\n").encode())
                process.stdin.flush()
                line, why = self._read_line(process, started + self.wall_cap_s, cpu_before)
            except OSError:
                line, why = None, "died"
            if line is None:
                used = _spent(process.pid, cpu_before)
                timed_out = why == "wall" and used < self.cpu_budget_s  # else: the text's cost
                self._kill(process)
                if self._closed:
                    raise CompilerBusy("the server is shutting down", retry_after_s=1.0)
                if timed_out:  # the wall-clock cap, within the CPU budget: the machine is busy
                    log.warning("grammar_overloaded", kind=kind, wall_s=round(time.monotonic() - started, 2),
                                worker_cpu_s=used, num_bytes=len(text))
                    raise CompilerBusy(
                        f"the server is too busy to compile the constraint now (no answer within "
                        f"{self.wall_cap_s:g} s, its CPU budget not spent); retry", retry_after_s=5.0,
                    )
                reason = self._why(process, used)
                log.warning("grammar_refused", kind=kind, reason=reason, num_bytes=len(text))
                raise GrammarError(reason)
        reply = json.loads(line)
        if not reply["ok"]:
            what = "grammar does not parse" if kind == "grammar" else f"{kind.replace('_', ' ')} cannot be made a grammar"
            if kind == "json_schema":
                what = "JSON schema cannot be converted to a grammar"
            raise GrammarError(f"the {what}: {reply['error']}")
        return str(reply["gbnf"])

    def _read_line(
        self, process: subprocess.Popen[bytes], deadline: float, cpu_before: float | None
    ) -> tuple[bytes | None, str]:
        """The worker's next line, or None and why: "died", "wall" (`deadline` passed), or
        "cpu" (with `cpu_before`: it has used more than its CPU budget since)."""
        stdout = process.stdout
        assert stdout is not None
        fd = stdout.fileno()
        buffer = b""
        while not buffer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, "wall"
            if not select.select([fd], [], [], min(remaining, 0.05))[0]:
                if cpu_before is not None and _spent(process.pid, cpu_before) >= self.cpu_budget_s:
                    return None, "cpu"
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None, "died"
            buffer += chunk
        return buffer, ""

    def _why(self, process: subprocess.Popen[bytes], used_cpu_s: float) -> str:
        """Why the worker died or was stopped: the text's cost, named with the budget."""
        code = process.returncode
        budget = f"budget {self.cpu_budget_s:g} s of CPU time, {self.max_memory_bytes >> 20} MiB"
        if code == -signal.SIGXCPU or used_cpu_s >= self.cpu_budget_s:
            return (f"compiling it used more CPU time than its budget ({budget}; time spent waiting for the "
                    "CPU does not count): reduce its size or repetition counts")
        if code is not None and code < 0:
            return f"compiling it crashed llama.cpp's grammar parser (signal {-code}): it is too deep or too large ({budget})"
        return f"compiling it exceeded the memory budget ({budget}): reduce its size or repetition counts"

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.kill()
        process.wait()

    def close(self) -> None:
        self._closed = True
        process = self._process
        if process is not None:
            self._kill(process)  # unblocks a compile in progress
        with self._lock:
            self._process = None
