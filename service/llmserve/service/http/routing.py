"""Which model serves an HTTP request: the body's `model`, when it names a further model
(`--model NAME=PATH`, served_models.py); else the default model, which answers its own
names, its LoRA adapters' and 404 for the rest (fields.known_model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from aiohttp import web

from ..engine.engine import Engine
from ..served_models import ServedModels
from .body import parsed_body

T = TypeVar("T")


class _Named(Protocol):
    @property
    def model(self) -> str | None: ...


B = TypeVar("B", bound=_Named)


class ModelRouter:
    def __init__(self, default: Callable[[], Engine], models: ServedModels) -> None:
        """`default()`: the default model's engine, or a 503 while it loads or the server drains."""
        self.default = default
        self.models = models

    async def body(self, request: web.Request, parse: Callable[[Engine], Callable[[object], B]]) -> tuple[Engine, B]:
        """The engine of the model the body names, and the body as `parse(engine)` reads it:
        read with the default model's rules first, again with the named model's when its
        tool format differs (a body is parsed once otherwise)."""
        engine = self.default()
        body = await parsed_body(request, engine, parse(engine))
        other = self.models.engine_for(body.model)
        if other is None:
            return engine, body
        if other.tool_format != engine.tool_format:
            body = await parsed_body(request, other, parse(other))
        return other, body
