"""What a decode step costs on this machine (`step_costs.MeasuredCosts`), measured once per
model, CPU, threads and context layout, and cached as JSON under
`$LLMSERVE_CACHE_DIR/step-costs/` (default ~/.cache/llmserve; `default_model.cache_dir`).

The measurement is timed `llama_decode`s on the runner's own context at start-up, before
any session: DECODE_ROWS with logits on every row (as decode and draft rows have them),
PREFILL_ROWS with logits on the last (a prompt chunk), each the fastest of REPEATS runs
(interference only ever slows a step), on sequence 0 after a CONTEXT-token history, whose
cells are cleared afterwards.
It takes about four seconds on a 2-core machine, once: the key holds what changes the
table (the model file, the CPU's name and flags, llama.cpp's version and the CPU features
its build uses, threads, ubatch size, the KV layout and types), so another machine, build or `-t` measures its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import llama_cpp
import structlog

from .batch_arrays import BatchArrays
from .default_model import cache_dir
from .runner_config import RunnerConfig
from .step_costs import MeasuredCosts

log = structlog.get_logger("llmserve.step_costs")


class TimedContext(Protocol):
    """What the timing needs of the runner (LlamaRunner): its batch, decode and KV removal."""

    batch: BatchArrays

    def decode(self) -> int: ...

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool: ...

DECODE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 32)  # a lone stream's drafts take up to 17
PREFILL_ROWS = (1, 64, 128)
REPEATS = 3
CONTEXT = 256  # the history the timed steps follow
FIRST_TOKEN = 1000  # any ordinary token id: the cost does not depend on which


def cache_key(config: RunnerConfig) -> dict[str, object]:
    """What the table depends on (the file name is its hash)."""
    model = Path(config.model_path).resolve()
    kv = config.kv_cache
    return {
        "model": model.name, "model_bytes": model.stat().st_size, "llama_cpp": llama_cpp.__version__,
        "build": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),  # e.g. AVX512 = 1
        "machine": platform.machine(), "cpu": _cpu_facts(), "threads": config.n_threads,
        "n_ubatch": config.n_ubatch, "kv_unified": kv.kv_unified, "flash_attn": kv.flash_attn,
        "cache_types": [kv.cache_type_k, kv.cache_type_v],
    }


def _cpu_facts() -> str:
    """The CPU's model name and a hash of its feature flags (Linux; else the platform's word)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    facts = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines) if k.strip() in (
        "model name", "flags", "Features")}
    flags = facts.get("flags") or facts.get("Features", "")
    return f"{facts.get('model name', 'unknown')} flags:{hashlib.sha1(flags.encode()).hexdigest()[:12]}"


def cache_path(key: dict[str, object]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "step-costs" / f"{digest}.json"


def load_or_measure(runner: TimedContext, config: RunnerConfig) -> MeasuredCosts:
    """The cached table for this machine and configuration, else a new measurement (saved
    for the next start when the cache dir is writable)."""
    key = cache_key(config)
    path = cache_path(key)
    try:
        saved = json.loads(path.read_text())
        costs = MeasuredCosts(*(tuple((int(n), float(ms)) for n, ms in saved[k]) for k in ("decode_ms", "prefill_ms")))
        log.info("step_costs", source="cached", path=str(path), base_rows=round(costs.base_rows, 2))
        return costs
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not measured yet here (or a damaged file): measure
    started = time.perf_counter()
    costs = _on_own_thread(lambda: measure(runner, min(config.n_ubatch, config.n_batch),
                                           config.n_ctx // max(config.n_parallel, 1)))
    log.info("step_costs", source="measured", seconds=round(time.perf_counter() - started, 2), path=str(path),
             base_rows=round(costs.base_rows, 2), decode_ms=_rounded(costs.decode_ms),
             prefill_ms=_rounded(costs.prefill_ms))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "decode_ms": costs.decode_ms, "prefill_ms": costs.prefill_ms}))
        partial.replace(path)  # atomic: two servers starting at once each write a whole file
    except OSError as exc:
        log.warning("step_costs_not_cached", path=str(path), error=str(exc))
    return costs


def _on_own_thread(work: Callable[[], MeasuredCosts]) -> MeasuredCosts:
    """`work` on a thread that exits after it. llama.cpp's OpenMP build keeps a team of
    worker threads for each thread that has decoded, and a team left on the start-up thread
    slowed every later decode on the executor's by about 16% (a 5-row step 48 -> 56 ms,
    extractive c=1 -13%); a thread that exits takes its team with it."""
    with ThreadPoolExecutor(1, thread_name_prefix="llmserve-step-timing") as pool:  # joined on leaving
        return pool.submit(work).result()


def measure(runner: TimedContext, max_rows: int, max_cells: int) -> MeasuredCosts:
    """Time one-ubatch steps of each row count up to `max_rows` (1 at least) after a history
    of CONTEXT tokens (where drafts happen: a copied passage), at most half of `max_cells` (a
    slot's): REPEATS rounds over every size, the fastest of each (a burst of interference
    hits one round)."""
    context = min(CONTEXT, max_cells // 2)
    largest = max(min(max_rows, max_cells - context), 1)
    sizes = [(n, True) for n in DECODE_ROWS if n <= largest] + [(n, False) for n in PREFILL_ROWS if n <= largest]
    fastest = {size: float("inf") for size in sizes}
    try:
        for start in range(0, context, max(max_rows, 1)):  # the history, in batches the context takes
            _decode(runner, start, min(max(max_rows, 1), context - start), False, keep=True)
        for _ in range(REPEATS):
            for size in sizes:
                fastest[size] = min(fastest[size], _decode(runner, context, *size))
    finally:
        runner.seq_rm(0, 0, -1)
    return MeasuredCosts(*(tuple((n, ms) for (n, every_row), ms in fastest.items() if every_row == kind)
                           for kind in (True, False)))


def _rounded(points: tuple[tuple[int, float], ...]) -> list[list[float]]:
    return [[n, round(ms, 2)] for n, ms in points]


def _decode(runner: TimedContext, start: int, num_rows: int, every_row: bool, keep: bool = False) -> float:
    """Milliseconds of one step of `num_rows` rows at positions start..; its cells are
    removed again unless `keep` (the history)."""
    if num_rows < 1:
        return 0.0
    batch = runner.batch
    batch.clear()
    batch.add(list(range(FIRST_TOKEN, FIRST_TOKEN + num_rows)), start, 0, True)
    if every_row:
        batch.mark_all_outputs()
    started = time.perf_counter()
    status = runner.decode()
    elapsed_ms = 1000 * (time.perf_counter() - started)
    if not keep:
        runner.seq_rm(0, start, -1)
    batch.clear()
    if status != 0:
        raise RuntimeError(f"llama_decode failed with status {status} while timing a {num_rows}-row step")
    return elapsed_ms
