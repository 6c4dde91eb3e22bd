"""The LoRA adapters loaded into the runner, as the executor thread sees them.

Loads and unloads arrive as commands, in queue order with the sessions' `Open`s, so a
session opened after an unload was asked for is refused here even if the event loop
checked its adapter before. An adapter being unloaded refuses new sessions and is freed
by `free_unused` once no open session (running or waiting) decodes under it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from ...domain.errors import PreconditionFailed
from ...domain.requests import AdapterSet, SessionParams
from ..commands import LoadAdapter, UnloadAdapter
from ..runner_api import Runner

log = structlog.get_logger("llmserve.adapters")


class AdapterUnavailable(PreconditionFailed):
    """A session names an adapter that is not loaded, or is being unloaded."""


class AdapterResidency:
    def __init__(self, runner: Runner, loaded: Iterable[str] = ()) -> None:
        self.runner = runner
        self.loaded = set(loaded)
        self.unloading: dict[str, Callable[[str], None]] = {}  # name -> tell the loop when it is freed

    def check(self, adapters: AdapterSet) -> None:
        """AdapterUnavailable unless every adapter of the set can take a new session."""
        for name, _ in adapters:
            if name not in self.loaded:
                raise AdapterUnavailable(f"the LoRA adapter {name!r} is not loaded")
            if name in self.unloading:
                raise AdapterUnavailable(f"the LoRA adapter {name!r} is being unloaded")

    def load(self, command: LoadAdapter) -> None:
        try:
            info = self.runner.load_adapter(command.name, command.checked)
        except Exception as exc:  # noqa: BLE001 - a file llama.cpp refuses: the caller's error, the server goes on
            log.warning("adapter_load_failed", name=command.name, error=str(exc))
            command.done(exc)
            return
        self.loaded.add(command.name)
        log.info("adapter_loaded", name=command.name)
        command.done(info)

    def unload(self, command: UnloadAdapter, open_sessions: Iterable[SessionParams]) -> None:
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
        """(name, sessions running, sessions waiting for a slot) per loaded adapter."""
        if not self.loaded:  # no adapters (the usual case): nothing to count each step
            return ()
        waiting_keys = {s.key for s in waiting}
        running: Counter[str] = Counter()
        queued: Counter[str] = Counter()
        for s in sessions:
            for name, _ in s.params.adapters:
                (queued if s.key in waiting_keys else running)[name] += 1
        return tuple((name, running[name], queued[name]) for name in sorted(self.loaded))
