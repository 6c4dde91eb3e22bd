"""The LoRA adapters a request may name, as the event loop sees them (resident or not: the
executor keeps --max-loras of them in memory, executor/adapter_residency.py).

A request names adapters (gRPC `SessionConfig.adapter`, OpenAI `model` or llama-server's
`lora`); `resolve` turns the names and scales into the engine's one spelling, an
`AdapterSet`, or refuses an unknown name. `adapter_path` is the one rule for run-time
loads: a file under `--adapter-dir`, no escape. The registry is written on the event loop
only (start-up, `load`, `unload`); the executor learns of loads and unloads by commands
(executor/adapter_residency.py), in order with the sessions it opens.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..domain.errors import Field, InvalidRequest, PreconditionFailed
from ..domain.requests import AdapterSet, adapter_set
from ..model.adapters import AdapterFile, check_adapter_file
from .commands import LoadAdapter, UnloadAdapter


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter as listed (`/v1/models`, GetModelInfo, ListAdapters)."""

    name: str
    path: str
    scale: float  # what a request that names no scale gets
    id: int  # llama-server's `lora[].id`: the order adapters were loaded in, never reused
    rank: int
    size_bytes: int
    state: str = "loaded"  # resident; "available": loads when a session names it (beyond --max-loras);
    # "unloading": refuses new sessions, freed when its last one ends
    invocation_tokens: tuple[int, ...] = ()  # an aLoRA's (llama.cpp's adapter.alora.invocation_tokens); (): a LoRA


class AdapterRegistry:
    def __init__(self, architecture: str, max_loras: int, adapter_dir: Path | None = None,
                 allow_updates: bool = False, submit: Callable[[object], None] | None = None) -> None:
        """`submit`: puts a command on the executor's queue (None: no run-time loads)."""
        self.architecture = architecture
        self.max_loras = max_loras
        self.adapter_dir = adapter_dir.resolve() if adapter_dir is not None else None
        self.allow_updates = allow_updates and submit is not None
        self.submit = submit
        self._adapters: dict[str, AdapterInfo] = {}
        self._ids = itertools.count()
        self.resident: Callable[[], set[str]] = lambda: set(self._adapters)  # the Engine's: the executor's snapshot

    def add(self, name: str, path: Path, scale: float, checked: AdapterFile) -> AdapterInfo:
        info = AdapterInfo(name, str(path), scale, next(self._ids), checked.rank, checked.size_bytes,
                           invocation_tokens=checked.invocation_tokens)
        self._adapters[name] = info
        return info

    def remove(self, name: str) -> None:
        self._adapters.pop(name, None)

    async def load(self, name: str, path: str, scale: float | None,
                   check: Callable[..., object]) -> AdapterInfo:
        """Load an adapter file under `--adapter-dir` as `name`. `check(fn, *args)` runs the
        file check off the event loop (it may read for seconds); InvalidRequest or
        PreconditionFailed say why a load cannot be."""
        file = self.adapter_path(path)
        if not name or name in self._adapters:
            raise InvalidRequest(f"an adapter named {name!r} is loaded already" if name else "name the adapter",
                                 "lora_name")
        checked: AdapterFile = await check(check_adapter_file, file, self.architecture)  # type: ignore[misc]
        if name in self._adapters:  # loaded meanwhile by another call
            raise InvalidRequest(f"an adapter named {name!r} is loaded already", "lora_name")
        result = await self._ask(lambda done: LoadAdapter(name, checked, done))
        if isinstance(result, Exception):
            raise result
        return self.add(name, file, 1.0 if scale is None else float(scale), checked)

    async def unload(self, name: str) -> bool:
        """Refuse new sessions under `name` and free it once none runs; True: freed at once."""
        info = self._adapters.get(name)
        if info is None or info.state != "loaded":
            raise InvalidRequest(f"no LoRA adapter named {name!r} is loaded", "lora_name")
        if not self.allow_updates:
            raise PreconditionFailed("run-time adapter unloads are off: start the server with --allow-adapter-updates")
        self._adapters[name] = replace(info, state="unloading")
        loop = asyncio.get_running_loop()
        freed = await self._ask(lambda done: UnloadAdapter(name, done, lambda n: loop.call_soon_threadsafe(self.remove, n)))
        if isinstance(freed, Exception):
            raise freed
        return bool(freed)

    async def _ask(self, command: Callable[[Callable[[object], None]], object]) -> object:
        """Put `command(done)` on the executor's queue and wait for what it hands `done`."""
        assert self.submit is not None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()

        def done(result: object) -> None:  # on the executor thread
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

        self.submit(command(done))
        return await future

    def __contains__(self, name: str) -> bool:
        return name in self._adapters

    def listing(self) -> tuple[AdapterInfo, ...]:
        """Every adapter a request may name (or that is being unloaded), with its state."""
        resident = self.resident()
        return tuple(info if info.state != "loaded" or info.name in resident else replace(info, state="available")
                     for info in sorted(self._adapters.values(), key=lambda info: info.id))

    def resolve(self, requested: Sequence[tuple[str, float | None]], field: object = Field.ADAPTER) -> AdapterSet:
        """(name, scale or None for the adapter's own) pairs as an AdapterSet; InvalidRequest
        naming `field` for an unknown name, a repeated one or a scale that is not finite."""
        pairs = []
        for name, scale in requested:
            info = self._adapters.get(name)
            if info is None or info.state != "loaded":
                known = ", ".join(self._adapters) or "none"
                raise InvalidRequest(f"no LoRA adapter named {name!r} is loaded (loaded: {known})", field)  # type: ignore[arg-type]
            value = info.scale if scale is None else float(scale)
            if not -1e3 <= value <= 1e3:
                raise InvalidRequest(f"adapter {name!r}: scale {value} is outside [-1000, 1000]", field)  # type: ignore[arg-type]
            pairs.append((name, value))
        if len({name for name, _ in pairs}) != len(pairs):
            raise InvalidRequest("an adapter is named twice", field)  # type: ignore[arg-type]
        if len(pairs) > 1 and any(self._adapters[name].invocation_tokens for name, _ in pairs):
            raise InvalidRequest("an aLoRA adapter runs alone: name no other adapter beside it", field)  # type: ignore[arg-type]
        return adapter_set(pairs)

    def invocation(self, adapters: AdapterSet) -> tuple[int, ...]:
        """The invocation tokens of an aLoRA set (`resolve` lets an aLoRA only run alone); (): a LoRA set or the base."""
        info = self._adapters.get(adapters[0][0]) if len(adapters) == 1 else None
        return info.invocation_tokens if info is not None else ()

    def by_id(self, adapter_id: int) -> str | None:
        return next((info.name for info in self._adapters.values() if info.id == adapter_id), None)

    def adapter_path(self, path: str) -> Path:
        """A run-time load's file: relative to `--adapter-dir`, or absolute inside it."""
        if not self.allow_updates or self.adapter_dir is None:
            raise PreconditionFailed("run-time adapter loads are off: start the server with --allow-adapter-updates "
                                     "and --adapter-dir")
        resolved = (self.adapter_dir / path).resolve()
        if not resolved.is_relative_to(self.adapter_dir):
            raise InvalidRequest(f"{path!r} is outside --adapter-dir", "lora_path")
        if not resolved.is_file():
            raise InvalidRequest(f"no adapter file {path!r} under --adapter-dir", "lora_path")
        return resolved
