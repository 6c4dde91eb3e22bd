"""Compiling a request's grammar or JSON schema safely: in the grammar worker.

`GrammarCompiler.compile` hands the text to a subprocess (grammar_worker.py) and
waits at most `timeout_s`. A worker that runs out of time, memory or stack is
killed (or has died) and is replaced; the request gets a `GrammarError` naming the
budget. A grammar that passes is then parsed in the server process, by the same
llama.cpp, on the caller's thread (it is known to parse within the worker's smaller
stack): the result is a `CompiledGrammar` that samplers clone, so the executor
never parses a grammar (a large one takes seconds). Thread-safe (one request at a
time per worker); blocks, so call it off the event loop and off the executor thread.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import llama_cpp
import structlog

from ..domain import GrammarError

log = structlog.get_logger("llmserve.grammar")


class CompiledGrammar:
    """A parsed grammar (a llama.cpp grammar sampler at its start state), freed when
    the last reference goes. Samplers use clones of it; it is never used itself."""

    def __init__(self, gbnf: str, vocab: llama_cpp.llama_vocab_p) -> None:
        self.gbnf = gbnf
        self.ptr = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not self.ptr:
            raise GrammarError("the grammar does not parse")
        weakref.finalize(self, llama_cpp.llama_sampler_free, self.ptr)

    def clone(self) -> llama_cpp.llama_sampler_p:
        return llama_cpp.llama_sampler_clone(self.ptr)


class GrammarCompiler:
    def __init__(
        self, model_path: Path, vocab: llama_cpp.llama_vocab_p, timeout_s: float = 5.0, max_memory_bytes: int = 1 << 30
    ) -> None:
        self.model_path = model_path
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.max_memory_bytes = max_memory_bytes
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False

    def _start(self) -> subprocess.Popen[bytes]:
        # The worker's data limit: what it needs to hold the vocabulary, plus the budget.
        limit = self.max_memory_bytes + (512 << 20)
        return subprocess.Popen(
            [sys.executable, "-m", "llmserve.service.model.grammar_worker", str(self.model_path), str(limit)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def compile(self, kind: str, text: str) -> CompiledGrammar:
        """The parsed grammar of a "grammar" or "json_schema" constraint, or GrammarError."""
        return CompiledGrammar(self.to_gbnf(kind, text), self.vocab)

    def to_gbnf(self, kind: str, text: str) -> str:
        """GBNF for a "grammar" or "json_schema" constraint, proven to parse in the worker."""
        with self._lock:
            if self._closed:
                raise GrammarError("the server is shutting down")
            if self._process is None or self._process.poll() is not None:
                self._process = self._start()
            process = self._process
            assert process.stdin is not None and process.stdout is not None
            started = time.monotonic()
            try:
                process.stdin.write((json.dumps({"kind": kind, "text": text}) + "\n").encode())
                process.stdin.flush()
                line = self._read_line(process, started + self.timeout_s)
            except OSError:
                line = None
            if line is None:
                self._kill(process)
                reason = self._why(process, time.monotonic() - started)
                log.warning("grammar_refused", kind=kind, reason=reason, num_bytes=len(text))
                raise GrammarError(reason)
        reply = json.loads(line)
        if not reply["ok"]:
            what = "JSON schema cannot be converted to a grammar" if kind == "json_schema" else "grammar does not parse"
            raise GrammarError(f"the {what}: {reply['error']}")
        return str(reply["gbnf"])

    def _read_line(self, process: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        stdout = process.stdout
        assert stdout is not None
        fd = stdout.fileno()
        buffer = b""
        while not buffer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None  # the worker died
            buffer += chunk
        return buffer

    def _why(self, process: subprocess.Popen[bytes], elapsed: float) -> str:
        code = process.returncode
        budget = f"{self.timeout_s:g} s, {self.max_memory_bytes >> 20} MiB"
        if code is not None and code < 0 and code not in (-9,):
            return f"compiling it crashed llama.cpp's grammar parser (signal {-code}): it is too deep or too large (budget {budget})"
        if elapsed >= self.timeout_s:
            return f"compiling it exceeded the time budget (budget {budget}): reduce its size or repetition counts"
        return f"compiling it exceeded the memory budget (budget {budget}): reduce its size or repetition counts"

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
