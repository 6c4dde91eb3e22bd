"""The LoRA adapters loaded into the runner, as the executor thread sees them.

Loads and unloads arrive as commands, in queue order with the sessions' `Open`s, so a
session opened after an unload was asked for is refused here even if the event loop
checked its adapter before. An adapter being unloaded refuses new sessions and is freed
by `free_unused` once no open session (running or waiting) decodes under it.

At most `max_loras` adapters are resident (in llama.cpp's memory); the others a request may
name are *available*: checked files that load when a session first names them. To make room
the least recently named resident adapter that no open session uses is evicted (vLLM's LRU
beyond `--max-loras`); when every resident one is in use, the new session is refused with a
retry hint. A load (`LoadAdapter`) with no room leaves the adapter available. An evicted
adapter's KV in the prefix cache stays valid: the same file loads again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from ...domain.errors import PreconditionFailed
from ...domain.requests import AdapterSet, SessionParams
from ..commands import LoadAdapter, UnloadAdapter
from ..runner_api import Runner

log = structlog.get_logger("llmserve.adapters")
RETRY_AFTER_S = 1.0  # a session refused for room: resident adapters free up as their sessions end


class AdapterUnavailable(PreconditionFailed):
    """A session names an adapter that is not loaded, is being unloaded, or has no room."""


class AdapterResidency:
    def __init__(self, runner: Runner, loaded: Sequence[str] = (), max_loras: int = 8) -> None:
        """`loaded`: the adapters the runner loaded at start (`--lora`), in order; the first
        `max_loras` stay resident, the rest are made available (vLLM's `--lora-modules`
        beyond `--max-loras`). Runs before the executor thread starts."""
        self.runner = runner
        self.max_loras = max_loras
        self.loaded = set(loaded[:max_loras])  # resident
        # name -> its checked file, loaded on first use
        self.available: dict[str, object] = {name: runner.unload_adapter(name) for name in loaded[max_loras:]}
        self.unloading: dict[str, Callable[[str], None]] = {}  # name -> tell the loop when it is freed
        self.last_named: dict[str, int] = {}  # name -> the open that last named it (the LRU order)
        self.num_opens = 0

    def check(self, adapters: AdapterSet, open_sessions: Iterable[SessionParams]) -> None:
        """Make every adapter of the set resident for a new session (evicting idle ones), or
        AdapterUnavailable: one is unknown, being unloaded, or there is no room."""
        for name, _ in adapters:
            if name in self.unloading:
                raise AdapterUnavailable(f"the LoRA adapter {name!r} is being unloaded")
            if name not in self.loaded and name not in self.available:
                raise AdapterUnavailable(f"the LoRA adapter {name!r} is not loaded")
        in_use = {n for params in open_sessions for n, _ in params.adapters} | {n for n, _ in adapters}
        for name, _ in adapters:
            if name not in self.loaded:
                self._make_room(in_use)
                try:
                    self._load(name, self.available[name])
                except Exception as exc:  # noqa: BLE001 - llama.cpp refused the file it loaded before
                    raise AdapterUnavailable(f"the LoRA adapter {name!r} failed to load: {exc}") from exc
                del self.available[name]
            self.last_named[name] = self.num_opens
        self.num_opens += 1

    def _make_room(self, in_use: set[str]) -> None:
        if len(self.loaded) < self.max_loras:
            return
        idle = [name for name in self.loaded if name not in in_use and name not in self.unloading]
        if not idle:
            raise AdapterUnavailable(f"all {self.max_loras} resident LoRA adapters (--max-loras) are in use",
                                     retry_after_s=RETRY_AFTER_S)
        victim = min(idle, key=lambda name: self.last_named.get(name, -1))
        self.available[victim] = self.runner.unload_adapter(victim)
        self.loaded.discard(victim)
        log.info("adapter_evicted", name=victim)

    def _load(self, name: str, checked: object) -> object:
        info = self.runner.load_adapter(name, checked)
        self.loaded.add(name)
        log.info("adapter_loaded", name=name)
        return info

    def load(self, command: LoadAdapter, open_sessions: Iterable[SessionParams]) -> None:
        """A run-time load: resident if there is room (or an idle adapter to evict), else available."""
        try:
            self._make_room({n for params in open_sessions for n, _ in params.adapters})
        except AdapterUnavailable:
            self.available[command.name] = command.checked
            command.done(command.checked)
            return
        try:
            info = self._load(command.name, command.checked)
        except Exception as exc:  # noqa: BLE001 - a file llama.cpp refuses: the caller's error, the server goes on
            log.warning("adapter_load_failed", name=command.name, error=str(exc))
            command.done(exc)
            return
        command.done(info)

    def unload(self, command: UnloadAdapter, open_sessions: Iterable[SessionParams]) -> None:
        if self.available.pop(command.name, None) is not None:
            command.freed(command.name)
            command.done(True)
            return
        if command.name not in self.loaded or command.name in self.unloading:
            command.done(AdapterUnavailable(f"the LoRA adapter {command.name!r} is not loaded"))
            return
        self.unloading[command.name] = command.freed
        freed = self.free_unused(open_sessions)
        command.done(command.name in freed)

    def free_unused(self, open_sessions: Iterable[SessionParams]) -> list[str]:
        """Free the adapters being unloaded that no open session decodes under."""
        if not self.unloading:
            return []
        in_use = {name for params in open_sessions for name, _ in params.adapters}
        freed = [name for name in self.unloading if name not in in_use]
        for name in freed:
            self.runner.unload_adapter(name)
            self.loaded.discard(name)
            self.unloading.pop(name)(name)
            log.info("adapter_unloaded", name=name)
        return freed

    def counts(self, sessions: Iterable[Any], waiting: Iterable[Any]) -> tuple[tuple[str, int, int], ...]:
        """(name, sessions running, sessions waiting for a slot) per resident adapter."""
        if not self.loaded:  # no adapters (the usual case): nothing to count each step
            return ()
        waiting_keys = {s.key for s in waiting}
        running: Counter[str] = Counter()
        queued: Counter[str] = Counter()
        for s in sessions:
            for name, _ in s.params.adapters:
                (queued if s.key in waiting_keys else running)[name] += 1
        return tuple((name, running[name], queued[name]) for name in sorted(self.loaded))
