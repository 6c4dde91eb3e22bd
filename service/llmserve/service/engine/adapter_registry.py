"""The LoRA adapters a request may name, as the event loop sees them.

A request names adapters (gRPC `SessionConfig.adapter`, OpenAI `model` or llama-server's
`lora`); `resolve` turns the names and scales into the engine's one spelling, an
`AdapterSet`, or refuses an unknown name. `adapter_path` is the one rule for run-time
loads: a file under `--adapter-dir`, no escape. The registry is written on the event loop
only (start-up, load, unload); the executor learns of loads and unloads by its commands.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..domain.errors import Field, InvalidRequest, PreconditionFailed
from ..domain.requests import AdapterSet, adapter_set


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter as listed (`/v1/models`, GetModelInfo, ListAdapters)."""

    name: str
    path: str
    scale: float  # what a request that names no scale gets
    id: int  # llama-server's `lora[].id`: the order adapters were loaded in, never reused
    rank: int
    size_bytes: int


class AdapterRegistry:
    def __init__(self, adapter_dir: Path | None = None, allow_updates: bool = False) -> None:
        self.adapter_dir = adapter_dir.resolve() if adapter_dir is not None else None
        self.allow_updates = allow_updates
        self._adapters: dict[str, AdapterInfo] = {}
        self._ids = itertools.count()

    def add(self, name: str, path: Path, scale: float, rank: int, size_bytes: int) -> AdapterInfo:
        info = AdapterInfo(name, str(path), scale, next(self._ids), rank, size_bytes)
        self._adapters[name] = info
        return info

    def remove(self, name: str) -> None:
        del self._adapters[name]

    def __contains__(self, name: str) -> bool:
        return name in self._adapters

    def listing(self) -> tuple[AdapterInfo, ...]:
        return tuple(sorted(self._adapters.values(), key=lambda info: info.id))

    def resolve(self, requested: Sequence[tuple[str, float | None]], field: object = Field.ADAPTER) -> AdapterSet:
        """(name, scale or None for the adapter's own) pairs as an AdapterSet; InvalidRequest
        naming `field` for an unknown name, a repeated one or a scale that is not finite."""
        pairs = []
        for name, scale in requested:
            info = self._adapters.get(name)
            if info is None:
                known = ", ".join(self._adapters) or "none"
                raise InvalidRequest(f"no LoRA adapter named {name!r} is loaded (loaded: {known})", field)  # type: ignore[arg-type]
            value = info.scale if scale is None else float(scale)
            if not -1e3 <= value <= 1e3:
                raise InvalidRequest(f"adapter {name!r}: scale {value} is outside [-1000, 1000]", field)  # type: ignore[arg-type]
            pairs.append((name, value))
        if len({name for name, _ in pairs}) != len(pairs):
            raise InvalidRequest("an adapter is named twice", field)  # type: ignore[arg-type]
        return adapter_set(pairs)

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
